//! The rewrite: checks the function against its arguments, then replaces its body with a call
//! of the runtime's public API (`Call` built from the arguments, then `<store>.run(call, body)`).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{AttrStyle, Expr, FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Type};

use crate::args::{Args, Mode, OnConflict};
use crate::template::{self, Piece};

/// Expands `#[idempotent(args)] item`. On any error, the function is emitted unchanged beside
/// the errors, so that the rest of the crate (and the IDE) still sees it.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let message = format!("`#[idempotent]` goes on an `async fn` with a body: {e}");
            let errors = syn::Error::new(e.span(), message).to_compile_error();
            return quote!(#errors #item);
        }
    };
    let args = syn::parse2::<Args>(args);
    match args.and_then(|args| rewrite(&args, &function)) {
        Ok(tokens) => tokens,
        Err(e) => {
            let errors = e.to_compile_error();
            quote!(#errors #function)
        }
    }
}

/// The rewritten function, or every error found.
fn rewrite(args: &Args, function: &ItemFn) -> syn::Result<TokenStream> {
    let sig = &function.sig;
    let mut errors: Vec<syn::Error> = Vec::new();

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "`#[idempotent]` needs an `async fn`: the guarded body is awaited under a lease",
        ));
    }
    // A path may be `Result` or an alias of it: the trait bound of `check_return` decides. A
    // tuple, reference, `impl Trait`... cannot be.
    let return_type = match &sig.output {
        ReturnType::Type(_, ty) if matches!(**ty, Type::Path(_) | Type::Group(_) | Type::Paren(_) | Type::Macro(_)) => {
            Some(&**ty)
        }
        ReturnType::Type(_, ty) => {
            errors.push(syn::Error::new(ty.span(), return_type_message()));
            None
        }
        ReturnType::Default => {
            errors.push(syn::Error::new(sig.paren_token.span.close(), return_type_message()));
            None
        }
    };

    // `tx = store`: the parameter the body's transaction comes in, which the caller no longer
    // passes.
    let transaction = match &args.tx {
        Some(store) => {
            let found = transaction_parameter(sig);
            if found.is_none() {
                errors.push(syn::Error::new(
                    store.span(),
                    "`tx = ...` hands the body a transaction of that `PgStore`: the function needs a parameter for it, \
                     `tx: &mut PgTransaction` (any name), which its callers then do not pass",
                ));
            }
            found
        }
        None => None,
    };

    // The names a template or fingerprint may use: every binding of the arguments' patterns
    // (`req` in `Json(req): Json<Req>`, as in `req: Req`), the transaction's aside.
    let has_self = sig.receiver().is_some();
    let mut arguments: Vec<&Ident> = Vec::new();
    for (i, arg) in sig.inputs.iter().enumerate() {
        if let FnArg::Typed(typed) = arg {
            if transaction.as_ref().is_none_or(|(at, _, _)| *at != i) {
                bindings(&typed.pat, &mut arguments);
            }
        }
    }
    let known = || {
        let mut names: Vec<String> = arguments.iter().map(|a| a.to_string()).collect();
        if has_self {
            names.insert(0, "self".into());
        }
        if names.is_empty() {
            format!("`{}` takes no arguments", sig.ident)
        } else {
            format!("the arguments of `{}` are: {}", sig.ident, names.join(", "))
        }
    };

    let mode = args.mode.as_ref().map_or(Mode::Param, |(m, _)| *m);
    let key_private = match &args.krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::idempotency::__private),
    };
    let key = match (&args.key, &args.mode) {
        (Some(key), _) => match key_expression(key, &arguments, has_self, &known, &key_private) {
            Ok(tokens) => Some(tokens),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        (None, Some((Mode::Token, token))) => {
            errors.push(syn::Error::new(
                token.span(),
                "token mode needs a `key` naming the argument that carries the token: `key = \"{token}\"`",
            ));
            None
        }
        (None, _) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "`#[idempotent]` needs a `key`: a template of the arguments, like `key = \"order:{order.id}\"`",
            ));
            None
        }
    };
    if let Some(payload) = &args.fingerprint {
        for name in roots(payload) {
            let is_self = name == "self";
            if (is_self && !has_self) || (!is_self && !arguments.contains(&name)) {
                errors.push(syn::Error::new(
                    name.span(),
                    format!("`fingerprint` names `{name}`, which is not an argument; {}", known()),
                ));
            }
        }
    }

    if let Some(first) = errors.into_iter().reduce(|mut all, e| {
        all.combine(e);
        all
    }) {
        return Err(first);
    }
    let (Some(key), Some(return_type)) = (key, return_type) else {
        unreachable!("every missing piece pushed an error")
    };

    // What the runtime checks (the return type's bounds) is reported on the return type.
    let ret = return_type.span();
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote_spanned!(ret=> ::idempotency),
    };
    let private = quote!(#krate::__private);

    let constructor = match mode {
        Mode::Param => quote!(#private::Call::from_template(#key, #private::Mode::Param)),
        Mode::Token => quote!(#private::Call::from_template(#key, #private::Mode::Token)),
    };
    let mut setters = TokenStream::new();
    match (&args.scope, mode) {
        (Some(scope), _) => setters.extend(quote!(.scope(#scope))),
        (None, Mode::Param) => {
            let name = format!("::{}", syn::ext::IdentExt::unraw(&sig.ident));
            setters.extend(quote!(.scope(::core::concat!(::core::module_path!(), #name))));
        }
        (None, Mode::Token) => {}
    }
    if let Some(ttl) = args.ttl {
        let ms = millis(ttl);
        setters.extend(quote!(.ttl(::core::time::Duration::from_millis(#ms))));
    }
    if let Some(keep) = args.keep {
        let ms = millis(keep);
        setters.extend(quote!(.keep(::core::time::Duration::from_millis(#ms))));
    }
    if let Some(reject) = args.reject_duplicates {
        let policy = if reject { quote!(Reject) } else { quote!(Replay) };
        setters.extend(quote!(.on_duplicate(#private::OnDuplicate::#policy)));
    }
    match args.on_conflict {
        Some(OnConflict::Reject) => setters.extend(quote!(.on_conflict(#private::OnConflict::Reject))),
        Some(OnConflict::Wait(patience)) => {
            let ms = millis(patience);
            setters.extend(quote!(.on_conflict(#private::OnConflict::Wait(::core::time::Duration::from_millis(#ms)))));
        }
        None => {}
    }
    if let Some(payload) = &args.fingerprint {
        // A tuple is fingerprinted as a tuple of references: nothing is moved or cloned.
        let payload = match payload {
            Expr::Tuple(tuple) => {
                let elems = tuple.elems.iter();
                quote_spanned!(tuple.span()=> &(#(&#elems),*))
            }
            one => quote_spanned!(one.span()=> &#one),
        };
        setters.extend(quote!(.fingerprint(#payload)));
    }
    if let Some(abort) = args.abort_on_lease_lost {
        setters.extend(quote!(.abort_on_lease_lost(#abort)));
    }
    if args.hold_on_crash.is_some() {
        setters.extend(quote!(.on_crash(#private::OnCrash::Hold)));
    }

    // The call of `run` is spanned on the return type too: the bounds it checks (`T: Serialize`,
    // `E: From<Error>`) are about the return type.
    let store = match &args.store {
        Some(expr) => quote_spanned!(ret=> (#expr)),
        None => quote_spanned!(ret=> #private::global()),
    };
    let check = match (&args.store_errors, &args.give_up_after) {
        (Some(_), _) => quote_spanned!(ret=> #private::check_return_keeping_errors::<#return_type>();),
        (None, Some(_)) => quote_spanned!(ret=> #private::check_return_giving_up::<#return_type>();),
        (None, None) => quote_spanned!(ret=> #private::check_return::<#return_type>();),
    };
    let block = &function.block;
    if let (Some(_), Some(finish)) = (&args.tx, &args.finish_on_cancel) {
        return Err(syn::Error::new(
            finish.span(),
            "`on_cancel = finish` does not go with `tx`: the transaction is the caller's, and a dropped call rolls it back",
        ));
    }
    if let (Some(_), Some(store)) = (&args.tx, &args.store_errors) {
        return Err(syn::Error::new(
            store.span(),
            "`on_error = store` does not go with `tx`: a body that fails rolls its transaction back, and its error with it",
        ));
    }
    if let Some((policy, _)) = &args.give_up_after {
        let with = if args.tx.is_some() {
            Some("`tx` in this version: the count is kept with the error's text, which a body in a transaction does not hand over")
        } else if args.finish_on_cancel.is_some() {
            Some("`on_cancel = finish` in this version: the count is kept with the error's text, which a body moved to a task of its own does not hand over")
        } else {
            None
        };
        if let Some(with) = with {
            return Err(syn::Error::new(
                policy.span(),
                format!("`on_error = give_up_after(..)` does not go with {with}"),
            ));
        }
    }
    // `on_error = store`: the body's `Result` is the value stored; the runtime's own refusals
    // stay outside it, and the two are one `Result` again for the caller.
    let (block, kept) = match &args.store_errors {
        Some(_) => (
            quote_spanned!(ret=> { ::core::result::Result::Ok(async move #block.await) }),
            quote_spanned!(ret=> .and_then(|__idem_kept| __idem_kept)),
        ),
        None => (quote!(#block), quote!()),
    };
    let run = match (&args.tx, &transaction) {
        (Some(pg), Some((_, tx, ty))) => {
            // The transaction is owned by the body's future and lent to the function's block as
            // `tx`, then handed back to be committed with the record: the block may borrow
            // whatever the function's arguments borrow.
            let runtime = match &args.store {
                Some(expr) => quote_spanned!(ret=> &(#expr)),
                None => quote_spanned!(ret=> &#private::global()),
            };
            quote_spanned! {ret=>
                #private::run_in_transaction(
                    &(#pg),
                    #private::Runtime::runtime(#runtime),
                    __idem_call,
                    move |mut __idem_tx: #private::PgTransaction| async move {
                        let __idem_out = {
                            // As the function declares it (the user's import stays used).
                            let #tx: #ty = &mut __idem_tx;
                            async move #block.await
                        };
                        __idem_out.map(|__idem_value| (__idem_value, __idem_tx))
                    },
                )
                .await
            }
        }
        // `on_cancel = finish`: the body moves to a task of its own (its arguments must be
        // `Send + 'static`), so that a dropped call runs to its end.
        _ if args.finish_on_cancel.is_some() => {
            quote_spanned!(ret=> #store.run_to_completion(__idem_call, move || async move #block).await #kept)
        }
        _ if args.give_up_after.is_some() => {
            let attempts = args.give_up_after.as_ref().map_or(1, |(_, n)| *n);
            quote_spanned!(ret=> #store.run_giving_up(__idem_call, #attempts, move || async move #block).await)
        }
        _ => quote_spanned!(ret=> #store.run(__idem_call, move || async move #block).await #kept),
    };

    let ItemFn { attrs, vis, sig, .. } = function;
    let mut sig = sig.clone();
    if let Some((at, _, _)) = transaction {
        sig.inputs = sig.inputs.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, a)| a.clone()).collect();
    }
    let outer = attrs.iter().filter(|a| matches!(a.style, AttrStyle::Outer));
    let inner = attrs.iter().filter(|a| matches!(a.style, AttrStyle::Inner(_)));
    let body = quote_spanned! {ret=> {
        #(#inner)*
        #check
        // A key that could not be built is the runtime's to refuse (recorded like every refused
        // call), not returned from here.
        let __idem_call = #constructor #setters;
        #run
    }};
    Ok(quote! {
        #(#outer)*
        #vis #sig #body
    })
}

/// The parameter `name: &mut PgTransaction` (the type's last path segment is what is checked,
/// so `&mut idempotency::store::postgres::PgTransaction` is one too): its place, name and type.
fn transaction_parameter(sig: &syn::Signature) -> Option<(usize, Ident, Type)> {
    sig.inputs.iter().enumerate().find_map(|(i, arg)| {
        let FnArg::Typed(typed) = arg else { return None };
        let Type::Reference(reference) = &*typed.ty else { return None };
        let Type::Path(path) = &*reference.elem else { return None };
        let is_transaction =
            reference.mutability.is_some() && path.path.segments.last().is_some_and(|s| s.ident == "PgTransaction");
        match &*typed.pat {
            Pat::Ident(name) if is_transaction => Some((i, name.ident.clone(), (*typed.ty).clone())),
            _ => None,
        }
    })
}

/// The names `pat` binds: `x` in `x`, `Json(x)`, `State(App { db: x, .. })`, `(a, b)`, `&x`.
fn bindings<'a>(pat: &'a Pat, out: &mut Vec<&'a Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(&p.ident);
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Reference(r) => bindings(&r.pat, out),
        Pat::Slice(s) => s.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(t) => bindings(&t.pat, out),
        _ => {}
    }
}

/// The names a fingerprint expression starts from: `ev` in `ev.amount_cents`, `a` and `b` in
/// `(a, b.c)`, `req` in `req.total()`. Other forms are left to the compiler.
fn roots(expr: &Expr) -> Vec<&Ident> {
    match expr {
        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => vec![&p.path.segments[0].ident],
        Expr::Field(f) => roots(&f.base),
        Expr::MethodCall(m) => roots(&m.receiver),
        Expr::Index(i) => roots(&i.expr),
        Expr::Reference(r) => roots(&r.expr),
        Expr::Paren(p) => roots(&p.expr),
        Expr::Tuple(t) => t.elems.iter().flat_map(roots).collect(),
        _ => Vec::new(),
    }
}

/// What an `#[idempotent]` function must return.
fn return_type_message() -> &'static str {
    "an `#[idempotent]` function must return `Result<T, E>`, with `T: Serialize + DeserializeOwned` \
     (the stored, replayed value) and `E: From<idempotency::Error>`"
}

/// A duration as a `u64` literal of milliseconds (the parser caps durations at `u64::MAX` ms).
fn millis(d: std::time::Duration) -> proc_macro2::Literal {
    proc_macro2::Literal::u64_suffixed(d.as_millis() as u64)
}

/// The key's builder: `KeyBuilder::new(template, reserved).text("pay:").value("cb.provider",
/// &cb.provider)...`, handed to `Call::from_template`, every name checked against the function's arguments, and the template checked
/// for what the escaping of values needs (literal text between two values, not starting with
/// `%`). Errors and values are spanned on the template literal.
fn key_expression(
    key: &LitStr,
    arguments: &[&Ident],
    has_self: bool,
    known: &dyn Fn() -> String,
    private: &TokenStream,
) -> syn::Result<TokenStream> {
    let span = key.span();
    let template = key.value();
    let pieces = template::parse(&template).map_err(|message| syn::Error::new(span, message))?;
    if pieces.is_empty() {
        return Err(syn::Error::new(span, "the key template is empty"));
    }
    // A constant key: its text alone (nothing to escape, nothing that can be empty).
    if let [Piece::Text(text)] = pieces.as_slice() {
        let text = LitStr::new(text, span);
        return Ok(quote_spanned!(span=> #private::KeyBuilder::new(#text, "").text(#text)));
    }
    // What a value must escape besides `%`: the first character of the text after each value
    // that another value follows. A reader then finds where each value ends (at the first such
    // character that is not escaped) and the whole key reads back one way only.
    let mut reserved = String::new();
    for (i, piece) in pieces.iter().enumerate() {
        let (Some(Piece::Field { .. }), Piece::Text(text), Some(Piece::Field { path, .. })) =
            (i.checked_sub(1).and_then(|p| pieces.get(p)), piece, pieces.get(i + 1))
        else {
            continue;
        };
        let first = text.chars().next().expect("text pieces are not empty");
        if first == '%' {
            return Err(syn::Error::new(
                span,
                format!(
                    "the text before `{{{}}}` may not start with `%`: values are escaped with `%`, so a key \
                     could read back two ways",
                    path.join(".")
                ),
            ));
        }
        if !reserved.contains(first) {
            reserved.push(first);
        }
    }
    let mut steps = Vec::new();
    let mut after_value = false;
    for piece in &pieces {
        match piece {
            Piece::Text(text) => {
                steps.push(quote_spanned!(span=> .text(#text)));
                after_value = false;
            }
            Piece::Field { path, may_be_empty } => {
                let shown = path.join(".");
                if after_value {
                    return Err(syn::Error::new(
                        span,
                        format!(
                            "`{{{shown}}}` follows another placeholder directly: put literal text between them \
                             (`{{a}}:{{b}}`), or two different pairs of values could make one key"
                        ),
                    ));
                }
                after_value = true;
                let root = &path[0];
                let value = if root == "self" {
                    if !has_self {
                        return Err(syn::Error::new(
                            span,
                            format!("`{{{shown}}}`: there is no `self` here; {}", known()),
                        ));
                    }
                    quote_spanned!(span=> self)
                } else if arguments.iter().any(|a| a == &root) {
                    Ident::new(root, span).into_token_stream()
                } else {
                    return Err(syn::Error::new(
                        span,
                        format!("`{{{shown}}}`: `{root}` is not an argument; {}", known()),
                    ));
                };
                let fields = path[1..].iter().map(|field| match field.parse::<u32>() {
                    Ok(index) => syn::Member::Unnamed(syn::Index { index, span }),
                    Err(_) => syn::Member::Named(Ident::new(field, span)),
                });
                let value = quote_spanned!(span=> &#value #(.#fields)*);
                steps.push(if *may_be_empty {
                    quote_spanned!(span=> .value_may_be_empty(#value))
                } else {
                    quote_spanned!(span=> .value(#shown, #value))
                });
            }
        }
    }
    let template = LitStr::new(&template, span);
    let reserved = LitStr::new(&reserved, span);
    Ok(quote_spanned!(span=> #private::KeyBuilder::new(#template, #reserved) #(#steps)*))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion is a plain call of the runtime's public API: a key, a `Call` built with
    /// its setters, and `run` on the store. (`cargo test -p idempotent-macros -- --nocapture`
    /// prints it.)
    #[test]
    fn expansion_is_a_plain_call_of_the_runtime() {
        let args = quote!(key = "pay:{cb.provider}:{cb.txn_id}", ttl = "30s", keep = "24h", on_conflict = wait("5s"));
        let item = quote! {
            async fn on_payment_callback(cb: Callback) -> Result<Receipt, AppError> {
                charge(&cb).await
            }
        };
        let out = expand(args, item).to_string();
        println!("{out}");
        let expected = quote! {
            async fn on_payment_callback(cb: Callback) -> Result<Receipt, AppError> {
                ::idempotency::__private::check_return::<Result<Receipt, AppError> >();
                let __idem_call = ::idempotency::__private::Call::from_template(
                    ::idempotency::__private::KeyBuilder::new("pay:{cb.provider}:{cb.txn_id}", ":")
                        .text("pay:")
                        .value("cb.provider", &cb.provider)
                        .text(":")
                        .value("cb.txn_id", &cb.txn_id),
                    ::idempotency::__private::Mode::Param
                )
                    .scope(::core::concat!(::core::module_path!(), "::on_payment_callback"))
                    .ttl(::core::time::Duration::from_millis(30000u64))
                    .keep(::core::time::Duration::from_millis(86400000u64))
                    .on_conflict(::idempotency::__private::OnConflict::Wait(::core::time::Duration::from_millis(5000u64)));
                ::idempotency::__private::global().run(__idem_call, move || async move {
                    charge(&cb).await
                }).await
            }
        };
        assert_eq!(out, expected.to_string());
    }

    #[test]
    fn token_mode_has_no_default_scope_and_escapes_braces() {
        let args = quote!(mode = Token, key = "{{{token}}}", store = self.idem, crate = my::idem);
        let item = quote!(
            async fn submit(&self, token: String) -> Result<u8, E> {
                Ok(1)
            }
        );
        let out = expand(args, item).to_string();
        assert!(out.contains(r#". text ("}") , my :: idem :: __private :: Mode :: Token) ;"#), "{out}");
        assert!(
            out.contains(
                r#"KeyBuilder :: new ("{{{token}}}" , "") . text ("{") . value ("token" , & token) . text ("}")"#
            ),
            "{out}"
        );
        assert!(out.contains("(self . idem) . run (__idem_call , move || async move"), "{out}");
        let out = expand(
            quote!(key = "{token}", mode = Token),
            quote!(
                async fn f(token: &str) -> R<u8> {
                    Ok(1)
                }
            ),
        );
        assert!(
            out.to_string().contains(r#"KeyBuilder :: new ("{token}" , "") . value ("token" , & token) ,"#),
            "{out}"
        );
        let out = expand(
            quote!(key = "nightly-{{report}}"),
            quote!(
                async fn f() -> R<u8> {
                    Ok(1)
                }
            ),
        );
        assert!(
            out.to_string().contains(r#"KeyBuilder :: new ("nightly-{report}" , "") . text ("nightly-{report}")"#),
            "{out}"
        );
        // Two values with nothing between them could be cut two ways.
        let out = expand(
            quote!(key = "{a}{b}"),
            quote!(
                async fn f(a: u8, b: u8) -> R<u8> {
                    Ok(1)
                }
            ),
        )
        .to_string();
        assert!(out.contains("follows another placeholder directly"), "{out}");
        let out = expand(
            quote!(key = "{a}%{b}"),
            quote!(
                async fn f(a: u8, b: u8) -> R<u8> {
                    Ok(1)
                }
            ),
        )
        .to_string();
        assert!(out.contains("may not start with `%`"), "{out}");
    }

    #[test]
    fn errors_keep_the_function() {
        let item = quote!(
            async fn f(a: u8) -> Result<u8, E> {
                Ok(a)
            }
        );
        let out = expand(quote!(key = "{b}", ttl = "soon"), item).to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("async fn f (a : u8) -> Result < u8 , E > { Ok (a) }"), "{out}");
    }
}
