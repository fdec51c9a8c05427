#!/usr/bin/env bash
# The explorer: randomized schedules of calls, faults, purges and record losses against the
# runtime, each history checked against docs/guarantees.md (I1-I9).
#   bash scripts/explore.sh [--minutes N | --schedules N] [--seed S] [--invariant TEXT]
#        [--store memory|model|redis|valkey|cluster|postgres|servers|all] [--plant BUG]
# memory, model: the deterministic layer (tokio's paused clock; a seed replays exactly; the
#   default is both). redis, valkey, cluster, postgres: the layer on real servers started here,
#   faults from outside (tests/explore_servers.rs); servers: all four. all: both layers, side by
#   side, each for the whole time.
# --plant release-owner | late-acquire | no-refill | inbox-owner | commit-on-drop | hold-ignored |
#   count-reset | gave-up-ignored: plants a known bug for the run (the owner check of
#   lua/release.lua removed; a body started without looking at its lease; PostgreSQL pools that
#   never refill in the background; the owner check of the statement that writes a transactional
#   batch's records removed; a commit dropped with its caller, or past its deadline, instead of
#   going on in the background; the memory store freeing a held key at its lease's end, counting
#   from one again after a failure, or running a key given up) and puts the source back
#   afterwards: the run must report a violation.
# Prints each violation with its seed, the invariant, the schedule and its history (the
# deterministic layer: the smallest schedule, shrunk), and as its last line `explored:
# <schedules> schedules, <calls> calls, <faults> faults, <violations> violations`, the layers
# added up; exits 1 on any violation. The deterministic layer is built with tokio's unstable cfg
# (to seed tokio's own randomness) in a target directory of its own, so that the workspace's
# build is not invalidated; the layer on real servers is a test of the workspace's suite.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes="" schedules="" seed="" invariant="" store="" plant=""
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --schedules) schedules="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --invariant) invariant="$2"; shift 2 ;;
        --store) store="$2"; shift 2 ;;
        --plant) plant="$2"; shift 2 ;;
        *) echo "explore: unknown argument $1" >&2; exit 2 ;;
    esac
done

det_stores="" servers=""
case "${store:-default}" in
    default) det_stores="all" ;;
    memory|model) det_stores="$store" ;;
    redis|valkey|cluster|postgres) servers="explore_$store" ;;
    servers) servers="explore_redis explore_valkey explore_cluster explore_postgres" ;;
    all) det_stores="all"; servers="explore_redis explore_valkey explore_cluster explore_postgres" ;;
    *) echo "explore: --store $store: memory, model, redis, valkey, cluster, postgres, servers or all" >&2; exit 2 ;;
esac

planted=""
restore() { if [ -n "$planted" ]; then cp "$planted.orig" "$planted"; rm -f "$planted.orig"; fi; }
trap restore EXIT
case "$plant" in
    "") ;;
    release-owner)
        planted=lua/release.lua; cp "$planted" "$planted.orig"
        sed -i "s/^if rec.s ~= 'P' or rec.o ~= owner then/if false then/" "$planted"
        grep -q "^if false then" "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    late-acquire)
        planted=idempotent-core/src/runtime/waiting.rs; cp "$planted" "$planted.orig"
        sed -i "s/if Instant::now() + margin >= sent + lease {/if false \&\& Instant::now() + margin >= sent + lease {/" "$planted"
        grep -q "if false && Instant" "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    no-refill)
        planted=idempotent-core/src/store/postgres/pools.rs; cp "$planted" "$planted.orig"
        sed -i "s/if self.refilling.swap(true, Ordering::AcqRel) {/if true || self.refilling.swap(true, Ordering::AcqRel) {/" "$planted"
        grep -q "if true || self.refilling" "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    inbox-owner)
        planted=idempotent-core/src/store/postgres/batch_sql.rs; cp "$planted" "$planted.orig"
        sed -i "s/WHERE q.keep > 0 AND r.key = q.key AND r.state = 'P' AND r.owner = q.owner/WHERE q.keep > 0 AND r.key = q.key/" "$planted"
        grep -q "WHERE q.keep > 0 AND r.key = q.key$" "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    commit-on-drop)
        planted=idempotent-core/src/runtime/commit.rs; cp "$planted" "$planted.orig"
        sed -i "s/let Some(retries) = self.0.take() else { return };/let Some(retries) = self.0.take() else { return }; if true { return; }/" "$planted"
        grep -q "if true { return; }" "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    hold-ignored)
        # The memory store frees a held key whose lease ran out, as if it were not held.
        planted=idempotent-core/src/store/memory.rs; cp "$planted" "$planted.orig"
        sed -i "s/Phase::InProgress if rec.lapsed(now) \&\& rec.hold => {/Phase::InProgress if false \&\& rec.lapsed(now) \&\& rec.hold => {/" "$planted"
        grep -q "if false && rec.lapsed(now)" "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    count-reset)
        # The memory store takes a failure's record as the key's first attempt again.
        planted=idempotent-core/src/store/memory.rs; cp "$planted" "$planted.orig"
        sed -i "s/            Phase::Released => rec.attempt,/            Phase::Released => 0,/" "$planted"
        grep -q "Phase::Released => 0," "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    gave-up-ignored)
        # The memory store takes a key given up as a failure's record: it runs again.
        planted=idempotent-core/src/store/memory.rs; cp "$planted" "$planted.orig"
        sed -i "s/            Phase::Released => rec.attempt,/            Phase::Released | Phase::Failed => rec.attempt,/" "$planted"
        grep -q "Phase::Released | Phase::Failed => rec.attempt," "$planted" || { echo "explore: could not plant $plant" >&2; exit 2; } ;;
    *) echo "explore: --plant $plant: release-owner, late-acquire, no-refill, inbox-owner, commit-on-drop, hold-ignored, count-reset or gave-up-ignored" >&2; exit 2 ;;
