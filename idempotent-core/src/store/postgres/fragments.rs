//! The pieces of SQL the statements share: how a row's lease, expiry and attempts read
//! (`{prefix}` is the row's alias with its dot, or nothing).

/// Milliseconds from now to `at`, as `bigint` (negative once past).
pub(super) const LEFT_MS: &str = "(extract(epoch FROM ({at} - statement_timestamp())) * 1000)::bigint";

/// The lease's end a row `{r}` keeps, as unix ms (NULL where it keeps none).
pub(super) const LEASE_END_MS: &str = "(extract(epoch FROM {r}lease_end) * 1000)::bigint";

/// What a completed row keeps none of: the columns of attempts, cleared.
pub(super) const CLEARED: &str = "attempt = NULL, lease_end = NULL, hold = false, last_error = NULL";

/// Whether the row `{prefix}` is in progress past the lease's end it keeps (its holder stopped).
pub(super) fn lapsed(prefix: &str) -> String {
    format!("({prefix}state = 'P' AND coalesce({prefix}lease_end <= statement_timestamp(), false))")
}

/// Whether the next acquire takes the row `{prefix}` as a new attempt (besides an expired one):
/// the record of failed attempts, or one in progress past its lease's end and not held.
pub(super) fn takeable(prefix: &str) -> String {
    format!(
        "({prefix}expires_at <= statement_timestamp() OR {prefix}state = 'R' OR ({} AND NOT {prefix}hold))",
        lapsed(prefix)
    )
}

/// The row `{prefix}`'s state as operators see it: 'U' for unknown (held past its lease's end),
/// 'R' for one past its lease's end and not held (an attempt counted), its own otherwise.
pub(super) fn shown_state(prefix: &str) -> String {
    format!("CASE WHEN {} THEN (CASE WHEN {prefix}hold THEN 'U' ELSE 'R' END) ELSE {prefix}state END", lapsed(prefix))
}

/// Whether the row `{prefix}` is held by `owner` and counts attempts before this one: it keeps
/// its lease's end, lives past it, and is not the key's first attempt.
pub(super) fn counts_earlier(prefix: &str, owner: &str) -> String {
    format!(
        "({prefix}state = 'P' AND {prefix}owner = {owner} AND {prefix}expires_at > statement_timestamp() \
         AND coalesce({prefix}attempt, 1) > 1 AND coalesce({prefix}expires_at > {prefix}lease_end, false))"
    )
}

/// A row in progress made the record of the attempts before its own (its owner kept): `SET`'s
/// list, for the row `{r}`.
pub(super) const RELEASED_SET: &str =
    "state = 'R', attempt = {r}attempt - 1, fence = 0, fingerprint = NULL, result = NULL, \
    stored_at = statement_timestamp(), expires_at = statement_timestamp() + ({r}expires_at - {r}lease_end), \
    lease_end = NULL, hold = false, last_error = ''";

/// The lease left of the row `{prefix}` in ms: to the end it keeps, or to its expiry.
pub(super) fn lease_left(prefix: &str) -> String {
    LEFT_MS.replace("{at}", &format!("coalesce({prefix}lease_end, {prefix}expires_at)"))
}
