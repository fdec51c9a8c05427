-- claim.lua: a batch's acquire of one key (`many.lua` runs it per key), the same transition as
-- a single call's plain acquire: `SET key <pending> NX PX lease GET` takes an absent key and
-- otherwise changes nothing and returns what the key holds, which the store reads as it reads
-- the plain acquire's reply (record.rs `found`). One command per key, where acquire.lua reads,
-- decodes, writes and stamps. The store runs it for batches nobody waits on and whose callers
-- need no record's lifetime (no replay cache), on servers with `SET ... NX GET` (Redis 7.0+).
-- KEYS[1]  the record
-- ARGV[1]  the record an acquisition by this owner writes (record.rs `pending`)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  '1': read the fencing token now (the server's time, after the SET ran); '0': leave
--          it unread (fence.lua reads it if the body asks)
-- Returns
--   {0, fence}    acquired (fence 0: unread)
--   {1, record}   the key holds this record; nothing changed
--   {2}           the key holds something other than a string (the store asks acquire.lua)
local old = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(old) == 'table' and old.err then
  return { 2 }
end
if old then
  return { 1, old }
end
if ARGV[3] == '1' then
  return { 0, now_us() }
end
return { 0, 0 }
