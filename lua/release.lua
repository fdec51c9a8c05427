-- release.lua: give a key back after a failed, panicked or cancelled attempt, only for the owner
-- holding it. Parameter mode: delete the record. Token mode: back to ISSUED (the same token can
-- be retried) until the token's own expiry. Releasing twice is 'ok' twice.
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- Returns {'ok'}, {'lost'} (another owner holds or completed the key), or {'corrupt', reason}
local key, owner = KEYS[1], ARGV[1]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec == nil or rec.s == 'I' then
  return { 'ok' }
end
if rec.s ~= 'P' or rec.o ~= owner then
  return { 'lost' }
end
local now_ms = math.floor(now_us() / 1000)
if rec.te ~= '' and tonumber(rec.te) > now_ms then
  redis.call('SET', key, encode({ s = 'I', n = rec.n, te = rec.te }), 'PXAT', tonumber(rec.te))
else
  redis.call('DEL', key)
end
notify(key, rec, 'R')
return { 'ok' }
