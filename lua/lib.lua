-- lib.lua: helpers every script starts with (the store prepends this file to each script).
--
-- The record is one Redis hash; its fields (absent when not set):
--   s   state: 'I' issued token, 'P' in progress, 'C' completed
--   o   owner id of the attempt holding (P) or having completed (C) the key
--   f   fingerprint of the payload the key was first used with
--   n   fencing token of the latest acquisition (an integer, microseconds-based)
--   r   the stored result (C only; absent when the result is not replayable)
--   te  token records only: when the token expires (unix ms)
--   l   token records only, while P: when the holder's lease ends (unix ms)
--   w   '1' when a caller waits for this key to change (commit/release then PUBLISH on the key's name)
-- Parameter-mode records carry their lease as the key's own expiry (PEXPIRE).

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Lua numbers are doubles; '%.0f' prints integers below 2^53 exactly (tostring would not).
local function int(n)
  return string.format('%.0f', n)
end

-- The record at `key`: nil when absent, false plus a reason when the key holds something that
-- is not an idempotency record, otherwise a table of its fields (false for absent fields).
local function load(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then
    return nil
  end
  if t ~= 'hash' then
    return false, 'holds a Redis ' .. t .. ', not an idempotency record'
  end
  local f = redis.call('HMGET', key, 's', 'o', 'f', 'n', 'te', 'l', 'w')
  if f[1] ~= 'I' and f[1] ~= 'P' and f[1] ~= 'C' then
    return false, 'holds a hash that is not an idempotency record'
  end
  return { s = f[1], o = f[2], f = f[3], n = f[4], te = f[5], l = f[6], w = f[7] }
end

-- Publishes a change of `key` to callers waiting on it, when any said they wait.
local function notify(key, rec, what)
  if rec and rec.w then
    redis.call('PUBLISH', key, what)
  end
end
