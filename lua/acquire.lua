-- acquire.lua: take a key for one attempt (the path of a caller that will wait, of a call whose
-- record keeps its lease's end, of a record a plain `SET NX GET` found and cannot decide on, and
-- of servers without `SET NX GET`).
--   absent                                   -> IN_PROGRESS, attempt 1
--   RELEASED after n failed attempts         -> IN_PROGRESS, attempt n + 1
--   IN_PROGRESS past the lease's end it keeps, not held
--                                            -> IN_PROGRESS, the attempt after it (that one counted)
--   IN_PROGRESS past its lease's end, held   -> reported unknown
--   IN_PROGRESS, own                         -> acquired again (a re-sent command must not turn
--                                               into a conflict)
--   otherwise                                -> report what is there (marking it watched when
--                                               the caller will wait)
-- KEYS[1]  the record
-- ARGV[1]  owner id of this attempt
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fingerprint of the payload ('' for none)
-- ARGV[4]  '1' when the caller will wait for the key to change (sets w)
-- ARGV[5]  '1' to report lease_left and kept_for (one PTTL more); '0' reports them as 0
-- ARGV[6]  what the key becomes if this attempt's lease ends without a commit or a release:
--          '0' free, '1' free with the attempt counted, '2' held (unknown)
-- ARGV[7]  how long a record that keeps its lease's end outlives it, in milliseconds (keep)
-- Returns
--   {'acquired', fence, attempt}
--   {'progress', fingerprint, lease_left_ms}
--   {'completed', fingerprint, replayable (1 or 0), result, kept_for_ms}
--   {'gave_up', fingerprint, attempts, last_error}
--   {'unknown', fingerprint, owner, lease_end_ms, attempt}
--   {'corrupt', reason}
local key, owner, lease, fp = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local lapse, keep = ARGV[6] or '0', tonumber(ARGV[7] or '0')
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
-- How many attempts came before this one, when the key can be taken.
local before = nil
-- The server's time, in microseconds, once read (one `TIME` per call at most).
local clock = nil
if rec == nil then
  before = 0
elseif rec.s == 'P' and rec.o == owner then
  -- A re-sent acquire: the server's time now is a fence too, taken while this owner holds the
  -- key. (Records written by earlier versions carry their fence.)
  if rec.n == '0' then
    return { 'acquired', now_us(), rec.a }
  end
  return { 'acquired', tonumber(rec.n), rec.a }
elseif rec.s == 'R' then
  before = rec.a
elseif rec.s == 'P' and rec.t ~= '' then
  clock = now_us()
  if lapsed(rec, math.floor(clock / 1000)) then
    if rec.h then
      return { 'unknown', rec.f, rec.o, tonumber(rec.t), rec.a }
    end
    before = rec.a
  end
end
if before ~= nil then
  local attempt = before + 1
  -- The server's time now, after any earlier holder's record was gone: the fence, and where the
  -- lease's end is counted from in a record that keeps it.
  local now = clock or now_us()
  if lapse == '0' and attempt == 1 then
    -- The same record a plain `SET NX GET` acquire writes (fence '0', see lib.lua), so that a
    -- commit compares it whole (`SET ... IFEQ`, or commit.lua's fast path) whichever way the key
    -- was taken.
    redis.call('SET', key, encode({ s = 'P', n = '0', o = owner, f = fp }), 'PX', lease)
  else
    -- The lease's end in the record, by the server's clock; the record outlives it by `keep`.
    -- Callers waiting on a lapsed holder go on waiting on this one.
    local watched = (rec and rec.s == 'P' and rec.w == '1') and '1' or ''
    local tail = int(attempt) .. ':' .. int(keep) .. ':' .. (lapse == '2' and '1' or '0')
    local lease_end = int(math.floor(now / 1000) + lease)
    local pending = { s = 'P', n = '0', o = owner, f = fp, t = lease_end, w = watched, r = tail }
    redis.call('SET', key, encode(pending), 'PX', lease + keep)
  end
  return { 'acquired', now, attempt }
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
if rec.s == 'F' then
  return { 'gave_up', rec.f, rec.a, rec.e }
end
if ARGV[4] == '1' and rec.w ~= '1' then
  rec.w = '1'
  redis.call('SET', key, encode(rec), 'KEEPTTL')
end
if rec.t ~= '' and ARGV[5] == '1' then
  -- The lease left, not the record's lifetime past it.
  left = tonumber(rec.t) - (clock and math.floor(clock / 1000) or now_ms())
end
return { 'progress', rec.f, math.max(left, 0) }
