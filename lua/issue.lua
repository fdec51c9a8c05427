-- issue.lua: create an ISSUED token record (token mode), unless the key exists.
-- KEYS[1]  the record of the new token
-- ARGV[1]  how long the token stays valid, in milliseconds
-- Returns 1 when issued, 0 when the key already exists (the caller draws another token).
local te = math.floor(now_us() / 1000) + tonumber(ARGV[1])
if redis.call('SET', KEYS[1], encode({ s = 'I', n = '0', te = int(te) }), 'NX', 'PXAT', te) then
  return 1
end
return 0
