//! What an sqlx error means to a caller: the store error kind it can act on (try again, fix the
//! configuration, the database is away), with the operation named.

use crate::error::{StoreError, StoreErrorKind};

/// An sqlx error as a store error, with the kind a caller can act on.
pub(crate) fn pg_error(op: &str, e: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    let kind = match &e {
        E::Database(db) => match db.code().as_deref().unwrap_or("") {
            // query_canceled: the statement_timeout (or a cancel request).
            "57014" => StoreErrorKind::Timeout,
            "40001" | "40P01" => StoreErrorKind::Serialization,
            // The server going away, refusing connections, or ending ours.
            c if c.starts_with("08") || c.starts_with("57P") || c == "53300" => StoreErrorKind::Unavailable,
            // Missing table or schema (not migrated), no permission, wrong database or login.
            "42P01" | "3F000" | "42501" | "3D000" => {
                let message = format!(
                    "{op}: {} (the records table must exist with this store's schema and table: \
                     PgStoreBuilder::migrate, or PgStore::schema_sql; and the user needs SELECT, INSERT, UPDATE, \
                     DELETE on it, USAGE on its sequence and EXECUTE on its acquire function; see docs/postgres.md)",
                    db.message()
                );
                return StoreError::new(StoreErrorKind::Config, message).with_source(e);
            }
            c if c.starts_with("28") => StoreErrorKind::Config,
            // Data exceptions (a value out of range, an interval too long) and syntax errors:
            // the statement can never succeed as sent.
            c if c.starts_with("22") || c.starts_with("42") => StoreErrorKind::Refused,
            _ => StoreErrorKind::Backend,
        },
        E::Io(_) | E::Tls(_) | E::PoolClosed | E::WorkerCrashed => StoreErrorKind::Unavailable,
        E::PoolTimedOut => {
            let message = format!("{op}: no connection to the database within the connect timeout (is it up?)");
            return StoreError::new(StoreErrorKind::Unavailable, message).with_source(e);
        }
        E::Configuration(_) => StoreErrorKind::Config,
        _ => StoreErrorKind::Reply,
    };
    StoreError::new(kind, format!("{op}: {e}")).with_source(e)
}
