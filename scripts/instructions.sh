#!/usr/bin/env bash
# The client's CPU per call, in instructions counted by `valgrind --tool=callgrind` (a count, not
# a time: it repeats on this noisy machine): each path of `bench --instructions` (bench/src/
# instructions.rs) runs LOW and HIGH calls in a row against a redis-server of its own, and the
# difference of the two totals over HIGH - LOW is one call's instructions, with connecting and
# preparing cancelled out. Prints one row per path and the ratios the README's profile table
# shows (ours against the naive baseline and the one-command floor).
#   bash scripts/instructions.sh [PATH...]      LOW=200 HIGH=1200 by default
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
low="${LOW:-200}"
high="${HIGH:-1200}"
paths=("$@")
[ ${#paths[@]} -eq 0 ] && paths=(get evalsha naive-first naive-replay hand-replay first replay conflict first-fenced memory-first)
command -v valgrind >/dev/null || { echo "instructions: valgrind is not installed" >&2; exit 1; }

cargo build --release -q -p idempotent-bench
bench="$root/target/release/bench"

work="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
url="redis://127.0.0.1:$port"

# Instructions of one run of `path` with `n` calls (callgrind's "Collected" total).
count() {
  local path="$1" n="$2"
  valgrind --tool=callgrind --callgrind-out-file="$work/out.$path.$n" "$bench" --instructions "$path" --ops "$n" \
    --redis "$url" 2>"$work/err.$path.$n" >/dev/null \
    || { cat "$work/err.$path.$n" >&2; exit 1; }
  grep -o 'Collected : [0-9]*' "$work/err.$path.$n" | awk '{print $3}'
}

declare -A per
printf '%-14s %14s\n' path instructions/call
for path in "${paths[@]}"; do
  a="$(count "$path" "$low")"
  b="$(count "$path" "$high")"
  per[$path]=$(( (b - a) / (high - low) ))
  printf '%-14s %14d\n' "$path" "${per[$path]}"
done

ratio() {
  [ -n "${per[$1]:-}" ] && [ -n "${per[$2]:-}" ] && awk -v a="${per[$1]}" -v b="${per[$2]}" -v l="$3" \
    'BEGIN { printf "%-44s %6.2fx\n", l, a / b }'
  return 0
}
echo
ratio first naive-first "first execution / naive first (SET NX+SET)"
ratio replay get "replay / one bare command (GET)"
ratio replay naive-replay "replay / naive replay (SET NX+GET)"
ratio replay hand-replay "replay / hand replay (SET NX GET, decoded)"
ratio hand-replay get "hand replay / one bare command (GET)"
ratio conflict evalsha "conflict / one script call (EVALSHA floor)"
ratio conflict get "conflict / one bare command (GET)"
ratio first-fenced first "first, body reads its fence / first"
