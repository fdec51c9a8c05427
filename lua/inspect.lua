-- inspect.lua: read a record whole for an operator, with its lifetime, in one step: a GET and a
-- PTTL sent apart could read two records (the one that ended between them, and the next one's
-- lifetime).
-- KEYS[1]  the record
-- Returns {value (nil when absent), pttl}, or {nil, pttl, type} when the key is not a string.
local v = redis.pcall('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if type(v) == 'table' and v.err then
  return { false, ttl, redis.call('TYPE', KEYS[1])['ok'] }
end
return { v, ttl }
