//! Response helpers: `{code, message}` errors, FastAPI-style validation errors, JSON bodies.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error answer: a status and a JSON body (`{code, message}` unless said otherwise).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: u16,
    pub body: Value,
}

impl ApiError {
    /// `{code, message}` with `status`.
    pub(crate) fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: json!({"code": code, "message": message.into()}),
        }
    }

    /// `FastAPI`'s request-validation answer: 422 `{"detail": [ {type, loc, msg, input}, ... ]}`.
    pub(crate) fn validation(
        kind: &str,
        loc: &[&str],
        msg: impl Into<String>,
        input: &Value,
    ) -> Self {
        Self {
            status: 422,
            body: json!({"detail": [{
                "type": kind,
                "loc": loc,
                "msg": msg.into(),
                "input": input.clone(),
            }]}),
        }
    }

    /// Starlette's answer for a path no route matches: 404 `{"detail": "Not Found"}`.
    pub(crate) fn no_route() -> Self {
        Self {
            status: 404,
            body: json!({"detail": "Not Found"}),
        }
    }

    /// Starlette's answer for a route without this method: 405 `{"detail": "Method Not Allowed"}`.
    pub(crate) fn method_not_allowed() -> Self {
        Self {
            status: 405,
            body: json!({"detail": "Method Not Allowed"}),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body)
    }
}

/// Result of a handler.
pub(crate) type Res = Result<Response, ApiError>;

/// A JSON response.
pub(crate) fn json_response(status: u16, v: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(v.to_string()))
        .unwrap_or_default()
}

/// A 200 JSON response (as a handler result, so a handler can end with it).
#[allow(clippy::unnecessary_wraps)]
pub(crate) fn ok(v: &Value) -> Res {
    Ok(json_response(200, v))
}

/// An empty response with `status` (204, 202), as a handler result.
#[allow(clippy::unnecessary_wraps)]
pub(crate) fn empty(status: u16) -> Res {
    Ok(Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK))
        .body(Body::empty())
        .unwrap_or_default())
}

/// A plain-text response.
pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(body.into()))
        .unwrap_or_default()
}

/// The value of query key `key` (the first one).
pub(crate) fn q<'a>(query: &'a [(String, String)], key: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Every value of query key `key`, in order.
pub(crate) fn q_all<'a>(query: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    query
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}
