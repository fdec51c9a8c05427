-- The records table as schema version 1 made it (before the columns of attempts), for
-- tests/postgres.rs to migrate from. Placeholders as in schema.sql.
SELECT pg_advisory_xact_lock(hashtext('idempotency migrate {schema}.{table}'));
CREATE SCHEMA IF NOT EXISTS "{schema}";
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
CREATE INDEX IF NOT EXISTS "{table}_expires_at" ON "{schema}"."{table}" (expires_at);
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_secret" (
    name   text PRIMARY KEY,
    secret text NOT NULL
);
