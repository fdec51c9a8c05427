//! The global runtime: a call before `init` is `Error::NotConfigured` naming the key, never a
//! panic; after `init`, calls go through it. (Its own test binary: the global is per process.)

use std::time::Duration;

use idempotency::{global, init, Call, Error, Idempotency, MemoryStore};

#[tokio::test]
async fn calls_before_init_fail_cleanly_then_work() {
    assert!(global().get().is_none());
    let before: Result<u8, Error> = global().run(Call::new("early").scope("boot"), || async { Ok(1) }).await;
    match before {
        Err(e @ Error::NotConfigured { .. }) => assert_eq!(e.key(), "boot:early"),
        other => panic!("expected NotConfigured, got {other:?}"),
    }
    assert!(matches!(global().issue_token(Duration::from_secs(1)), Err(Error::NotConfigured { .. })));

    init(Idempotency::new(MemoryStore::new())).expect("first init");
    assert!(init(Idempotency::new(MemoryStore::new())).is_err(), "a second init must be refused");
    let first: Result<u8, Error> = global().run(Call::new("early").scope("boot"), || async { Ok(2) }).await;
    let again: Result<u8, Error> = global().run(Call::new("early").scope("boot"), || async { Ok(3) }).await;
    assert_eq!((first.unwrap(), again.unwrap()), (2, 2));
    let token = global().issue_token(Duration::from_secs(5)).unwrap();
    let used: Result<u8, Error> = global().run(Call::token(&token), || async { Ok(4) }).await;
    assert_eq!(used.unwrap(), 4);
}
