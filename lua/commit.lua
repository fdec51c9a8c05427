-- commit.lua: IN_PROGRESS -> COMPLETED with the result, only for the owner holding the key.
-- If the key is gone (the lease ran out and nobody took it), the result is recorded anyway:
-- the body ran, and a duplicate must not run it again. Committing twice is 'ok' twice (a
-- completed record with this acquisition's fence is this commit's).
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- ARGV[2]  keep: how long the completed record lives, in milliseconds (0: delete it now)
-- ARGV[3]  '1' when the result is replayable, '0' when it is not (too large, or not encodable)
-- ARGV[4]  the result (ignored unless replayable)
-- ARGV[5]  fingerprint ('' for none)
-- ARGV[6]  fencing token of the acquisition
-- Returns {'ok'}, {'lost'} (another owner holds or completed the key), or {'corrupt', reason}
local key, owner, keep = KEYS[1], ARGV[1], tonumber(ARGV[2])
local rec, why = load(key)
if rec == false then
  return { 'corrupt', why }
end
if rec ~= nil then
  if rec.s == 'C' then
    if rec.n == ARGV[6] then
      return { 'ok' }
    end
    return { 'lost' }
  end
  if rec.s ~= 'P' or rec.o ~= owner then
    return { 'lost' }
  end
end

if keep > 0 then
  local result = ''
  if ARGV[3] == '1' then
    result = ARGV[4]
  end
  redis.call('SET', key, encode({ s = 'C', n = ARGV[6], f = ARGV[5], r = result }), 'PX', keep)
else
  redis.call('DEL', key)
end
notify(key, rec, 'C')
return { 'ok' }
