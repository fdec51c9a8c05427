-- commit.lua: IN_PROGRESS -> COMPLETED with the result, only for the owner holding the key.
-- If the key is gone (the lease ran out and nobody took it), the result is recorded anyway:
-- the body ran, and a duplicate must not run it again. Committing twice is 'ok' twice.
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
  if rec.o ~= owner or rec.s == 'I' then
    return { 'lost' }
  end
  if rec.s == 'C' then
    return { 'ok' }
  end
end

redis.call('DEL', key)
if keep > 0 then
  redis.call('HSET', key, 's', 'C', 'o', owner, 'n', ARGV[6])
  if ARGV[5] ~= '' then
    redis.call('HSET', key, 'f', ARGV[5])
  end
  if ARGV[3] == '1' then
    redis.call('HSET', key, 'r', ARGV[4])
  end
  redis.call('PEXPIRE', key, keep)
end
notify(key, rec, 'C')
return { 'ok' }
