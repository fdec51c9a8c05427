-- resolve.lua: resolve an unknown outcome: a record in progress, held (on_crash = hold), whose
-- lease's end has passed by the server's clock, and, when a holder is named, held by it. It
-- becomes C with the given result (no owner: the holder's late commit finds it not its own) or
-- R with the attempt counted, kept for the `keep` its acquire gave; anything else is reported.
-- KEYS[1]  the record
-- ARGV[1]  the holder the resolution is about ('' for whichever)
-- ARGV[2]  'completed' or 'release'
-- ARGV[3]  '1' when ARGV[4] is a result to replay, '0' for completed without one
-- ARGV[4]  the result
-- ARGV[5]  the error text a released record keeps
-- Returns {'ok'}, {'absent'}, {'running'} (its lease has not ended), {'state', s} (not unknown:
-- 'P' in progress, 'C', 'R', 'F', 'U' unknown under another holder), or {'corrupt', reason}
local key, holder = KEYS[1], ARGV[1]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec == nil then
  return { 'absent' }
end
if rec.s ~= 'P' then
  return { 'state', rec.s }
end
local theirs = holder ~= '' and rec.o ~= holder
local now = now_ms()
if not lapsed(rec, now) then
  if rec.h and not theirs then
    return { 'running' }
  end
  return { 'state', 'P' }
end
if not rec.h then
  -- Past its lease and not held: a counted attempt, free for the next.
  return { 'state', 'R' }
end
if theirs then
  return { 'state', 'U' }
end
if ARGV[2] == 'completed' then
  local result = ''
  if ARGV[3] == '1' then
    result = ARGV[4]
  end
  put(key, encode({ s = 'C', n = '0', o = '', f = rec.f, t = int(now), r = result }), rec.k)
  notify(key, rec, 'C')
else
  put(key, failure('R', rec.o, '', rec.a, ARGV[5], now), rec.k)
  notify(key, rec, 'R')
end
return { 'ok' }
