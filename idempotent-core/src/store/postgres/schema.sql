-- The records table of `PgStore` (schema version 1). `PgStore::migrate()` runs this file with the
-- schema and table placeholders (in braces) replaced by the store's validated names; to apply it
-- yourself, replace them the same way (defaults: public, idempotency). Safe to run again, and from
-- several processes at once (they take turns on an advisory lock).
--
-- One row per key:
--   key          the full key (scope and key); "C" collation, so that a prefix is one range of
--                the primary key and a scan pages through it in byte order
--   state        'P' in progress (held by `owner` until `expires_at`), 'C' completed
--   owner        P only: the owner id of the attempt holding the key
--   fence        C only: the fencing token of the acquisition that completed it (an acquisition's
--                token is drawn from the sequence below after its row is written; see docs/postgres.md)
--   fingerprint  the payload's fingerprint, if the call had one
--   result       C only: the stored result (JSON bytes), NULL when not replayable
--   stored_at    C only: when the result was stored, by the database's clock
--   expires_at   the end of the lease (P) or of `keep` (C), by the database's clock; a row past it
--                is treated as absent by every statement, and reaped in batches
--   watched      a caller waits for this key to change: commit and release then NOTIFY
SELECT pg_advisory_xact_lock(hashtext('idempotency migrate {schema}.{table}'));
CREATE SCHEMA IF NOT EXISTS "{schema}";
-- CACHE 1 (the default) matters: with a cache, each session would hand out numbers from a block
-- of its own, and a later acquisition could get a smaller token than an earlier one.
CREATE SEQUENCE IF NOT EXISTS "{schema}"."{table}_fence" AS bigint CACHE 1;
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
    key         text COLLATE "C" PRIMARY KEY,
    state       text NOT NULL CHECK (state IN ('P', 'C')),
    owner       text,
    fence       bigint,
    fingerprint text,
    result      bytea,
    stored_at   timestamptz,
    expires_at  timestamptz NOT NULL,
    watched     boolean NOT NULL DEFAULT false,
    CHECK ((state = 'P') = (owner IS NOT NULL)),
    CHECK (state = 'P' OR (fence IS NOT NULL AND stored_at IS NOT NULL))
);
-- For the reaper: expired rows, oldest first.
CREATE INDEX IF NOT EXISTS "{table}_expires_at" ON "{schema}"."{table}" (expires_at);
-- The secret every runtime on this table signs tokens with ('token', created by the first store
-- that connects), and the one a rotation replaced ('token:previous', still accepted): tokens
-- issued by one instance of a fleet are taken by every other with no configuration.
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_secret" (
    name   text PRIMARY KEY,
    secret text NOT NULL
);
