//! The attribute's arguments, parsed with `syn`: every malformed one is an error spanned on the
//! offending token.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{parenthesized, Expr, Ident, LitBool, LitStr, Path, Token};

use crate::duration::parse_duration;

/// The arguments every attribute may take, for the "unknown argument" message.
const KNOWN: &str = "key, mode, ttl, keep, on_duplicate, on_conflict, on_cancel, on_error, on_crash, \
                     fingerprint, scope, abort_on_lease_lost, store, tx, crate";

/// Parameter or token mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Param,
    Token,
}

/// `on_conflict = reject | wait("5s")`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OnConflict {
    Reject,
    Wait(Duration),
}

/// The parsed `#[idempotent(...)]` arguments; `None` where the attribute says nothing.
#[derive(Default)]
pub(crate) struct Args {
    pub key: Option<LitStr>,
    /// The mode and the token that set it.
    pub mode: Option<(Mode, Ident)>,
    pub ttl: Option<Duration>,
    pub keep: Option<Duration>,
    /// `true` for `reject`.
    pub reject_duplicates: Option<bool>,
    pub on_conflict: Option<OnConflict>,
    /// An expression of the arguments: `amount`, `ev.amount_cents`, `(cb.amount, cb.currency)`.
    pub fingerprint: Option<Expr>,
    pub scope: Option<LitStr>,
    pub abort_on_lease_lost: Option<bool>,
    /// `on_cancel = finish` (the token that said it): a dropped call runs to its end.
    pub finish_on_cancel: Option<Ident>,
    /// `on_error = store` (the token that said it): the body's `Err` is stored and replayed.
    pub store_errors: Option<Ident>,
    /// `on_error = give_up_after(N)` (the token that said it, and N).
    pub give_up_after: Option<(Ident, u32)>,
    /// `on_crash = hold` (the token that said it): a holder that stops without a word leaves
    /// the key unknown.
    pub hold_on_crash: Option<Ident>,
    pub store: Option<Expr>,
    /// `tx = <PgStore>`: the body runs in a transaction of that store.
    pub tx: Option<Expr>,
    pub krate: Option<Path>,
    /// Every argument name given, for the "given twice" check.
    seen: Vec<String>,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let name = if input.peek(Token![crate]) {
                let token: Token![crate] = input.parse()?;
                Ident::new("crate", token.span)
            } else {
                Ident::parse_any(input)?
            };
            let text = name.to_string();
            if args.seen.contains(&text) {
                return Err(syn::Error::new(name.span(), format!("`{text}` is given twice")));
            }
            args.seen.push(text.clone());
            match text.as_str() {
                "key" => args.key = Some(value(input, &name)?),
                "mode" => {
                    let mode: Ident = value(input, &name)?;
                    args.mode = Some(match mode.to_string().as_str() {
                        "Param" => (Mode::Param, mode),
                        "Token" => (Mode::Token, mode),
                        _ => return Err(syn::Error::new(mode.span(), "expected `Param` or `Token`")),
                    });
                }
                "ttl" => args.ttl = Some(lease(input, &name)?),
                "keep" => args.keep = Some(duration(input, &name)?),
                "on_duplicate" => {
                    let policy: Ident = value(input, &name)?;
                    args.reject_duplicates = Some(match policy.to_string().as_str() {
                        "replay" => false,
                        "reject" => true,
                        _ => return Err(syn::Error::new(policy.span(), "expected `replay` or `reject`")),
                    });
                }
                "on_conflict" => {
                    let policy: Ident = value(input, &name)?;
                    args.on_conflict = Some(match policy.to_string().as_str() {
                        "reject" => OnConflict::Reject,
                        "wait" if input.peek(syn::token::Paren) => {
                            let inner;
                            parenthesized!(inner in input);
                            let patience = duration_value(&inner)?;
                            if !inner.is_empty() {
                                return Err(inner.error("expected one duration: `wait(\"5s\")`"));
                            }
                            OnConflict::Wait(patience)
                        }
                        "wait" => {
                            return Err(syn::Error::new(policy.span(), "`wait` needs a duration: `wait(\"5s\")`"))
                        }
                        _ => return Err(syn::Error::new(policy.span(), "expected `reject` or `wait(\"5s\")`")),
                    });
                }
                "fingerprint" => {
                    let payload: Expr = value(input, &name).map_err(|e| {
                        syn::Error::new(
                            e.span(),
                            "expected an expression of the arguments: `amount`, `ev.amount_cents` or a tuple `(a, b.c)`",
                        )
                    })?;
                    if matches!(&payload, Expr::Tuple(t) if t.elems.is_empty()) {
                        return Err(syn::Error::new_spanned(&payload, "name at least one argument"));
                    }
                    args.fingerprint = Some(payload);
                }
                "scope" => {
                    let scope: LitStr = value(input, &name)?;
                    if scope.value().is_empty() {
                        return Err(syn::Error::new(scope.span(), "the scope is empty"));
                    }
                    args.scope = Some(scope);
                }
                "abort_on_lease_lost" => {
                    args.abort_on_lease_lost =
                        Some(if input.peek(Token![=]) { value::<LitBool>(input, &name)?.value } else { true });
                }
                "on_cancel" => {
                    let policy: Ident = value(input, &name)?;
                    match policy.to_string().as_str() {
                        "release" => {}
                        "finish" => args.finish_on_cancel = Some(policy),
                        _ => return Err(syn::Error::new(policy.span(), "expected `release` or `finish`")),
                    }
                }
                "on_error" => {
                    let policy: Ident = value(input, &name)?;
                    match policy.to_string().as_str() {
                        "release" => {}
                        "store" => args.store_errors = Some(policy),
                        "give_up_after" => {
                            let attempts = give_up_after(input, &policy)?;
                            args.give_up_after = Some((policy, attempts));
                        }
                        _ => {
                            return Err(syn::Error::new(
                                policy.span(),
                                "expected `release`, `store` or `give_up_after(N)`",
                            ))
                        }
                    }
                }
                "on_crash" => {
                    let policy: Ident = value(input, &name)?;
                    match policy.to_string().as_str() {
                        "rerun" => {}
                        "hold" => args.hold_on_crash = Some(policy),
                        _ => return Err(syn::Error::new(policy.span(), "expected `rerun` or `hold`")),
                    }
                }
                "store" => args.store = Some(value(input, &name)?),
                "tx" => args.tx = Some(value(input, &name)?),
                "crate" => args.krate = Some(value(input, &name)?),
                _ => {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("unknown argument `{text}`; expected one of: {KNOWN}"),
                    ))
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// `(N)` after `give_up_after`: the attempts, 1 to 1000 (the runtime's `MAX_ATTEMPTS`).
fn give_up_after(input: ParseStream, policy: &Ident) -> syn::Result<u32> {
    if !input.peek(syn::token::Paren) {
        return Err(syn::Error::new(policy.span(), "`give_up_after` needs the attempts: `give_up_after(3)`"));
    }
    let inside;
    parenthesized!(inside in input);
    let n: syn::LitInt = inside.parse()?;
    match n.base10_parse::<u32>() {
        Ok(attempts @ 1..=1000) if inside.is_empty() => Ok(attempts),
        _ => Err(syn::Error::new(n.span(), "expected the attempts: a whole number from 1 to 1000")),
    }
}

/// `= value` after an argument's name.
fn value<T: Parse>(input: ParseStream, name: &Ident) -> syn::Result<T> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(name.span(), format!("`{name}` needs a value: `{name} = ...`")));
    }
    input.parse::<Token![=]>()?;
    input.parse()
}

