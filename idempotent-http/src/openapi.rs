//! The layer's policy told to clients as an OpenAPI 3.1 fragment: the `Idempotency-Key` header
//! parameter, the problems the layer answers before (or instead of) the handler with their
//! problem types, the replay and expiry headers, and the retention, for the routes it guards.
//! Generated from the layer itself, so the description cannot drift from what the layer does.

use std::time::Duration;

use http::StatusCode;
use idempotent_core::problem::{ProblemKind, PROBLEM_JSON};
use idempotent_core::OnConflict;
use idempotent_core::OnCrash;
use serde_json::{json, Map, Value};

use crate::layer::IdempotencyLayer;
use crate::policy::{KeyMode, Policy, IDEMPOTENCY_KEY_EXPIRES};

/// The version of OpenAPI the fragment is written in.
pub const OPENAPI_VERSION: &str = "3.1.0";

/// The names the fragment gives its components (under `components/parameters`, `headers`,
/// `schemas` and `responses`) all start with this, so that merging them into an application's
/// own document does not overwrite its components.
pub const COMPONENT_PREFIX: &str = "Idempotency";

/// The extension on each guarded operation holding the policy in a form a program reads.
pub const POLICY_EXTENSION: &str = "x-idempotency";

impl IdempotencyLayer {
    /// The layer's policy as an OpenAPI 3.1 document for the operations it guards on `paths`
    /// (each path as the application's document writes it, `/orders/{id}` say): every guarded
    /// method of each path gets the `Idempotency-Key` parameter, the responses the layer itself
    /// may answer (400, 403, 409, 413, 422, 500, 502, 503: `application/problem+json`, each
    /// listing its problem types), and an `x-idempotency` extension saying how keys are scoped,
    /// which statuses are stored, how long they are replayed, which header marks a replay and
    /// what happens to a key in flight. In token mode the token endpoint is described too.
    ///
    /// The document is valid on its own; to publish it with an application's own, merge each
    /// operation's `parameters`, `responses` (the application's own answers for a status stay
    /// where it has them) and `x-idempotency` into the application's operation of the same path
    /// and method, and `components` into its components (their names start with
    /// [`COMPONENT_PREFIX`]). A templated path's parameters are declared as strings, so that the
    /// document stands alone; keep the application's own declarations. Nothing here names the application's success responses: a stored
    /// one is replayed as it was, with the replay header (`components/headers/IdempotencyReplayed`)
    /// added.
    ///
    /// ```
    /// use idempotent_core::{Idempotency, MemoryStore};
    /// use idempotent_http::{client, IdempotencyLayer};
    ///
    /// let layer = IdempotencyLayer::per_client(Idempotency::new(MemoryStore::new()), client::authorization());
    /// let doc = layer.openapi(["/payments"]);
    /// assert_eq!(doc["openapi"], "3.1.0");
    /// let post = &doc["paths"]["/payments"]["post"];
    /// assert_eq!(post["parameters"][0]["$ref"], "#/components/parameters/IdempotencyKey");
    /// assert_eq!(post["x-idempotency"]["retentionSeconds"], 86400);
    /// assert!(post["responses"]["422"].is_object());
    /// ```
    pub fn openapi<'a>(&self, paths: impl IntoIterator<Item = &'a str>) -> Value {
        let policy = &self.policy;
        let kinds = answered_kinds(policy);
        let mut operation = Map::new();
        operation.insert("parameters".into(), json!([component_ref("parameters", "Key")]));
        let mut responses = Map::new();
        for status in statuses(&kinds) {
            responses.insert(status.as_str().into(), component_ref("responses", &response_name(status)));
        }
        operation.insert("responses".into(), Value::Object(responses));
        operation.insert(POLICY_EXTENSION.into(), policy_extension(policy));
        let operation = Value::Object(operation);

        let mut described = Map::new();
        for path in paths {
            let mut item = Map::new();
            let templated = template_parameters(path);
            if !templated.is_empty() {
                item.insert("parameters".into(), Value::Array(templated));
            }
            for method in &policy.methods {
                item.insert(method.as_str().to_ascii_lowercase(), operation.clone());
            }
            described.insert(path.to_owned(), Value::Object(item));
        }
        if policy.mode == KeyMode::Token {
            described.insert(policy.token_path.clone(), token_endpoint(policy));
        }

        json!({
            "openapi": OPENAPI_VERSION,
            "info": {
                "title": "Idempotency-Key policy",
                "version": env!("CARGO_PKG_VERSION"),
                "description": "What the idempotency layer does to the operations it guards. Merge each \
                    operation's parameters, responses and x-idempotency into the operation of the same path \
                    and method in the application's document, and the components into its components.",
            },
            "paths": described,
            "components": components(policy, &kinds),
        })
    }
}

/// The parameters of `path`'s template (`/orders/{id}`: `id`), declared as strings so that
/// the fragment is valid on its own; the application's document declares them as they are.
fn template_parameters(path: &str) -> Vec<Value> {
    path.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .filter(|name| !name.is_empty())
        .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
        .collect()
}

