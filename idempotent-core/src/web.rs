//! For `#[idempotent]` on axum handlers (feature `axum`): [`Json`], a JSON body that is both what
//! axum extracts and answers with and what the runtime stores and replays; the library's
//! [`Error`](crate::Error) answers as a problem (see [`problem`](crate::problem)).

use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A JSON body, as `axum::Json` (an extractor and a response), that is also `Serialize` and
/// `Deserialize` as its content: the `Ok` type of an `#[idempotent]` handler, stored and replayed
/// as the same JSON. Use it for the request body too, and name its binding in the key.
///
/// ```
/// use axum::{routing::post, Router};
/// use idempotency::web::Json;
/// use idempotency::{idempotent, Error};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct NewOrder { id: u64, sku: String }
/// #[derive(Serialize, Deserialize)]
/// struct Order { id: u64, sku: String, status: String }
///
/// #[idempotent(key = "order:{req.id}", fingerprint = req.sku)]
/// async fn create_order(Json(req): Json<NewOrder>) -> Result<Json<Order>, Error> {
///     Ok(Json(Order { id: req.id, sku: req.sku, status: "created".into() }))
/// }
///
/// let app: Router = Router::new().route("/orders", post(create_order));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = axum::extract::rejection::JsonRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = axum::Json::<T>::from_request(req, state).await?;
        Ok(Json(value))
    }
}

impl<T> std::ops::Deref for Json<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Json<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
