-- fail.lua: record a failed attempt, only for the owner holding the key (its lease's end passed
-- or not), or on an absent key (the lease ran out and nobody took it: the attempt still counts):
-- R, the count of failed attempts and the last error (the next acquire takes it as the next
-- attempt), or F, the key given up (every acquire reports it). Kept for `keep`; a `keep` of 0
-- deletes the record. Failing twice is 'ok' twice. A give-up by the owner whose attempt an
-- operator resolved as not done (R under its owner) turns that record into F.
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
local given_up = ARGV[4] == '1'
if rec ~= nil then
  local own = rec.o == owner
  -- This owner's failure recorded already: a repeated command.
  if own and (rec.s == 'F' or (rec.s == 'R' and not given_up)) then
    return { 'ok' }
  end
  -- Held by this owner, or its attempt released by an operator who resolved it as not done (R
  -- under its owner): its own give-up still gives up on the key. Anything else is not its own.
  if not own or (rec.s ~= 'P' and rec.s ~= 'R') then
    return { 'lost' }
  end
end
local state, fp = 'R', ''
if given_up then
  state, fp = 'F', ARGV[5]
end
put(key, failure(state, owner, fp, tonumber(ARGV[2]), ARGV[6], tonumber(ARGV[7])), tonumber(ARGV[3]))
notify(key, rec, 'R')
return { 'ok' }
