-- commit.lua: IN_PROGRESS -> COMPLETED with the result, only for the owner holding the key (its
-- lease's end passed or not: nobody took it). If the key is gone (the lease ran out and nobody
-- took it), or released by a later attempt that failed, the result is recorded anyway: the body
-- ran, and a duplicate must not run it again. A key given up (F) stays so. Committing twice is 'ok' twice (a
-- completed record with this owner in it is this commit's; records of earlier versions name no
-- owner, only the acquisition's fence).
-- KEYS[1]  the record
-- ARGV[1]  keep: how long the completed record lives, in milliseconds (0: delete it now)
-- ARGV[2]  the completed record to write (built by the caller: see lib.lua). Its fence, owner
--          and fingerprint are this acquisition's: the script reads them there rather than
--          taking them as arguments of their own (each one another frame for the client to
--          encode and send), and the record this owner's acquisition wrote is
--          'P|0|<owner>|<fingerprint>|||' (record.rs, `pending`).
-- Returns {'ok'}, {'lost'} (another owner holds or completed the key), or {'corrupt', reason}

-- Fast path, before the helpers are even defined: the key still holds exactly what this
-- owner's acquisition wrote (so it is held by this owner and nobody waits on it). Otherwise
-- (a waiter marked the record, the lease was lost, committed already) the full path below
-- decodes what was read here. On a server with `SET ... IFEQ` the store tries that first, and
-- runs this script only when it did not match.
local fence, owner, fp = string.match(ARGV[2], '^C|([^|]*)|([^|]*)|([^|]*)|')
if not owner then
  return { 'corrupt', 'the record to commit is not a completed record' }
end
local current = redis.pcall('GET', KEYS[1])
if current == 'P|0|' .. owner .. '|' .. fp .. '|||' then
  if tonumber(ARGV[1]) > 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
  else
    redis.call('DEL', KEYS[1])
  end
  return { 'ok' }
end
-- @lib
local key, keep = KEYS[1], tonumber(ARGV[1])
local rec, why = load(key, current)
if rec == false then
  return { 'corrupt', why }
end
if rec ~= nil then
  if rec.s == 'C' then
    if rec.o == owner or (rec.o == '' and rec.n ~= '0' and rec.n == fence) then
      return { 'ok' }
    end
    return { 'lost' }
  end
  if rec.s == 'F' or (rec.s == 'P' and rec.o ~= owner) then
    return { 'lost' }
  end
end

if keep > 0 then
  redis.call('SET', key, ARGV[2], 'PX', keep)
else
  redis.call('DEL', key)
end
notify(key, rec, 'C')
return { 'ok' }
