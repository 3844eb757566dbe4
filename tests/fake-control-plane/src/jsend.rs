//! JSend envelopes and the error type every handler returns.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A handler's result: a finished response or an error rendered as a JSend envelope.
pub(crate) type ApiResult = Result<Response, ApiError>;

/// An error answered with a JSend `fail` (client error) or `error` envelope.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    /// A `fail` envelope whose `data` maps one field to a message.
    pub(crate) fn fail_field(status: u16, field: &str, msg: impl Into<String>) -> Self {
        let mut data = serde_json::Map::new();
        data.insert(field.to_owned(), Value::String(msg.into()));
        Self::fail(status, Value::Object(data))
    }

    /// A `fail` envelope with arbitrary `data` (object, string or null).
    #[allow(clippy::needless_pass_by_value)]
    pub(crate) fn fail(status: u16, data: Value) -> Self {
        Self {
            status: code(status),
            body: json!({"status": "fail", "data": data}),
        }
    }

    /// An `error` envelope: `{status:"error", message, code}`.
    pub(crate) fn error(status: u16, msg: impl Into<String>) -> Self {
        Self {
            status: code(status),
            body: json!({"status": "error", "message": msg.into(), "code": status}),
        }
    }

    /// 400 `fail` for a malformed body or query.
    pub(crate) fn bad_request(field: &str, msg: impl Into<String>) -> Self {
        Self::fail_field(400, field, msg)
    }

    /// 404 `fail` with a string message.
    pub(crate) fn not_found(msg: impl Into<String>) -> Self {
        Self::fail(404, Value::String(msg.into()))
    }

    /// 409 `error` envelope.
    pub(crate) fn conflict(msg: impl Into<String>) -> Self {
        Self::error(409, msg)
    }

    /// The live message for exec/files/processes on a paused guest.
    pub(crate) fn paused() -> Self {
        Self::error(409, "sandbox is paused; resume it before accessing files")
    }
}

fn code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = matches!(self.status.as_u16(), 429 | 503);
        let mut resp = json_response(self.status, &self.body);
        if retry {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("0"));
        }
        resp
    }
}

/// A JSON response with the given status.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(bytes))
        .unwrap_or_default()
}

/// `200 {"status":"success","data":data}`.
#[allow(clippy::needless_pass_by_value, clippy::unnecessary_wraps)]
pub(crate) fn ok(data: Value) -> ApiResult {
    Ok(json_response(
        StatusCode::OK,
        &json!({"status": "success", "data": data}),
    ))
}

/// A paginated list: `{data:[…], pagination:{total, offset, count}}`.
pub(crate) fn page(items: Vec<Value>, limit: usize, offset: usize) -> ApiResult {
    let total = items.len();
    let rows: Vec<Value> = items.into_iter().skip(offset).take(limit).collect();
    let count = rows.len();
    ok(json!({
        "data": rows,
        "pagination": {"total": total, "offset": offset, "count": count},
    }))
}