/// `{"$ref": "#/components/<section>/Idempotency<name>"}`.
fn component_ref(section: &str, name: &str) -> Value {
    json!({ "$ref": format!("#/components/{section}/{COMPONENT_PREFIX}{name}") })
}

/// The name of the response component for `status`: `Status409`.
fn response_name(status: StatusCode) -> String {
    format!("Status{}", status.as_str())
}

/// The problems a request through this layer can be answered with by the layer itself.
fn answered_kinds(policy: &Policy) -> Vec<ProblemKind> {
    let mut kinds = Vec::new();
    if policy.mode != KeyMode::Optional {
        kinds.push(ProblemKind::MissingKey);
    }
    kinds.push(ProblemKind::MalformedKey);
    if policy.mode == KeyMode::Token {
        kinds.push(ProblemKind::InvalidToken);
    }
    kinds.extend([ProblemKind::UnreadableBody, ProblemKind::InvalidCall]);
    if policy.per_client {
        kinds.push(ProblemKind::UnidentifiedClient);
    }
    kinds.extend([
        ProblemKind::InFlight,
        ProblemKind::LockHeld,
        ProblemKind::NotReplayable,
        ProblemKind::RequestTooLarge,
        ProblemKind::KeyReused,
        ProblemKind::UnreadableResponse,
        ProblemKind::StoreUnavailable,
        ProblemKind::Unconfirmed,
        ProblemKind::Internal,
    ]);
    if policy.on_crash == OnCrash::Hold {
        kinds.push(ProblemKind::OutcomeUnknown);
    }
    kinds
}

/// The statuses of `kinds`, in order, each once.
fn statuses(kinds: &[ProblemKind]) -> Vec<StatusCode> {
    let mut statuses: Vec<StatusCode> = kinds.iter().map(|k| k.status()).collect();
    statuses.sort();
    statuses.dedup();
    statuses
}

/// Whether an answer of this kind carries `Retry-After`.
fn retried_after(kind: ProblemKind) -> bool {
    matches!(kind, ProblemKind::InFlight | ProblemKind::LockHeld | ProblemKind::Unconfirmed)
}

/// The operation's `x-idempotency`: the policy for a program to read.
fn policy_extension(policy: &Policy) -> Value {
    let retention = retention(policy);
    let in_flight = match policy.on_conflict {
        OnConflict::Wait(patience) => json!({ "answer": "wait", "waitSeconds": patience.as_secs_f64() }),
        _ => json!({ "answer": "reject" }),
    };
    json!({
        "header": crate::IDEMPOTENCY_KEY.as_str(),
        "key": match policy.mode {
            KeyMode::Required => "required",
            KeyMode::Optional => "optional",
            KeyMode::Token => "token",
        },
        "keyScope": if policy.per_client { "per-client" } else { "shared" },
        "maxKeyBytes": policy.max_key_bytes,
        "maxRequestBytes": policy.max_request_bytes,
        "sameRequest": {
            "method": true,
            "target": true,
            "body": if policy.json_fingerprint { "canonical-json" } else { "bytes" },
        },
        "retention": iso8601(retention),
        "retentionSeconds": retention.as_secs(),
        "storedStatuses": stored_statuses(policy),
        "storedHeaders": policy.stored_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
        "replayHeader": policy.replay_header.as_str(),
        "expiryHeader": policy.expiry_header.then(|| IDEMPOTENCY_KEY_EXPIRES.as_str()),
        "inFlight": in_flight,
        "onCrash": if policy.on_crash == OnCrash::Hold { "hold" } else { "rerun" },
    })
}

/// How long a stored response is replayed: the layer's keep, or its runtime's.
fn retention(policy: &Policy) -> Duration {
    policy.keep.unwrap_or_else(|| policy.idem.default_keep())
}

/// A duration as ISO 8601 (`PT86400S`), whole seconds.
fn iso8601(d: Duration) -> String {
    format!("PT{}S", d.as_secs())
}

/// The statuses the layer stores (100 to 599, asked of its predicate), as ranges: `"200-399"`,
/// `"402"`. A handler can have any other one stored with `Ran`.
fn stored_statuses(policy: &Policy) -> Vec<String> {
    let stored = |code: u16| StatusCode::from_u16(code).is_ok_and(|s| (policy.store_if)(s));
    let mut ranges = Vec::new();
    let mut code = 100;
    while code <= 599 {
        if !stored(code) {
            code += 1;
            continue;
        }
        let start = code;
        while code < 599 && stored(code + 1) {
            code += 1;
        }
        ranges.push(if start == code { start.to_string() } else { format!("{start}-{code}") });
        code += 1;
    }
    ranges
}

