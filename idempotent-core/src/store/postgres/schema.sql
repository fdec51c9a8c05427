-- The records table of `PgStore` (schema version 2: version 1 and the columns of attempts).
-- `PgStore::migrate()` runs this file with the schema and table placeholders (in braces) replaced
-- by the store's validated names, followed by the acquire function of version 3 (`<table>_acquire`,
-- built from the store's acquire statement in sql.rs); `PgStore::schema_sql` returns both, to apply
-- yourself. Safe to run again, and from several processes at once (they take turns on an advisory
-- lock). It brings a table of version 1 to version 2 in place.
--
-- One row per key:
--   key          the full key (scope and key); "C" collation, so that a prefix is one range of
--                the primary key and a scan pages through it in byte order
--   state        'P' in progress (held by `owner` until `expires_at`, or `lease_end` where it keeps
--                it), 'C' completed, 'R' released after failed attempts (the next acquire takes
--                it as the next attempt), 'F' failed for good (the key gave up)
--   owner        P: the owner id of the attempt holding the key; R, F: of the attempt that wrote
--                it (a repeated command knows itself by it); C: none
--   fence        C only: the fencing token of the acquisition that completed it (an acquisition's
--                token is drawn from the sequence below after its row is written; see docs/postgres.md)
--   fingerprint  the payload's fingerprint, if the call had one
--   result       C only: the stored result (JSON bytes), NULL when not replayable
--   stored_at    C only: when the result was stored, by the database's clock
--   expires_at   the end of the lease (P) or of `keep` (C, R, F), by the database's clock; a row past
--                it is treated as absent by every statement, and reaped in batches. A P row that
--                keeps its lease's end lives `keep` past it
--   watched      a caller waits for this key to change: commit and release then NOTIFY
--   attempt      P: which attempt of the key (NULL: the first); R, F: how many failed
--   lease_end    P: the end of the holder's lease, by the database's clock, in a row that keeps it
--                (its call counts crashes, holds unknown outcomes, or is not the key's first
--                attempt); NULL where `expires_at` is the lease's end
--   hold         P: once `lease_end` passes, the key is unknown (on_crash = hold), not free
--   last_error   R, F: the last failed attempt's error
SELECT pg_advisory_xact_lock(hashtext('idempotency migrate {schema}.{table}'));
CREATE SCHEMA IF NOT EXISTS "{schema}";
-- CACHE 1 (the default) matters: with a cache, each session would hand out numbers from a block
-- of its own, and a later acquisition could get a smaller token than an earlier one.
CREATE SEQUENCE IF NOT EXISTS "{schema}"."{table}_fence" AS bigint CACHE 1;
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
    key         text COLLATE "C" PRIMARY KEY,
    state       text NOT NULL,
    owner       text,
    fence       bigint,
    fingerprint text,
    result      bytea,
    stored_at   timestamptz,
    expires_at  timestamptz NOT NULL,
    watched     boolean NOT NULL DEFAULT false,
    attempt     integer,
    lease_end   timestamptz,
    hold        boolean NOT NULL DEFAULT false,
    last_error  text,
    CONSTRAINT "{table}_states" CHECK (state IN ('P', 'C', 'R', 'F')),
    CONSTRAINT "{table}_holder" CHECK (state <> 'P' OR owner IS NOT NULL),
    CHECK (state = 'P' OR (fence IS NOT NULL AND stored_at IS NOT NULL))
);
-- Version 2 over a table of version 1: the columns of attempts, and the checks that allowed only
-- 'P' and 'C' (and an owner on 'P' rows alone) replaced by the ones above.
ALTER TABLE "{schema}"."{table}"
    ADD COLUMN IF NOT EXISTS attempt integer,
    ADD COLUMN IF NOT EXISTS lease_end timestamptz,
    ADD COLUMN IF NOT EXISTS hold boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS last_error text;
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = '"{schema}"."{table}"'::regclass AND contype = 'c'
            AND conname NOT IN ('{table}_states', '{table}_holder')
            AND (pg_get_constraintdef(oid) LIKE '%ARRAY[''P''::text, ''C''::text]%'
                OR pg_get_constraintdef(oid) LIKE '%(state = ''P''::text) = (owner IS NOT NULL)%')
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '"{schema}"."{table}"', c.conname);
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = '"{schema}"."{table}"'::regclass
            AND conname = '{table}_states') THEN
        ALTER TABLE "{schema}"."{table}" ADD CONSTRAINT "{table}_states" CHECK (state IN ('P', 'C', 'R', 'F'));
    END IF;
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = '"{schema}"."{table}"'::regclass
            AND conname = '{table}_holder') THEN
        ALTER TABLE "{schema}"."{table}" ADD CONSTRAINT "{table}_holder" CHECK (state <> 'P' OR owner IS NOT NULL);
    END IF;
END
$$;
-- For the reaper: expired rows, oldest first.
CREATE INDEX IF NOT EXISTS "{table}_expires_at" ON "{schema}"."{table}" (expires_at);
-- The secret every runtime on this table signs tokens with ('token', created by the first store
-- that connects), and the one a rotation replaced ('token:previous', still accepted): tokens
-- issued by one instance of a fleet are taken by every other with no configuration.
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_secret" (
    name   text PRIMARY KEY,
    secret text NOT NULL
);
