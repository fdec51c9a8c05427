-- renew.lua: extend leases, each only if its owner still holds it. One call renews many keys
-- (all in one hash slot on Redis Cluster).
-- KEYS[i]      a record
-- ARGV[2i-1]   owner id expected at KEYS[i]
-- ARGV[2i]     new lease in milliseconds for KEYS[i]
-- Returns an array with, per key, 1 (renewed) or 0 (lost: expired, taken by another owner, or
-- not an idempotency record).
local now_ms = math.floor(now_us() / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local owner, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local rec = load(key)
  local ok = 0
  if rec and rec.s == 'P' and rec.o == owner then
    if rec.te ~= '' then
      -- Token record: the lease lives in `l`; the key lives until the later of lease and token.
      if tonumber(rec.l) > now_ms then
        rec.l = int(now_ms + lease)
        redis.call('SET', key, encode(rec), 'PXAT', math.max(tonumber(rec.te), now_ms + lease))
        ok = 1
      end
    else
      redis.call('PEXPIRE', key, lease)
      ok = 1
    end
  end
  out[i] = ok
end
return out
