//! The function shapes the attribute accepts: methods on `&self` and `&mut self`, generic
//! functions, a result type alias, `?` and early `return` in the body, inner attributes, a
//! `Box<dyn Error>` error type, a trait impl, and a function written by `macro_rules!`.

use std::fmt::Display;

use idempotency::{idempotent, Idempotency, MemoryStore};
use serde::de::DeserializeOwned;
use serde::Serialize;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

struct Service {
    idem: Idempotency,
    name: &'static str,
    calls: u32,
}

impl Service {
    #[idempotent(key = "{self.name}:{n}", store = self.idem)]
    pub async fn parse(&self, n: &str) -> Res<u32> {
        #![allow(clippy::needless_question_mark)]
        let n: u32 = n.parse()?;
        if n == 0 {
            return Err("zero".into());
        }
        Ok(n)
    }

    #[idempotent(key = "{self.name}:{n}", store = self.idem.clone())]
    async fn count(&mut self, n: u32) -> Result<u32, BoxError> {
        self.calls += n;
        Ok(self.calls)
    }
}

#[idempotent(key = "{value}", store = idem)]
async fn generic<T: Display + Serialize + DeserializeOwned + Send>(idem: &Idempotency, value: T) -> Res<Vec<T>>
where
    T: Clone,
{
    Ok(vec![value.clone(), value])
}

trait Job {
    async fn run(&self, id: u64) -> Res<u64>;
}

impl Job for Service {
    #[idempotent(key = "job:{id}", store = self.idem)]
    async fn run(&self, id: u64) -> Res<u64> {
        Ok(id * 2)
    }
}

macro_rules! guarded {
    ($name:ident -> $ret:ty) => {
        #[idempotent(key = "{n}", store = idem)]
        async fn $name(idem: &Idempotency, n: u8) -> $ret {
            Ok(n)
        }
    };
}

guarded!(from_macro -> Res<u8>);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut service = Service { idem: Idempotency::new(MemoryStore::new()), name: "svc", calls: 0 };
    assert_eq!(service.parse("7").await.unwrap(), 7);
    assert!(service.parse("0").await.is_err());
    assert!(service.parse("x").await.is_err());
    assert_eq!(service.count(2).await.unwrap(), 2);
    assert_eq!(service.count(2).await.unwrap(), 2);
    assert_eq!(generic(&service.idem, 'a').await.unwrap(), ['a', 'a']);
    assert_eq!(service.run(21).await.unwrap(), 42);
    assert_eq!(from_macro(&service.idem, 4).await.unwrap(), 4);
}
