-- acquire.lua: take a key for one attempt (the path of a caller that will wait, and of servers
-- without `SET ... NX GET`).
--   absent           -> IN_PROGRESS
--   IN_PROGRESS, own -> acquired again (a re-sent command must not turn into a conflict)
--   otherwise        -> report what is there (marking it watched when the caller will wait)
-- KEYS[1]  the record
-- ARGV[1]  owner id of this attempt
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fingerprint of the payload ('' for none)
-- ARGV[4]  '1' when the caller will wait for the key to change (sets w)
-- ARGV[5]  '1' to report lease_left and kept_for (one PTTL more); '0' reports them as 0
-- Returns
--   {'acquired', fence}
--   {'progress', fingerprint, lease_left_ms}
--   {'completed', fingerprint, replayable (1 or 0), result, kept_for_ms}
--   {'corrupt', reason}
local key, owner, lease, fp = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec == nil then
  -- The same record a plain `SET NX GET` acquire writes (fence '0', see lib.lua), so that a
  -- commit compares it whole (`SET ... IFEQ`, or commit.lua's fast path) whichever way the key
  -- was taken. The fence is the server's time now, after any earlier holder's record was gone.
  redis.call('SET', key, encode({ s = 'P', n = '0', o = owner, f = fp }), 'PX', lease)
  return { 'acquired', now_us() }
end
if rec.s == 'P' and rec.o == owner then
  -- A re-sent acquire: the server's time now is a fence too, taken while this owner holds the
  -- key. (Records written by earlier versions carry their fence.)
  if rec.n == '0' then
    return { 'acquired', now_us() }
  end
  return { 'acquired', tonumber(rec.n) }
end
local left = 0
if ARGV[5] == '1' then
  left = redis.call('PTTL', key)
end
if rec.s == 'C' then
  if rec.r ~= '' then
    return { 'completed', rec.f, 1, rec.r, left }
  end
  return { 'completed', rec.f, 0, '', left }
end
if ARGV[4] == '1' and rec.w ~= '1' then
  rec.w = '1'
  redis.call('SET', key, encode(rec), 'KEEPTTL')
end
return { 'progress', rec.f, math.max(left, 0) }
