-- lib.lua: helpers every script uses (the store puts this file at a script's `-- @lib` line, or
-- before the script when it has none).
--
-- A record is one Redis string, fields joined by '|' in this order (empty when not set):
--
--   s|n|o|f|t|w|r
--
--   s   state: 'P' in progress, 'C' completed
--   n   fencing token: 0 while P (the token is the server's `TIME`, read by the owner while it
--       holds the key: right after the acquire where the caller wants it at once, or on first
--       use by fence.lua; returned to the caller and not stored, so that every P record of an
--       owner is the same string, which a commit can compare whole); in a C record, the token
--       of the acquisition that completed it (the server's clock in microseconds), or 0 when
--       its body never read it
--   o   owner id: in a P record, of the attempt holding the key; in a C record, of the attempt
--       that completed it (a repeated commit knows itself by it); the runtime's owner ids carry
--       the time the attempt started (see docs/records.md)
--   f   fingerprint of the payload the key was first used with
--   t   C only: when the result was stored (unix ms), by the committing client's clock: for
--       operators (age filters), never for a decision
--   w   '1' when a caller waits for the key to change (commit/release then PUBLISH on the
--       key's name)
--   r   the stored result, last so it may contain '|' (C only; empty when not replayable: a
--       JSON result is never empty)
--
-- So `redis-cli GET <key>` shows a completed record as
-- `C|0|AAAAAAgR7uBddltXePwIaA||1764505474200||{"id":7}` (its body never read its fence).
-- A record's lifetime is its key's own expiry: the lease while P, `keep` once C (`PTTL`).
-- A string keeps a completed record at its result's size plus a few dozen bytes, where a hash
-- with a result over 64 bytes would leave the compact encoding and cost hundreds.

local FIELDS = { 's', 'n', 'o', 'f', 't', 'w' }

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Lua numbers are doubles; '%.0f' prints integers below 2^53 exactly (tostring would not).
local function int(n)
  return string.format('%.0f', n)
end

local function encode(rec)
  return table.concat({ rec.s, rec.n, rec.o or '', rec.f or '', rec.t or '', rec.w or '', rec.r or '' }, '|')
end

local function decode(v)
  local rec, pos = {}, 1
  for i = 1, #FIELDS do
    local bar = string.find(v, '|', pos, true)
    if not bar then
      return nil
    end
    rec[FIELDS[i]] = string.sub(v, pos, bar - 1)
    pos = bar + 1
  end
  rec.r = string.sub(v, pos)
  return rec
end

-- The record at `key`: nil when absent, false plus a reason when the key holds something that
-- is not an idempotency record, otherwise a table of its fields ('' for empty ones). `got` is
-- the key's `redis.pcall('GET', key)` when the script has read it already.
local function load(key, got)
  local v = got
  if v == nil then
    v = redis.pcall('GET', key)
  end
  if type(v) == 'table' and v.err then
    return false, 'holds a Redis ' .. redis.call('TYPE', key)['ok'] .. ', not an idempotency record'
  end
  if not v then
    return nil
  end
  local rec = decode(v)
  if not rec or (rec.s ~= 'P' and rec.s ~= 'C') or not string.match(rec.n, '^%d+$') then
    return false, 'holds a string that is not an idempotency record'
  end
  return rec
end

-- Publishes a change of `key` to callers waiting on it, when any said they wait.
local function notify(key, rec, what)
  if rec and rec.w == '1' then
    redis.call('PUBLISH', key, what)
  end
end