esac
[ -n "$plant" ] && echo "explore: planted $plant in $planted (put back when the run ends)"

out=$(mktemp -d)
status=0
if [ -n "$det_stores" ]; then
    RUSTFLAGS="--cfg tokio_unstable" CARGO_TARGET_DIR=target/explore \
        cargo build --quiet --release -p idempotent-explore
    args=(--store "$det_stores")
    [ -n "$minutes" ] && args+=(--minutes "$minutes")
    [ -n "$schedules" ] && args+=(--schedules "$schedules")
    [ -n "$seed" ] && args+=(--seed "$seed")
    [ -n "$invariant" ] && args+=(--invariant "$invariant")
fi
if [ -n "$servers" ]; then
    # The test binary itself is run, not `cargo test`, which would hold the build directory's
    # lock for the whole run.
    binary=$(cargo test -p idempotency --all-features --test explore_servers --no-run 2>&1 | tee /dev/stderr |
        sed -n 's/.*Executable tests\/explore_servers.rs (\(.*\))$/\1/p' | tail -1)
    [ -x "$binary" ] || { echo "explore: could not build tests/explore_servers.rs" >&2; exit 2; }
fi
pids=()
if [ -n "$det_stores" ]; then
    ( set +e; target/explore/release/explore "${args[@]}" >"$out/det" 2>&1; echo $? >"$out/det.rc" ) &
    pids+=($!)
fi
if [ -n "$servers" ]; then
    seconds=""
    [ -n "$minutes" ] && seconds=$(awk -v m="$minutes" 'BEGIN { print m * 60 }')
    # Without a time or a count, a minute; with only a count, no time limit besides it.
    [ -z "$minutes" ] && [ -z "$schedules" ] && seconds=60
    [ -z "$minutes" ] && [ -n "$schedules" ] && seconds=1000000
    # shellcheck disable=SC2086
    ( set +e; EXPLORE_SECONDS="$seconds" EXPLORE_SCHEDULES="$schedules" EXPLORE_SEED="$seed" EXPLORE_INVARIANT="$invariant" \
        CARGO_MANIFEST_DIR="$PWD" "$binary" --quiet --nocapture --test-threads 4 $servers \
        >"$out/servers" 2>&1; echo $? >"$out/servers.rc" ) &
    pids+=($!)
fi
wait "${pids[@]}" || true
for layer in det servers; do
    [ -f "$out/$layer" ] || continue
    grep -v '^explored' "$out/$layer" | grep -v '^test result\|^running [0-9]* test\|^test explore_' || true
    rc=$(cat "$out/$layer.rc")
    [ "$rc" = 0 ] || status=1
done
# The layers added up: each prints `explored[ on <store>]: a schedules, b calls, c faults, d violations`.
lines=$(cat "$out"/det "$out"/servers 2>/dev/null | grep '^explored' || true)
echo "$lines" | awk '
    { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^schedules/) s += $i; if ($(i+1) ~ /^calls/) c += $i;
        if ($(i+1) ~ /^faults/) f += $i; if ($(i+1) ~ /^violations/) v += $i } seen[NR] = $0 }
    END { if (NR > 1) for (i = 1; i <= NR; i++) print seen[i]; printf "explored: %d schedules, %d calls, %d faults, %d violations\n", s, c, f, v }'
rm -rf "$out"
exit $status
