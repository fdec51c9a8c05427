-- fail.lua: record a failed attempt, only for the owner holding the key (its lease's end passed
-- or not), or on an absent key (the lease ran out and nobody took it: the attempt still counts):
-- R, the count of failed attempts and the last error (the next acquire takes it as the next
-- attempt), or F, the key given up (every acquire reports it). Kept for `keep`; a `keep` of 0
-- deletes the record. Failing twice is 'ok' twice.
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- ARGV[2]  the attempt that failed (the count the record keeps)
-- ARGV[3]  keep, in milliseconds
-- ARGV[4]  '1' to give up on the key (F), '0' to free it (R)
-- ARGV[5]  fingerprint of the payload (kept with F)
-- ARGV[6]  the error's text
-- ARGV[7]  now, unix ms by the client's clock (the record's `t`, for operators only)
-- Returns {'ok'}, {'lost'} (another owner holds, completed or failed the key), or
-- {'corrupt', reason}
local key, owner = KEYS[1], ARGV[1]
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec ~= nil then
  if (rec.s == 'R' or rec.s == 'F') and rec.o == owner then
    return { 'ok' }
  end
  if rec.s ~= 'P' or rec.o ~= owner then
    return { 'lost' }
  end
end
local given_up = ARGV[4] == '1'
local state, fp = 'R', ''
if given_up then
  state, fp = 'F', ARGV[5]
end
put(key, failure(state, owner, fp, tonumber(ARGV[2]), ARGV[6], tonumber(ARGV[7])), tonumber(ARGV[3]))
notify(key, rec, 'R')
return { 'ok' }