/// The shortest lease the runtime accepts (`idempotency::MIN_LEASE`); a shorter `ttl` would only
/// fail at run time with `Error::InvalidCall`, so it is refused here.
const MIN_LEASE: Duration = Duration::from_millis(10);

/// `ttl = ...`: a duration of at least `MIN_LEASE`.
fn lease(input: ParseStream, name: &Ident) -> syn::Result<Duration> {
    // Where the value is, for the error: the token after `=`.
    let fork = input.fork();
    let span = fork.parse::<Token![=]>().and_then(|_| fork.parse::<proc_macro2::TokenTree>()).map(|t| t.span());
    let ttl = duration(input, name)?;
    if ttl < MIN_LEASE {
        return Err(syn::Error::new(
            span.unwrap_or_else(|_| name.span()),
            format!("`ttl` is the lease and must be at least {MIN_LEASE:?}: the watchdog renews it every ttl/3"),
        ));
    }
    Ok(ttl)
}

/// `= "30s"` or `= 30` after an argument's name.
fn duration(input: ParseStream, name: &Ident) -> syn::Result<Duration> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(name.span(), format!("`{name}` needs a value: `{name} = \"30s\"`")));
    }
    input.parse::<Token![=]>()?;
    duration_value(input)
}

/// A duration written `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`, or an integer of seconds,
/// parsed by the runtime's own parser.
fn duration_value(input: ParseStream) -> syn::Result<Duration> {
    let (text, span): (String, Span) = if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        (lit.value(), lit.span())
    } else if input.peek(syn::LitInt) {
        let lit: syn::LitInt = input.parse()?;
        if !lit.suffix().is_empty() {
            return Err(syn::Error::new(lit.span(), "write seconds as a plain integer (`30`) or a string (`\"30s\"`)"));
        }
        (lit.base10_digits().to_owned(), lit.span())
    } else {
        let found: proc_macro2::TokenTree = input.parse()?;
        return Err(syn::Error::new(
            found.span(),
            "expected a duration: \"500ms\", \"30s\", \"5m\", \"24h\", \"7d\" or 30",
        ));
    };
    parse_duration(&text).map_err(|message| syn::Error::new(span, message))
}
