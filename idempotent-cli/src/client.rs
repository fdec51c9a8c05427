//! A client's keys of the HTTP layer, addressed by what the operator knows: the layer keeps a
//! client's keys under `http:key:<length>:<client id>:`, where the client id of a credential is
//! its hash (`idempotent_core::client_key`), which nobody can type. `--client-header 'NAME:
//! VALUE'` or `--client ID` turns the keys and the `--prefix` given into those full keys.

use idempotent_core::client_key::{client_of_credential, client_scope};

use crate::args::{ClientArgs, Command};
use crate::failure::{Failure, EXIT_USAGE};

/// Rewrites the keys and prefixes of `command` into the full keys of the client its options
/// name; leaves them as they are without such options.
pub fn resolve(command: &mut Command) -> Result<(), Failure> {
    match command {
        Command::Inspect(a) => {
            if let Some(scope) = scope(&a.client)? {
                a.key = format!("{scope}:{}", a.key);
            }
        }
        Command::Resolve(a) => {
            if let Some(scope) = scope(&a.client)? {
                a.key = format!("{scope}:{}", a.key);
            }
        }
        Command::List(a) => {
            if let Some(scope) = scope(&a.client)? {
                a.filter.prefix = Some(format!("{scope}:{}", a.filter.prefix.as_deref().unwrap_or("")));
            }
        }
        Command::Purge(a) => {
            if let Some(scope) = scope(&a.client)? {
                a.keys.iter_mut().for_each(|k| *k = format!("{scope}:{k}"));
                if let Some(prefix) = &mut a.filter.prefix {
                    *prefix = format!("{scope}:{prefix}");
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// The scope of the client `args` name, if they name one.
fn scope(args: &ClientArgs) -> Result<Option<String>, Failure> {
    let client = match (&args.client_header, &args.client) {
        (Some(header), _) => {
            let Some((name, value)) = header.split_once(':') else {
                return Err(Failure::new(
                    EXIT_USAGE,
                    format!("--client-header {header:?}: write it as the client sends it, 'NAME: VALUE'"),
                ));
            };
            // As HTTP reads a field: the whitespace around the value is not part of it.
            let value = value.trim_matches(|c| c == ' ' || c == '\t');
            match client_of_credential(value.as_bytes()) {
                Some(client) => client,
                None => {
                    return Err(Failure::new(
                        EXIT_USAGE,
                        format!("--client-header: the {} value is empty: the layer refuses such a client", name.trim()),
                    ))
                }
            }
        }
        (None, Some(id)) => id.clone(),
        (None, None) => return Ok(None),
    };
    let kind = if args.token { "token" } else { "key" };
    Ok(Some(client_scope(&args.http_scope, kind, &client)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(header: Option<&str>, client: Option<&str>) -> ClientArgs {
        ClientArgs {
            client_header: header.map(str::to_owned),
            client: client.map(str::to_owned),
            http_scope: "http".into(),
            token: false,
        }
    }

    #[test]
    fn a_header_is_hashed_as_the_layer_hashes_it() {
        let hash = client_of_credential(b"Bearer alice-secret").unwrap();
        let want = format!("http:key:32:{hash}");
        assert_eq!(scope(&args(Some("Authorization: Bearer alice-secret"), None)).unwrap(), Some(want.clone()));
        assert_eq!(scope(&args(Some("authorization:\tBearer alice-secret "), None)).unwrap(), Some(want));
        assert_eq!(scope(&args(None, Some("u-42"))).unwrap().as_deref(), Some("http:key:4:u-42"));
        assert_eq!(scope(&args(None, None)).unwrap(), None);
        for bad in ["Bearer x", "Authorization:  "] {
            assert_eq!(scope(&args(Some(bad), None)).unwrap_err().code, EXIT_USAGE, "{bad}");
        }
    }
}