/// The `Idempotency-Key` parameter, as the layer parses it.
fn key_parameter(policy: &Policy) -> Value {
    let form = if policy.lenient_header {
        "a Structured Field string (`\"...\"`, RFC 8941) or a bare token"
    } else {
        "a Structured Field string (RFC 8941): the key in double quotes, `\"...\"`, with `\\\"` and `\\\\` escaped"
    };
    let what = match policy.mode {
        KeyMode::Token => format!(
            "A one-time token from `POST {}`, sent back as the key. A request with a token already used \
             is answered with the first one's stored response.",
            policy.token_path
        ),
        _ => "A key of the client's choosing for one operation: a retry of the same request sends the \
              same key and is answered with the first one's stored response."
            .to_owned(),
    };
    let mut schema = json!({ "type": "string", "minLength": 3 });
    if !policy.lenient_header {
        // Not anchored at the end: parameters may follow the string.
        schema["pattern"] = json!(r#"^"(?:[ !#-\[\]-~]|\\["\\])+""#);
    }
    json!({
        "name": crate::IDEMPOTENCY_KEY.as_str(),
        "in": "header",
        "required": policy.mode != KeyMode::Optional,
        "description": format!(
            "{what} The value is {form}; the key inside is 1 to {} bytes. Kept {} seconds after the first \
             request completes{}.",
            policy.max_key_bytes,
            retention(policy).as_secs(),
            if policy.per_client { ", apart for each client" } else { ", in one key space for every client" },
        ),
        "schema": schema,
        "example": "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
    })
}

/// The components the operations refer to.
fn components(policy: &Policy, kinds: &[ProblemKind]) -> Value {
    let mut responses = Map::new();
    for status in statuses(kinds) {
        let of_status: Vec<ProblemKind> = kinds.iter().copied().filter(|k| k.status() == status).collect();
        responses.insert(format!("{COMPONENT_PREFIX}{}", response_name(status)), problem_response(status, &of_status));
    }
    let mut headers = Map::new();
    headers.insert(
        format!("{COMPONENT_PREFIX}Replayed"),
        json!({
            "description": format!(
                "On a replayed response: `{}: true`. The rest of the response is the stored one.",
                policy.replay_header
            ),
            "schema": { "type": "string", "const": "true" },
        }),
    );
    headers.insert(
        format!("{COMPONENT_PREFIX}RetryAfter"),
        json!({
            "description": "Seconds after which a retry with the same key may find the first request finished.",
            "schema": { "type": "integer", "minimum": 1 },
        }),
    );
    if policy.expiry_header {
        headers.insert(
            format!("{COMPONENT_PREFIX}KeyExpires"),
            json!({
                "description": "On stored responses and their replays: until when the key's response is \
                    replayed (an HTTP-date); after it the key is free again.",
                "schema": { "type": "string" },
                "example": "Fri, 04 Dec 2026 09:30:00 GMT",
            }),
        );
    }
    let mut parameters = Map::new();
    parameters.insert(format!("{COMPONENT_PREFIX}Key"), key_parameter(policy));
    let mut schemas = Map::new();
    schemas.insert(
        format!("{COMPONENT_PREFIX}Problem"),
        json!({
            "type": "object",
            "description": "A problem details object (RFC 9457).",
            "required": ["type", "title", "status", "detail"],
            "properties": {
                "type": { "type": "string", "format": "uri" },
                "title": { "type": "string" },
                "status": { "type": "integer" },
                "detail": { "type": "string" },
            },
        }),
    );
    json!({ "parameters": parameters, "headers": headers, "schemas": schemas, "responses": responses })
}

/// The response for `status`, listing the problem types it may carry.
fn problem_response(status: StatusCode, kinds: &[ProblemKind]) -> Value {
    let description = kinds.iter().map(|k| format!("`{}`: {}.", k.slug(), k.title())).collect::<Vec<_>>().join(" ");
    let mut examples = Map::new();
    for kind in kinds {
        examples.insert(
            kind.slug().to_owned(),
            json!({
                "summary": kind.title(),
                "value": { "type": kind.type_uri(), "title": kind.title(), "status": status.as_u16(), "detail": "..." },
            }),
        );
    }
    let mut response = json!({
        "description": format!("Answered by the idempotency layer. {description}"),
        "content": {
            PROBLEM_JSON: {
                "schema": {
                    "allOf": [component_ref("schemas", "Problem")],
                    "properties": {
                        "type": { "enum": kinds.iter().map(|k| k.type_uri()).collect::<Vec<_>>() },
                        "status": { "const": status.as_u16() },
                    },
                },
                "examples": examples,
            },
        },
    });
    if kinds.iter().any(|k| retried_after(*k)) {
        response["headers"] = json!({ "Retry-After": component_ref("headers", "RetryAfter") });
    }
    response
}

/// The token endpoint's path item.
fn token_endpoint(policy: &Policy) -> Value {
    let mut responses = Map::new();
    responses.insert(
        "200".into(),
        json!({
            "description": "A one-time token, to send back as the `Idempotency-Key` of the guarded request.",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["token", "expires_in"],
                        "properties": {
                            "token": { "type": "string" },
                            "expires_in": { "type": "integer", "description": "Seconds until the token expires unless used." },
                        },
                    },
                },
            },
        }),
    );
    if policy.per_client {
        responses.insert("403".into(), component_ref("responses", &response_name(StatusCode::FORBIDDEN)));
    }
    json!({
        "post": {
            "summary": "Issue a one-time idempotency token",
            "description": format!("A token valid {} seconds, for one guarded request.", policy.token_ttl.as_secs()),
            "responses": responses,
        },
    })
}
