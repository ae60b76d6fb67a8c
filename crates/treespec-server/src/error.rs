//! OpenAI-style error objects: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`, …
    pub kind: &'static str,
    /// The offending request field, if any.
    pub param: Option<String>,
    /// A machine-readable code, if any.
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503 when the queue is full).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400 invalid_request_error about `param`.
    pub fn invalid(param: impl Into<Option<&'static str>>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into().map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// Set the code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Set the status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid API key: send `Authorization: Bearer KEY`".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// 503 with Retry-After: the queue is full.
    pub fn overloaded(queue: usize) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server is busy: {queue} requests are already queued; retry later"),
            kind: "server_error",
            param: None,
            code: Some("queue_full"),
            retry_after: Some(1),
        }
    }

    /// 503 while the server drains before it stops: a gateway retries the request on another
    /// replica.
    pub fn draining() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down and takes no new requests; send it to another replica"
                .into(),
            kind: "server_error",
            param: None,
            code: Some("draining"),
            retry_after: Some(1),
        }
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 404 for an unknown route.
    pub fn not_found(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
            retry_after: None,
        }
    }

    /// 405 for a known route asked with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{path} does not accept {method} requests"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
            retry_after: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The error a body past its deadline ends with (the handlers' body reading answers it 408).
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?} (--timeout)")]
pub struct BodyTimedOut(pub std::time::Duration);

/// Whether a request body's error is [`BodyTimedOut`] (somewhere in its chain of sources).
pub fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        next = e.source();
    }
    false
}
