-- many.lua: a batch of one transition, the script of one key run once per key. The store builds
-- the batch script from the one-key script (acquire.lua, commit.lua, release.lua): lib.lua,
-- then that script as the function `one(KEYS, ARGV)`, then this loop; every key gets exactly
-- what the one-key script would have done and answered, in order, in one call (all keys in one
-- hash slot on Redis Cluster).
-- KEYS[i]                 the i-th record
-- ARGV[1]                 n, how many arguments the one-key script takes
-- ARGV[2 + (i-1)*n ...]   the i-th key's n arguments
-- Returns an array with, per key, the one-key script's reply.
-- The two tables `one` gets are made once and filled again for each key (every entry is
-- written each time; no one-key script keeps or changes them): two tables fewer per key; the
-- batch commit script of 100 keys on Redis 7.0 went from 375.6 to 310-316 µs (docs/batches.md).
local n, out = tonumber(ARGV[1]), {}
local keys, args = {}, {}
for i = 1, #KEYS do
  keys[1] = KEYS[i]
  local base = 1 + (i - 1) * n
  for j = 1, n do
    args[j] = ARGV[base + j]
  end
  out[i] = one(keys, args)
end
return out
