-- issue.lua: create an ISSUED token record (token mode), unless the key exists.
-- KEYS[1]  the record of the new token
-- ARGV[1]  how long the token stays valid, in milliseconds
-- Returns 1 when issued, 0 when the key already exists (the caller draws another token).
local key, ttl = KEYS[1], tonumber(ARGV[1])
if redis.call('EXISTS', key) == 1 then
  return 0
end
local te = math.floor(now_us() / 1000) + ttl
redis.call('HSET', key, 's', 'I', 'te', int(te))
redis.call('PEXPIREAT', key, te)
return 1
