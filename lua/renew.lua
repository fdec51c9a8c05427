-- renew.lua: extend leases, each only if its owner still holds it. One call renews many keys
-- (all in one hash slot on Redis Cluster).
-- KEYS[i]      a record
-- ARGV[2i-1]   owner id expected at KEYS[i]
-- ARGV[2i]     new lease in milliseconds for KEYS[i]
-- Returns an array with, per key, 1 (renewed) or 0 (lost: expired, taken by another owner, or
-- not an idempotency record).
local out = {}
for i, key in ipairs(KEYS) do
  local rec = load(key)
  local ok = 0
  if rec and rec.s == 'P' and rec.o == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    ok = 1
  end
  out[i] = ok
end
return out
