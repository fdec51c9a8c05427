-- commit.lua: IN_PROGRESS -> COMPLETED with the result, only for the owner holding the key (its
-- lease's end passed or not: nobody took it). If the key is gone (the lease ran out and nobody
-- took it), or released by a later attempt that failed, the result is recorded anyway: the body
-- ran, and a duplicate must not run it again. A key given up (F) stays so. Committing twice is 'ok' twice (a
-- completed record with this owner in it is this commit's; records of earlier versions name no
-- owner, only the acquisition's fence).
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- ARGV[2]  keep: how long the completed record lives, in milliseconds (0: delete it now)
-- ARGV[3]  fencing token of the acquisition ('0' when the body never read it)
-- ARGV[4]  the record an acquisition by this owner writes (see record.rs)
-- ARGV[5]  the completed record to write (built by the caller: see lib.lua)
-- Returns {'ok'}, {'lost'} (another owner holds or completed the key), or {'corrupt', reason}

-- Fast path, before the helpers are even defined: the key still holds exactly what this
-- owner's acquisition wrote (so it is held by this owner and nobody waits on it). Otherwise
-- (a waiter marked the record, the lease was lost, committed already) the full path below
-- decodes what was read here. On a server with `SET ... IFEQ` the store tries that first, and
-- runs this script only when it did not match.
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[4] then
  if tonumber(ARGV[2]) > 0 then
    redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[2])
  else
    redis.call('DEL', KEYS[1])
  end
  return { 'ok' }
end
-- @lib
local key, owner, keep = KEYS[1], ARGV[1], tonumber(ARGV[2])
local rec, why = load(key, current)
if rec == false then
  return { 'corrupt', why }
end
if rec ~= nil then
  if rec.s == 'C' then
    if rec.o == owner or (rec.o == '' and rec.n ~= '0' and rec.n == ARGV[3]) then
      return { 'ok' }
    end
    return { 'lost' }
  end
  if rec.s == 'F' or (rec.s == 'P' and rec.o ~= owner) then
    return { 'lost' }
  end
end

if keep > 0 then
  redis.call('SET', key, ARGV[5], 'PX', keep)
else
  redis.call('DEL', key)
end
notify(key, rec, 'C')
return { 'ok' }
