//! Keys built from templates: distinct argument tuples never make one key, whatever the values
//! hold (separators, braces, `%`, unicode, nothing at all), and an empty value is refused unless
//! the template allows it.

use std::collections::HashMap;
use std::sync::Arc;

mod support;

use idempotency::{idempotent, Call, Error, Idempotency, KeyBuilder, MemoryStore};
use proptest::prelude::*;
use support::AppError;

/// Values made of the characters that could confuse a key: the templates' separators, braces,
/// the escape character itself, its hex digits, unicode, and sometimes nothing.
fn value() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just(':'),
            Just('%'),
            Just('{'),
            Just('}'),
            Just('|'),
            Just('/'),
            Just('-'),
            Just('3'),
            Just('A'),
            Just('a'),
            Just('é'),
            Just('→'),
            Just('😀'),
            Just(' '),
        ],
        0..6,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// The templates below, built as the attribute builds them: `reserved` is the first character
/// of the text after each value that another value follows.
fn keys(a: &str, b: &str, c: &str) -> [String; 4] {
    let build = |builder: KeyBuilder| builder.finish().expect("empty values are allowed here");
    [
        build(
            KeyBuilder::new("pay:{a?}:{b?}", ":").text("pay:").value_may_be_empty(&a).text(":").value_may_be_empty(&b),
        ),
        build(
            KeyBuilder::new("{a?}-{b?}/{c?}", "-/")
                .value_may_be_empty(&a)
                .text("-")
                .value_may_be_empty(&b)
                .text("/")
                .value_may_be_empty(&c),
        ),
        build(
            KeyBuilder::new("x{a?}→y{b?}z", "→")
                .text("x")
                .value_may_be_empty(&a)
                .text("→y")
                .value_may_be_empty(&b)
                .text("z"),
        ),
        build(
            KeyBuilder::new("{{{a?}}}:{b?}%", "}")
                .text("{")
                .value_may_be_empty(&a)
                .text("}:")
                .value_may_be_empty(&b)
                .text("%"),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Over many random tuples, no two distinct ones share a key, for any of the templates.
    #[test]
    fn distinct_tuples_make_distinct_keys(tuples in proptest::collection::vec((value(), value(), value()), 1..64)) {
        let mut seen: [HashMap<String, (String, String, String)>; 4] = Default::default();
        for (a, b, c) in tuples {
            for (template, key) in keys(&a, &b, &c).into_iter().enumerate() {
                // The first and third templates have no `c`: their tuples are (a, b).
                let tuple = if template == 1 { (a.clone(), b.clone(), c.clone()) } else { (a.clone(), b.clone(), String::new()) };
                if let Some(other) = seen[template].insert(key.clone(), tuple.clone()) {
                    prop_assert_eq!(&other, &tuple, "template {}: {:?} and {:?} both make {:?}", template, other, tuple, key);
                }
            }
        }
    }
}

#[idempotent(key = "pay:{provider}:{txn_id}", store = idem)]
async fn pay(idem: &Idempotency, provider: &str, txn_id: &str) -> Result<String, AppError> {
    Ok(format!("receipt for {provider} / {txn_id}"))
}

#[idempotent(key = "{token}", mode = Token, store = idem)]
async fn submit(idem: &Idempotency, token: &str) -> Result<u8, AppError> {
    let _ = token;
    Ok(1)
}

#[idempotent(key = "note:{id}:{note?}", store = idem)]
async fn note(idem: &Idempotency, id: u32, note: &str) -> Result<String, AppError> {
    Ok(format!("{id}:{note}"))
}

/// The reproduction: provider `stripe:x` with transaction `y`, then provider `stripe` with
/// transaction `x:y`. Each is its own key: the second runs and gets its own receipt, not the
/// first one's.
#[tokio::test]
async fn a_separator_inside_a_value_does_not_reach_another_key() {
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_shared(store.clone()).build();
    let first = pay(&idem, "stripe:x", "y").await.unwrap();
    let second = pay(&idem, "stripe", "x:y").await.unwrap();
    assert_eq!(first, "receipt for stripe:x / y");
    assert_eq!(second, "receipt for stripe / x:y", "the second caller was replayed the first one's receipt");
    // The record keys are readable: the literal text as written, ordinary values as they are,
    // a separator inside a value escaped.
    assert_eq!(pay(&idem, "stripe", "txn_1").await.unwrap(), "receipt for stripe / txn_1");
    assert!(store.remove("keys::pay:pay:stripe:txn_1"));
    assert!(store.remove("keys::pay:pay:stripe%3Ax:y"));
    assert!(store.remove("keys::pay:pay:stripe:x%3Ay"));
}

/// An empty value is refused with `InvalidKey` naming the placeholder, before anything runs;
/// `{note?}` allows it.
#[tokio::test]
async fn an_empty_value_is_refused_unless_the_template_allows_it() {
    let idem = Idempotency::new(MemoryStore::new());
    match pay(&idem, "stripe", "").await {
        Err(AppError::Idem(Error::InvalidKey { key, reason })) => {
            assert_eq!(key, "pay:{provider}:{txn_id}");
            assert!(reason.contains("`{txn_id}`"), "{reason}");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    // In token mode too: an empty value is not a bad token, it is a key that was not built.
    match submit(&idem, "").await {
        Err(AppError::Idem(Error::InvalidKey { key, reason })) => {
            assert_eq!(key, "{token}");
            assert!(reason.contains("`{token}`"), "{reason}");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    assert_eq!(note(&idem, 1, "").await.unwrap(), "1:");
    assert_eq!(note(&idem, 1, "x").await.unwrap(), "1:x");
    // And by hand: a call on an empty key is refused as it always was.
    let by_hand: Result<u8, Error> = idem.run(Call::new(""), || async { Ok(1) }).await;
    assert!(matches!(by_hand, Err(Error::InvalidKey { .. })));
}
