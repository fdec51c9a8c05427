#!/usr/bin/env bash
# What a batch of 100 costs PostgreSQL's server, statement shapes alone (docs/batches.md, "Speed"):
# pgbench, one client, each transaction one batch of 100 fresh keys, the variants in turn, ROUNDS
# rounds of SECS seconds each after one round not counted; prints batches per second per variant and each median against the
# naive baseline's.
#   naive          the bench's naive baseline: INSERT ... ON CONFLICT over an array of keys, then
#                  an UPDATE over the same array, on a table of key, expiry and result;
#   naive-records  the same two statements on the store's records table (schema.sql);
#   minimal        the least a batch with our guarantees writes, on the records table: the claim's
#                  INSERT (state, owner, fingerprint, lease, attempt, as `acquire_many`'s `ins`)
#                  and an owner-checked UPDATE to the completed row.
# The store's own statements run in `bench --batches` (its `pg` rows), with their client.
#   bash scripts/pgbench-batch.sh               ROUNDS=3 SECS=5 by default
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${ROUNDS:-3}"
secs="${SECS:-5}"
pg=(-h "${PGHOST:-127.0.0.1}" -U "${PGUSER:-postgres}")
db="idem_pgbench_$$"
work="$(mktemp -d)"
trap 'psql "${pg[@]}" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1; rm -rf "$work"' EXIT

psql "${pg[@]}" -qc "CREATE DATABASE $db"
sed -e 's/{schema}/s/g' -e 's/{table}/records/g' "$root/idempotent-core/src/store/postgres/schema.sql" \
  | PGOPTIONS='-c client_min_messages=warning' psql "${pg[@]}" -d "$db" -q -v ON_ERROR_STOP=1 >/dev/null
psql "${pg[@]}" -d "$db" -qc "CREATE TABLE naive (key text PRIMARY KEY, expires_at timestamptz NOT NULL, result bytea)"

keys="(SELECT array_agg(:id || '-' || g) FROM generate_series(1, 100) g)"
cat >"$work/naive.sql" <<EOF
\set id random(1, 1000000000000)
INSERT INTO naive (key, expires_at) SELECT k, now() + interval '30 seconds' FROM unnest($keys) k ON CONFLICT DO NOTHING RETURNING key;
UPDATE naive AS n SET result = '\x7b7d', expires_at = now() + interval '1 day' FROM unnest($keys) AS u(key) WHERE n.key = u.key;
EOF
sed -e 's/INTO naive (key, expires_at) SELECT k,/INTO s.records (key, state, owner, expires_at) SELECT k, '"'P', 'o'"',/' \
  -e 's/UPDATE naive AS n/UPDATE s.records AS n/' "$work/naive.sql" >"$work/naive-records.sql"
cat >"$work/minimal.sql" <<EOF
\set id random(1, 1000000000000)
INSERT INTO s.records (key, state, owner, fingerprint, expires_at, attempt, lease_end, hold)
  SELECT k, 'P', 'owner-0123456789ab', NULL, statement_timestamp() + 30000 * interval '1 millisecond', 1, NULL, false
  FROM unnest($keys) k ORDER BY k ON CONFLICT (key) DO NOTHING RETURNING key, owner, attempt;
UPDATE s.records AS r SET state = 'C', owner = NULL, fence = 1, result = '\x7b7d', stored_at = statement_timestamp(),
  expires_at = statement_timestamp() + interval '1 day', attempt = NULL
  FROM unnest($keys) AS q(key) WHERE r.key = q.key AND r.state = 'P' AND r.owner = 'owner-0123456789ab' RETURNING r.key;
EOF

variants=(naive naive-records minimal)
# A round not counted: a fresh database's first seconds of writes run at a third of the rate.
for v in "${variants[@]}"; do
  pgbench "${pg[@]}" -n -M prepared -c 1 -T 2 -f "$work/$v.sql" "$db" >/dev/null 2>&1
done
declare -A runs
for _ in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    tps="$(pgbench "${pg[@]}" -n -M prepared -c 1 -T "$secs" -f "$work/$v.sql" "$db" 2>&1 \
      | awk '/^tps/ { printf "%d", $3 }')"
    runs[$v]="${runs[$v]:-} $tps"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
base="$(echo "${runs[naive]}" | median)"
printf '%-14s %-24s %8s %8s\n' variant "batches/s (each round)" median "/ naive"
for v in "${variants[@]}"; do
  m="$(echo "${runs[$v]}" | median)"
  printf '%-14s %-24s %8d %7.2fx\n' "$v" "${runs[$v]# }" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN { print a / b }')"
done
