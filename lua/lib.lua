-- lib.lua: helpers every script uses (the store puts this file at a script's `-- @lib` line, or
-- before the script when it has none).
--
-- A record is one Redis string, fields joined by '|' in this order (empty when not set):
--
--   s|n|o|f|t|w|r
--
--   s   state: 'P' in progress, 'C' completed, 'R' released after a failed attempt (the next
--       acquire takes it as the next attempt), 'F' failed for good (the key gave up)
--   n   fencing token: 0 while P (the token is the server's `TIME`, read by the owner while it
--       holds the key: right after the acquire where the caller wants it at once, or on first
--       use by fence.lua; returned to the caller and not stored, so that every P record of an
--       owner is the same string, which a commit can compare whole); in a C record, the token
--       of the acquisition that completed it (the server's clock in microseconds), or 0 when
--       its body never read it; 0 in R and F
--   o   owner id: in a P record, of the attempt holding the key; in a C record, of the attempt
--       that completed it (a repeated commit knows itself by it; empty when an operator or a
--       resolver completed it); in R and F, of the attempt that failed (a repeated command
--       knows itself by it); the runtime's owner ids carry the time the attempt started (see
--       docs/records.md)
--   f   fingerprint of the payload the key was first used with (kept in P, C and F)
--   t   C, R, F: when it was stored (unix ms), by the clock of the client that wrote it (the
--       server's for a record an operator resolved or a release wrote): for operators (age
--       filters), never for a decision. P: the end of the
--       holder's lease (unix ms, the server's clock) in a record that keeps it (see below),
--       empty where the key's own expiry is the lease
--   w   '1' when a caller waits for the key to change (commit/release then PUBLISH on the
--       key's name)
--   r   last, so it may contain '|': C: the stored result (empty when not replayable: a JSON
--       result is never empty); P that keeps its lease's end: '<attempt>:<keep ms>:<hold>'
--       (hold '1': the key is unknown, not free, once the lease ends); R, F: '<failed
--       attempts>:<the last error's text>'
--
-- So `redis-cli GET <key>` shows a completed record as
-- `C|0|AAAAAAgR7uBddltXePwIaA||1764505474200||{"id":7}` (its body never read its fence).
-- A record's lifetime is its key's own expiry: the lease while P, `keep` once C, R or F
-- (`PTTL`). A P record keeps its lease's end itself when its caller asked what a lapse means
-- (counted: `give_up_after`; held: `on_crash = hold`) or when it is not the key's first
-- attempt (its count must outlive a crash): it then lives `keep` past that end, and the
-- scripts decide by the server's clock what a passed end means (a counted failed attempt, or
-- an unknown outcome).
-- A string keeps a completed record at its result's size plus a few dozen bytes, where a hash
-- with a result over 64 bytes would leave the compact encoding and cost hundreds.

local FIELDS = { 's', 'n', 'o', 'f', 't', 'w' }

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
  local bad = 'holds a string that is not an idempotency record'
  if not rec or not string.match(rec.n, '^%d+$') then
    return false, bad
  end
  if rec.s == 'P' then
    -- rec.a: the attempt; rec.k: how long the record outlives its lease's end; rec.h: held then
    rec.a, rec.k, rec.h = 1, 0, false
    if rec.t ~= '' then
      local a, k, h = string.match(rec.r, '^(%d+):(%d+):([01])$')
      if not a or not string.match(rec.t, '^%d+$') then
        return false, bad
      end
      rec.a, rec.k, rec.h = tonumber(a), tonumber(k), h == '1'
    end
  elseif rec.s == 'R' or rec.s == 'F' then
    -- rec.a: the failed attempts; rec.e: the last one's error
    local a, e = string.match(rec.r, '^(%d+):(.*)$')
    if not a then
      return false, bad
    end
    rec.a, rec.e = tonumber(a), e
  elseif rec.s ~= 'C' then
    return false, bad
  end
  return rec
end

-- Whether `rec` is in progress past the lease's end it keeps, at `now` (ms): its holder stopped
-- without a commit or a release.
local function lapsed(rec, now)
  return rec.s == 'P' and rec.t ~= '' and tonumber(rec.t) <= now
end

-- The record of `attempts` failed attempts ('R') or of a key given up ('F'), by `owner`.
local function failure(s, owner, fp, attempts, err, now)
  return encode({ s = s, n = '0', o = owner, f = fp, t = int(now), r = int(attempts) .. ':' .. err })
end

-- Writes `value` at `key` for `ms` milliseconds, or deletes the key when `ms` is 0.
local function put(key, value, ms)
  if ms > 0 then
    redis.call('SET', key, value, 'PX', ms)
  else
    redis.call('DEL', key)
  end
end

-- Publishes a change of `key` to callers waiting on it, when any said they wait.
local function notify(key, rec, what)
  if rec and rec.w == '1' then
    redis.call('PUBLISH', key, what)
  end
end
