#!/usr/bin/env bash
# The explorer: randomized schedules of calls, faults, purges and record losses against the
# runtime on tokio's paused clock, each history checked against docs/guarantees.md (I1-I7).
#   bash scripts/explore.sh [--minutes N | --schedules N] [--seed S] [--store memory|model|all]
# Prints each violation with its seed, the invariant, the smallest schedule and its history, and
# as its last line `explored: <schedules> schedules, <calls> calls, <faults> faults, <violations>
# violations`; exits 1 on any violation. Built with tokio's unstable cfg (to seed tokio's own
# randomness, so that a seed replays exactly) in a target directory of its own, so that the
# workspace's build is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg tokio_unstable" CARGO_TARGET_DIR=target/explore \
    cargo build --quiet --release -p idempotent-explore
exec target/explore/release/explore "$@"
