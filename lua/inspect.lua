-- inspect.lua: read a record whole for an operator, with its lifetime and the server's clock,
-- in one step: a GET and a PTTL sent apart could read two records (the one that ended between
-- them, and the next one's lifetime), and whether a record's lease's end has passed is the
-- server's to say.
-- KEYS[1]  the record
-- Returns {value (nil when absent), pttl, now_ms}, or {nil, pttl, now_ms, type} when the key is
-- not a string.
local v = redis.pcall('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
local now = now_ms()
if type(v) == 'table' and v.err then
  return { false, ttl, now, redis.call('TYPE', KEYS[1])['ok'] }
end
return { v, ttl, now }
