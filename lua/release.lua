-- release.lua: give a key back after a failed, panicked or cancelled attempt, only for the owner
-- holding it: the record is deleted. Releasing twice is 'ok' twice.
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- Returns {'ok'}, {'lost'} (another owner holds or completed the key), or {'corrupt', reason}
local key, owner = KEYS[1], ARGV[1]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec == nil then
  return { 'ok' }
end
if rec.s ~= 'P' or rec.o ~= owner then
  return { 'lost' }
end
redis.call('DEL', key)
notify(key, rec, 'R')
return { 'ok' }
