-- acquire.lua: take a key for one attempt.
--   absent           -> IN_PROGRESS (parameter mode); token mode: the token is unknown
--   ISSUED           -> IN_PROGRESS (token mode)
--   IN_PROGRESS, own -> acquired again (a re-sent command must not turn into a conflict)
--   otherwise        -> report what is there
-- KEYS[1]  the record
-- ARGV[1]  owner id of this attempt
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  fingerprint of the payload ('' for none)
-- ARGV[4]  'p' parameter mode, 't' token mode
-- ARGV[5]  '1' when the caller will wait for the key to change (sets w)
-- ARGV[6]  '1' to report lease_left and kept_for (one PTTL more); '0' reports them as 0
-- Returns
--   {'acquired', fence}
--   {'progress', fingerprint, lease_left_ms}
--   {'completed', fingerprint, replayable (1 or 0), result, kept_for_ms}
--   {'invalid'}                 token mode: never issued, expired, or used and forgotten
--   {'corrupt', reason}
local key, owner, lease, fp, mode = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec and rec.s == 'P' and rec.o == owner then
  -- A plain acquire's record carries no fence ('0'): the server's time now is one, taken while
  -- this owner holds the key.
  if rec.n == '0' then
    return { 'acquired', now_us() }
  end
  return { 'acquired', tonumber(rec.n) }
end
local report = ARGV[6] == '1'
if rec and rec.s == 'C' then
  local kept_for = 0
  if report then
    kept_for = redis.call('PTTL', key)
  end
  if rec.r ~= '' then
    return { 'completed', rec.f, 1, rec.r, kept_for }
  end
  return { 'completed', rec.f, 0, '', kept_for }
end

local now = now_us()
local now_ms = math.floor(now / 1000)
if rec == nil then
  if mode == 't' then
    return { 'invalid' }
  end
  redis.call('SET', key, encode({ s = 'P', n = int(now), o = owner, f = fp }), 'PX', lease)
  return { 'acquired', now }
end

if rec.s == 'P' then
  local left
  if rec.l ~= '' then
    left = tonumber(rec.l) - now_ms
  elseif report then
    left = redis.call('PTTL', key)
  else
    left = 0
  end
  -- A token whose holder's lease ran out is ISSUED again; anything else is held.
  if not (rec.te ~= '' and left <= 0) then
    if ARGV[5] == '1' and rec.w ~= '1' then
      rec.w = '1'
      redis.call('SET', key, encode(rec), 'KEEPTTL')
    end
    return { 'progress', rec.f, math.max(left, 0) }
  end
end

-- ISSUED (or a token whose holder's lease ran out): flip to IN_PROGRESS.
if rec.te == '' then
  return { 'corrupt', 'holds an issued token with no expiry' }
end
if mode ~= 't' then
  return { 'corrupt', 'holds an issued token, but the call is in parameter mode' }
end
local te = tonumber(rec.te)
if te <= now_ms then
  redis.call('DEL', key)
  return { 'invalid' }
end
local fence = math.max((tonumber(rec.n) or 0) + 1, now)
rec.s, rec.n, rec.o, rec.f, rec.l = 'P', int(fence), owner, fp, int(now_ms + lease)
redis.call('SET', key, encode(rec), 'PXAT', math.max(te, now_ms + lease))
return { 'acquired', fence }
