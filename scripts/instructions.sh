#!/usr/bin/env bash
# The client's CPU per call, in instructions counted by `valgrind --tool=callgrind` (a count, not
# a time: it repeats on this noisy machine): each path of `bench --instructions` (bench/src/
# instructions.rs) runs LOW and HIGH calls in a row against a redis-server of its own, and the
# difference of the two totals over HIGH - LOW is one call's instructions, with connecting and
# preparing cancelled out. Prints one row per path and the ratios the README's profile table
# shows (ours against the naive baseline and the one-command floor).
#   bash scripts/instructions.sh [PATH...]      LOW=200 HIGH=1200 ROUNDS=3 by default
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
low="${LOW:-200}"
high="${HIGH:-1200}"
rounds_n="${ROUNDS:-3}"
paths=("$@")
[ ${#paths[@]} -eq 0 ] && paths=(get evalsha naive-first naive-replay hand-replay first replay conflict first-fenced first-telemetry memory-first)
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
# One run first, not counted: the setup of every path writes the keys the paths read (`idem.run`
# on `ins:replay:*`), which is 64 first executions on a fresh server and 64 replays after. Counted
# from a fresh server, the first path's short run paid about 2.5 M instructions more than its long
# one, and its count per call came out 2,500 too low.
"$bench" --instructions get --ops 1 --redis "$url" >/dev/null

# Instructions of one run of `path` with `n` calls (callgrind's "Collected" total), less the
# metrics recorder's clock calibration (`quanta::Clock::new`, run once when `first-telemetry`
# installs the recorder): it runs for a time, not a count, so its instructions differed by
# millions from one run to the next, thousands per call once divided.
count() {
  local path="$1" n="$2"
  local out="$work/out.$path.$n"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bench" --instructions "$path" --ops "$n" \
    --redis "$url" 2>"$work/err.$path.$n" >/dev/null \
    || { cat "$work/err.$path.$n" >&2; exit 1; }
  local total calibration
  total="$(grep -o 'Collected : [0-9]*' "$work/err.$path.$n" | awk '{print $3}')"
  calibration="$(callgrind_annotate --inclusive=yes --threshold=100 "$out" \
    | awk '/quanta::Clock::new / { gsub(",", "", $1); print $1; exit }')"
  echo $(( total - ${calibration:-0} ))
}

# One call's instructions: the median over ROUNDS rounds of the differenced count, with the spread
# of the rounds printed beside it, so that a count that shifts between runs (as the first path's
# did before the uncounted run above) shows instead of passing for a measurement.
declare -A per
printf '%-16s %14s %18s\n' path instructions/call "rounds (min-max)"
for path in "${paths[@]}"; do
  rounds=()
  for _ in $(seq "$rounds_n"); do
    a="$(count "$path" "$low")"
    b="$(count "$path" "$high")"
    rounds+=($(( (b - a) / (high - low) )))
  done
  sorted=($(printf '%s\n' "${rounds[@]}" | sort -n))
  per[$path]=${sorted[$(( ${#sorted[@]} / 2 ))]}
  printf '%-16s %14d %18s\n' "$path" "${per[$path]}" "${sorted[0]}-${sorted[-1]}"
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
ratio first-telemetry first "first, subscriber and recorder on / first"
