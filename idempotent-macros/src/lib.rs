//! The `#[idempotent(...)]` attribute of the [`idempotency`](https://docs.rs/idempotency) crate:
//! it turns an `async fn` into one that runs at most once per key. Use it through the facade
//! (`use idempotency::idempotent;`), not from this crate directly; its documentation, with every
//! argument, is on [`idempotent`](macro@idempotent).
//!
//! The attribute is thin: it builds a `Call` from the function's arguments and hands the
//! original body to the runtime's public `run` method, exactly as a user could by hand.

#![deny(missing_docs)]

// A symlink to the runtime's parser (idempotent-core/src/duration.rs): one parser, packaged
// with each crate.
mod duration;

mod args;
mod expand;
mod template;

use proc_macro::TokenStream;

/// Makes an `async fn` run at most once per key: a duplicate call replays the stored result (or
/// is refused), a call while another runs the key is refused (or waits), and the body's `Err`,
/// a panic or a dropped call releases the key so a retry runs it again.
///
/// The function must return `Result<T, E>` where `T: Serialize + DeserializeOwned` (the value
/// stored and replayed, as JSON) and `E: From<idempotency::Error>` (the library's errors:
/// conflict, duplicate, store failure...).
///
/// ```
/// use idempotency::{idempotent, Error, Idempotency, MemoryStore};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug)]
/// enum AppError { Idem(Error) }
/// impl From<Error> for AppError {
///     fn from(e: Error) -> Self { AppError::Idem(e) }
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct Callback { provider: String, txn_id: u64, amount_cents: i64 }
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Receipt(String);
///
/// /// Runs once per provider and transaction; a re-sent callback gets the same receipt.
/// #[idempotent(key = "pay:{cb.provider}:{cb.txn_id}", fingerprint = cb.amount_cents, ttl = "30s",
///              keep = "24h", store = idem)]
/// async fn on_payment_callback(idem: &Idempotency, cb: Callback) -> Result<Receipt, AppError> {
///     Ok(Receipt(format!("receipt for {}", cb.txn_id)))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let idem = Idempotency::new(MemoryStore::new());
/// let cb = || Callback { provider: "stripe".into(), txn_id: 7, amount_cents: 1250 };
/// let first = on_payment_callback(&idem, cb()).await.unwrap();
/// let again = on_payment_callback(&idem, cb()).await.unwrap(); // replayed, body not run
/// assert_eq!(first, again);
/// # }
/// ```
///
/// # Arguments
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `key = "tmpl"` | the key, a template of the arguments: `{arg}`, `{arg.field.sub}`, `{self.field}`, a binding of an argument's pattern (`{req.id}` with `Json(req): Json<Req>`), `{arg?}` when an empty value is meant; `{{`/`}}` for braces; each value escaped, so distinct arguments never make one key; an empty value is `Error::InvalidKey` | required |
/// | `mode = Param \| Token` | parameter mode (the key from the arguments) or token mode (the key is a one-time token from `issue_token`) | `Param` |
/// | `ttl = "30s"` | the lease: how long a crashed holder keeps the key; renewed every `ttl/3` while the body runs (at least 10 ms) | the runtime's, 30 s |
/// | `keep = "24h"` | how long a completed result is kept and replayed; `"0s"` keeps nothing (a distributed mutex) | the runtime's, 24 h |
/// | `on_duplicate = replay \| reject` | on a completed key: return the stored value, or `Error::Duplicate` | `replay` |
/// | `on_conflict = reject \| wait("5s")` | on a key in progress elsewhere: `Error::Conflict` at once, or wait for the holder, then replay or run; `Error::Timeout` after the wait | `reject` |
/// | `fingerprint = expr` | an expression of the arguments hashed with the key (`amount`, `ev.amount_cents`, `(cb.amount, cb.currency)`, `req.total()`): the same key with another payload is `Error::KeyReused` | none |
/// | `scope = "..."` | the key space; two functions with one scope share keys on purpose | module path and function name (token mode: `token`) |
/// | `abort_on_lease_lost` | drop the body and fail with `Error::LeaseLost` as soon as the lease is known lost | off |
/// | `on_cancel = release \| finish` | what a dropped call does (an axum handler whose client went away, an outer timeout): release the key (a retry runs the body again), or run to its end in a task of its own and store its result (the arguments must be `Send + 'static`) | `release` |
/// | `store = expr` | what runs the call: an `Idempotency`, a `&Idempotency`, `self.idem`, `app.idem.clone()` | `idempotency::global()` |
/// | `tx = pg` | feature `postgres`: the body runs in a transaction of this `PgStore`, committed with the record; the function declares `tx: &mut PgTransaction` (any name), which callers do not pass | none |
/// | `crate = path` | the path of the `idempotency` crate, when renamed | `::idempotency` |
///
/// Durations are `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"` or an integer of seconds, checked
/// at compile time. Every malformed attribute (an unknown or repeated argument, a bad duration, a
/// template naming something that is not an argument, two placeholders with nothing between
/// them, a non-async function, a wrong return type...) is a compile error on the offending token,
/// and the function is still emitted beside it.
///
/// # Scopes, and a scheduled job's mutex
///
/// The default scope is the function's module path and name, so two functions with the same
/// template never share keys. For a mutex between *processes* that should exclude each other
/// whatever their code (two binaries, a renamed function), give the scope yourself:
///
/// ```
/// # use idempotency::{idempotent, Error};
/// /// Runs once per day across every instance that fires it; the record of a day's run is kept
/// /// 36 hours, so an instance firing late that day finds it and skips.
/// #[idempotent(scope = "jobs", key = "daily-report:{date}", ttl = "5m", keep = "36h", on_duplicate = reject)]
/// async fn daily_report(date: &str) -> Result<(), Error> {
///     Ok(())
/// }
/// ```
///
/// # On axum handlers (feature `axum`)
///
/// Arguments written as patterns are named by their bindings; `idempotency::web::Json` is both
/// the extractor and a response that is stored and replayed; `idempotency::Error` answers as an
/// RFC 9457 problem. With `store = app.idem.clone()` the runtime can come from the state.
///
/// ```ignore
/// #[idempotent(key = "order:{req.id}", fingerprint = (req.sku, req.qty), store = app.idem.clone())]
/// async fn create_order(State(app): State<App>, Json(req): Json<NewOrder>) -> Result<Json<Order>, Error> {
///     Ok(Json(app.orders.create(req).await?))
/// }
/// ```
///
/// # What it expands to
///
/// The body above becomes, in essence (`docs/attribute.md` in the repository has the whole
/// expansion and the full reference):
///
/// ```text
/// let __idem_key = KeyBuilder::new("pay:{cb.provider}:{cb.txn_id}", ":")
///     .text("pay:").value("cb.provider", &cb.provider).text(":").value("cb.txn_id", &cb.txn_id);
/// // An empty value: the runtime refuses the call as InvalidKey (span, metric).
/// let __idem_call = Call::from_template(__idem_key, Mode::Param)
///     .scope(concat!(module_path!(), "::on_payment_callback"))
///     .ttl(Duration::from_millis(30000)).keep(Duration::from_millis(86400000))
///     .fingerprint(&cb.amount_cents);
/// (idem).run(__idem_call, move || async move { /* the original body */ }).await
/// ```
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(args.into(), item.into()).into()
}
