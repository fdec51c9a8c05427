-- fence.lua: the fencing token of an owner's hold, read on first use. A plain `SET NX GET`
-- acquire leaves it unread (most bodies never ask for it); the owner reads it while it holds
-- the key, so after every earlier holder's record was gone and before any later holder could
-- acquire: the server's clock now is larger than every earlier holder's token and smaller than
-- every later one's.
-- KEYS[1]  the record
-- ARGV[1]  owner id
-- Returns {'fence', token} while the owner holds the key in progress; {'lost'} otherwise (the
-- key is gone, completed, another owner's, past the lease's end it keeps, or not a record).
local rec = load(KEYS[1])
if not rec or rec.s ~= 'P' or rec.o ~= ARGV[1] or (rec.t ~= '' and lapsed(rec, now_ms())) then
  return { 'lost' }
end
-- Records written by earlier versions carry their token.
if rec.n ~= '0' then
  return { 'fence', tonumber(rec.n) }
end
return { 'fence', now_us() }
