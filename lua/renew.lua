-- renew.lua: extend leases, each only if its owner still holds it. One call renews many keys
-- (all in one hash slot on Redis Cluster). A record that keeps its lease's end gets a new end
-- (the server's clock now plus the lease) and lives `keep` past it; one whose end has passed is
-- not renewed (its holder stopped: the next acquire decides what that means).
-- KEYS[i]      a record
-- ARGV[2i-1]   owner id expected at KEYS[i]
-- ARGV[2i]     new lease in milliseconds for KEYS[i]
-- Returns an array with, per key, 1 (renewed) or 0 (lost: expired, taken by another owner, past
-- the lease's end it keeps, or not an idempotency record).
local out, now = {}, nil
for i, key in ipairs(KEYS) do
  local rec = load(key)
  local ok = 0
  if rec and rec.s == 'P' and rec.o == ARGV[2 * i - 1] then
    local lease = tonumber(ARGV[2 * i])
    if rec.t == '' then
      redis.call('PEXPIRE', key, lease)
      ok = 1
    else
      now = now or now_ms()
      if not lapsed(rec, now) then
        rec.t = int(now + lease)
        redis.call('SET', key, encode(rec), 'PX', lease + rec.k)
        ok = 1
      end
    end
  end
  out[i] = ok
end
return out
