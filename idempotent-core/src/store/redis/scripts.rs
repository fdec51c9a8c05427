//! The Lua scripts of `lua/`, each with `lib.lua` put in (and the batch scripts, one-key scripts
//! run per key by `many.lua`), and how they are sent: EVALSHA,
//! falling back to EVAL on NOSCRIPT (a restarted or failed-over server has an empty script
//! cache; EVAL also caches the script again).

use crate::store::boxed_in_place;
use fred::prelude::*;
use fred::types::scripts::Script;
use once_cell::sync::Lazy;

const LIB: &str = include_str!("../../../lua/lib.lua");

/// The marker line where a script wants the helpers (a fast path before it skips defining
/// them); without one they go first.
const LIB_HERE: &str = "-- @lib\n";

/// `script` with `lib.lua` put in.
fn with_lib(script: &str) -> String {
    match script.split_once(LIB_HERE) {
        Some((fast, rest)) => format!("{fast}{LIB}{rest}"),
        None => format!("{LIB}{script}"),
    }
}

/// The batch script of a one-key `script`: `lib.lua`, the script as the function `one(KEYS,
/// ARGV)` (its fast path and all), and `many.lua`'s loop calling it per key.
fn many(script: &str) -> String {
    let body = script.replacen(LIB_HERE, "", 1);
    format!("{LIB}local function one(KEYS, ARGV)\n{body}\nend\n{}", include_str!("../../../lua/many.lua"))
}

macro_rules! lua {
    ($file:literal) => {
        Lazy::new(|| Script::from_lua(with_lib(include_str!(concat!("../../../lua/", $file)))))
    };
    (many $file:literal) => {
        Lazy::new(|| Script::from_lua(many(include_str!(concat!("../../../lua/", $file)))))
    };
}

pub(crate) static ACQUIRE: Lazy<Script> = lua!("acquire.lua");
pub(crate) static RENEW: Lazy<Script> = lua!("renew.lua");
pub(crate) static COMMIT: Lazy<Script> = lua!("commit.lua");
pub(crate) static RELEASE: Lazy<Script> = lua!("release.lua");
pub(crate) static FORGET: Lazy<Script> = lua!("forget.lua");
pub(crate) static INSPECT: Lazy<Script> = lua!("inspect.lua");
pub(crate) static FENCE: Lazy<Script> = lua!("fence.lua");
pub(crate) static FAIL: Lazy<Script> = lua!("fail.lua");
pub(crate) static RESOLVE: Lazy<Script> = lua!("resolve.lua");
pub(crate) static FAIL_MANY: Lazy<Script> = lua!(many "fail.lua");
pub(crate) static ACQUIRE_MANY: Lazy<Script> = lua!(many "acquire.lua");
pub(crate) static CLAIM_MANY: Lazy<Script> = lua!(many "claim.lua");
pub(crate) static COMMIT_MANY: Lazy<Script> = lua!(many "commit.lua");
pub(crate) static RELEASE_MANY: Lazy<Script> = lua!(many "release.lua");

/// The scripts of every call's path, the fence read's, a failure's and the batches', loaded when
/// the store connects (`forget`, `inspect` and `resolve`, an operator's, are loaded on first
/// use).
pub(crate) fn all() -> [&'static Script; 11] {
    [
        &ACQUIRE,
        &RENEW,
        &COMMIT,
        &RELEASE,
        &FENCE,
        &FAIL,
        &ACQUIRE_MANY,
        &CLAIM_MANY,
        &COMMIT_MANY,
        &RELEASE_MANY,
        &FAIL_MANY,
    ]
}

/// Runs `script` on `client`: EVALSHA, then EVAL if the server does not know the script.
/// `args` builds the keys and arguments, a second time only on that fallback (so the common
/// path copies nothing).
pub(crate) async fn run(
    client: &Client,
    script: &Script,
    args: impl Fn() -> (Vec<Key>, Vec<Value>),
) -> Result<Value, Error> {
    // fred's command futures are about 7 KB: boxed here (built in the box, not moved into it),
    // the layers above (timeout, store method, boxed trait future) carry a pointer instead of
    // copying them at each level.
    let (keys, values) = args();
    match boxed_in_place(|| client.evalsha::<Value, _, _, _>(script.sha1().clone(), keys, values)).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            let lua = script.lua().cloned().unwrap_or_default();
            let (keys, values) = args();
            boxed_in_place(|| client.eval::<Value, _, _, _>(lua, keys, values)).await
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lib_goes_at_the_marker_or_first() {
        assert_eq!(with_lib("a\n-- @lib\nb\n"), format!("a\n{LIB}b\n"));
        assert_eq!(with_lib("b\n"), format!("{LIB}b\n"));
        let commit = COMMIT.lua().unwrap();
        assert!(commit.find("redis.pcall('GET', KEYS[1])").unwrap() < commit.find("local function load").unwrap());
    }
}
