//! An async function as a test kit [`Subject`]: called with a clone of one input (and of another
//! payload for the same key), its `Ok` compared by its `Debug` form, its `Err` told apart by the
//! library's [`Error`] inside it.

use std::any::Any;
use std::fmt::Debug;
use std::future::Future;

use crate::error::Error;
use crate::testing::scenarios::{Answer, Answering, Ask, Subject};

/// Finds the library's error in a function's own error type.
type FindError<E> = Box<dyn Fn(&E) -> Option<&Error>>;

/// An async function under test; see [`function`].
pub struct Function<I, F, E> {
    call: F,
    same: I,
    other: Option<I>,
    name: String,
    library_error: Option<FindError<E>>,
}

/// The async function `call` as a subject, called with clones of `same` (the request every
/// duplicate sends). It runs on the kit's runtime: pass [`Kit::idempotency`] to it (the
/// attribute's `store = idem`, or `idem.run(...)`), or install the kit's runtime as the global
/// one ([`Kit::install_global`]).
///
/// Its `Err` is told apart when it is the library's [`Error`] (a function returning
/// `Result<T, idempotency::Error>`), or when [`library_error`](Function::library_error) says
/// how to find it in the function's own error type; otherwise every `Err` counts as the body
/// failing.
///
/// [`Kit::idempotency`]: crate::testing::Kit::idempotency
/// [`Kit::install_global`]: crate::testing::Kit::install_global
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
/// use std::sync::Arc;
/// use idempotency::testing::{function, Kit};
/// use idempotency::{Call, Error};
///
/// let kit = Kit::new();
/// let charges = Arc::new(AtomicUsize::new(0));
/// let (idem, counted) = (kit.idempotency(), charges.clone());
/// let charge = move |amount: u64| {
///     let (idem, charges) = (idem.clone(), counted.clone());
///     async move {
///         let call = Call::new("charge:order-7").fingerprint(&amount);
///         idem.run_to_completion(call, move || async move {
///             charges.fetch_add(1, SeqCst);
///             tokio::time::sleep(std::time::Duration::from_millis(20)).await;
///             Ok::<_, Error>(format!("charged {amount}"))
///         })
///         .await
///     }
/// };
/// let report = kit.check(function(charge, 100).other_payload(250), move || charges.load(SeqCst)).await;
/// report.assert_passed();
/// # }
/// ```
pub fn function<I, F, Fut, T, E>(call: F, same: I) -> Function<I, F, E>
where
    I: Clone,
    F: Fn(I) -> Fut,
    Fut: Future<Output = Result<T, E>> + 'static,
    T: Debug + 'static,
    E: Debug + 'static,
{
    Function { call, same, other: None, name: std::any::type_name::<F>().to_owned(), library_error: None }
}

impl<I, F, E> Function<I, F, E> {
    /// Another payload for the same key: the kit expects it refused as a reused key.
    pub fn other_payload(mut self, other: I) -> Self {
        self.other = Some(other);
        self
    }

    /// The name in the report (by default the closure's type name).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How to find the library's [`Error`] in the function's error type, to tell a key in flight,
    /// a reused key and an unreachable store from the body failing.
    pub fn library_error(mut self, find: impl Fn(&E) -> Option<&Error> + 'static) -> Self {
        self.library_error = Some(Box::new(find));
        self
    }

    fn answer_for_error(&self, e: &E) -> Answer
    where
        E: Debug + 'static,
    {
        let found = match &self.library_error {
            Some(find) => find(e),
            None => (e as &dyn Any).downcast_ref::<Error>(),
        };
        match found {
            Some(Error::Conflict { .. }) => Answer::InFlight,
            Some(Error::KeyReused { .. }) => Answer::KeyReused,
            Some(Error::Store { .. }) => Answer::StoreUnavailable,
            Some(other) => Answer::Failed(other.to_string()),
            None => Answer::Failed(format!("{e:?}")),
        }
    }
}

impl<I, F, Fut, T, E> Subject for Function<I, F, E>
where
    I: Clone,
    F: Fn(I) -> Fut,
    Fut: Future<Output = Result<T, E>> + 'static,
    T: Debug + 'static,
    E: Debug + 'static,
{
    fn call(&self, ask: Ask) -> Answering<'_> {
        let input = match ask {
            Ask::Same => self.same.clone(),
            Ask::OtherPayload => self.other.clone().unwrap_or_else(|| self.same.clone()),
        };
        let running = (self.call)(input);
        Box::pin(async move {
            match running.await {
                Ok(value) => Answer::Value { shown: format!("{value:?}"), replayed: None },
                Err(e) => self.answer_for_error(&e),
            }
        })
    }

    fn has_other_payload(&self) -> bool {
        self.other.is_some()
    }

    fn describe(&self) -> String {
        format!("function {}", self.name)
    }
}
