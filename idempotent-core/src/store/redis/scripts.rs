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

/// Runs `script` on `client`: EVALSHA, then EVAL if the server does not know the script.
pub(crate) async fn run(client: &Client, script: &Script, keys: Vec<Key>, args: Vec<Value>) -> Result<Value, Error> {
    match client.evalsha::<Value, _, _, _>(script.sha1().clone(), keys.clone(), args.clone()).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            let lua = script.lua().cloned().unwrap_or_default();
            client.eval::<Value, _, _, _>(lua, keys, args).await
        }
        other => other,
    }
}
