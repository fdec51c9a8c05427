//! The Lua scripts of `lua/`, each prefixed with `lib.lua`, and how they are sent: EVALSHA,
//! falling back to EVAL on NOSCRIPT (a restarted or failed-over server has an empty script
//! cache; EVAL also caches the script again).

use fred::prelude::*;
use fred::types::scripts::Script;
use once_cell::sync::Lazy;

macro_rules! lua {
    ($file:literal) => {
        Lazy::new(|| {
            Script::from_lua(concat!(
                include_str!("../../../../lua/lib.lua"),
                include_str!(concat!("../../../../lua/", $file))
            ))
        })
    };
}

pub(crate) static ACQUIRE: Lazy<Script> = lua!("acquire.lua");
pub(crate) static RENEW: Lazy<Script> = lua!("renew.lua");
pub(crate) static COMMIT: Lazy<Script> = lua!("commit.lua");
pub(crate) static RELEASE: Lazy<Script> = lua!("release.lua");
pub(crate) static ISSUE: Lazy<Script> = lua!("issue.lua");

/// Every script, for loading them all at once.
pub(crate) fn all() -> [&'static Script; 5] {
    [&ACQUIRE, &RENEW, &COMMIT, &RELEASE, &ISSUE]
}

/// Runs `script` on `client`: EVALSHA, then EVAL if the server does not know the script.
/// `args` builds the keys and arguments, a second time only on that fallback (so the common
/// path copies nothing).
pub(crate) async fn run(
    client: &Client,
    script: &Script,
    args: impl Fn() -> (Vec<Key>, Vec<Value>),
) -> Result<Value, Error> {
    // fred's command futures are about 5 KB: boxed here, the layers above (timeout, store
    // method, boxed trait future) carry a pointer instead of copying them at each level.
    let (keys, values) = args();
    match Box::pin(client.evalsha::<Value, _, _, _>(script.sha1().clone(), keys, values)).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            let lua = script.lua().cloned().unwrap_or_default();
            let (keys, values) = args();
            Box::pin(client.eval::<Value, _, _, _>(lua, keys, values)).await
        }
        other => other,
    }
}
