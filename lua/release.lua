-- release.lua: give a key back after a cancelled attempt (or one whose lease was lost), only for
-- the owner holding it: the record is deleted, or, where it counts the attempts before this one,
-- replaced by the record of those (R; this attempt is not counted). Releasing twice is 'ok'
-- twice.
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- Returns {'ok'}, {'lost'} (another owner holds or completed the key), or {'corrupt', reason}
local key, owner = KEYS[1], ARGV[1]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec == nil or (rec.s == 'R' and rec.o == owner) then
  return { 'ok' }
end
if rec.s ~= 'P' or rec.o ~= owner then
  return { 'lost' }
end
if rec.t ~= '' and rec.a > 1 then
  put(key, failure('R', owner, '', rec.a - 1, '', now_ms()), rec.k)
else
  redis.call('DEL', key)
end
notify(key, rec, 'R')
return { 'ok' }
