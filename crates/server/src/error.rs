//! Every failure a client sees: an HTTP status and OpenAI's error object,
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `rate_limit_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message)
            .param(param)
            .code("invalid_value")
    }

    /// 400: a feature Muser does not implement (rather than silently ignoring it).
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message)
            .param(param)
            .code("unsupported_value")
    }

    pub fn context_length(message: impl Into<String>, param: &str) -> Self {
        Self::bad_request(message)
            .param(param)
            .code("context_length_exceeded")
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key: send 'Authorization: Bearer <key>'",
        )
        .code("invalid_api_key")
    }

    pub fn model_not_found(model: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model '{model}' does not exist; this server serves '{served}'"),
        )
        .param("model")
        .code("model_not_found")
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", what).code("not_found")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed on this path",
        )
        .code("method_not_allowed")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .code("request_too_large")
    }

    /// 409: the resource is in use (a slot running a sequence).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message).code("conflict")
    }

    /// 501: a feature this server was not started with.
    pub fn not_enabled(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message).code("not_supported")
    }

    /// 429: the queue is full; the client should come back later.
    pub fn overloaded(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            .code("rate_limit_exceeded");
        e.retry_after = Some(retry_after);
        e
    }

    /// 503: shutting down, or the engine is gone.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            .code("service_unavailable");
        e.retry_after = Some(5);
        e
    }

    /// 500: the engine failed on a request that was valid.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message).code("internal_error")
    }

    pub fn param(mut self, p: impl Into<String>) -> Self {
        self.param = Some(p.into());
        self
    }

    pub fn code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }

    /// The OpenAI error object (also sent as an SSE event when a stream fails).
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl From<muser_text::TextError> for ApiError {
    fn from(e: muser_text::TextError) -> Self {
        use muser_text::TextError as T;
        match &e {
            T::InvalidChat(_) | T::Template(_) => ApiError::invalid("messages", e.to_string()),
            T::InputTooLarge { .. } => ApiError::invalid("prompt", e.to_string()),
            T::UnknownToken { .. } | T::InvalidUtf8 { .. } => ApiError::bad_request(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}
