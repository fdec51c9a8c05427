-- forget.lua: delete a record for an operator: a COMPLETED, RELEASED or FAILED one, an unknown
-- one (in progress past the lease's end it keeps), or an IN_PROGRESS one when forced. Wakes the key's waiters, and tells every process whose replay cache follows purges.
-- KEYS[1]  the record
-- ARGV[1]  '1' to delete a record in progress too
-- ARGV[2]  the purge channel (PUBLISH: every process following purges drops its cached copy)
-- ARGV[3]  the full key, as the message
-- Returns {'deleted', state} (state 'P', 'C', 'R', 'F', or 'U' for unknown), {'absent'},
-- {'in_progress'} (not forced: nothing deleted), or {'corrupt', reason} (not a record: nothing
-- deleted)
local rec, why = load(KEYS[1])
if rec == false then
  return { 'corrupt', why }
end
if rec == nil then
  return { 'absent' }
end
local state = rec.s
if rec.s == 'P' and lapsed(rec, now_ms()) then
  state = rec.h and 'U' or 'R'
end
if state == 'P' and ARGV[1] ~= '1' then
  return { 'in_progress' }
end
redis.call('DEL', KEYS[1])
notify(KEYS[1], rec, 'F')
redis.call('PUBLISH', ARGV[2], ARGV[3])
return { 'deleted', state }
