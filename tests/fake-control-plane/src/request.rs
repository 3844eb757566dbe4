//! The request as a handler sees it ([`Req`]), and readers for its query (paging) and its JSON
//! body's optional fields, each answering a JSend 400 that names the field.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::Method;
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::jsend::ApiError;

/// Maximum JSON request body.
pub(crate) const MAX_JSON: usize = 16 * 1024 * 1024;

/// Everything a handler needs from the request.
#[derive(Debug)]
pub(crate) struct Req {
    pub name: &'static str,
    /// The HTTP method (the computer routes share one route name and dispatch on it).
    pub method: Method,
    pub sid: Option<String>,
    pub sub: Option<String>,
    pub query: Vec<(String, String)>,
    pub body: Option<Body>,
    pub pre_body: Option<Bytes>,
    pub stall_mid: bool,
}

impl Req {
    /// A query parameter.
    pub(crate) fn q(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The sandbox id of the path.
    pub(crate) fn sid(&self) -> &str {
        self.sid.as_deref().unwrap_or_default()
    }

    /// The second id of the path (process, template, network, disk, ip).
    pub(crate) fn sub(&self) -> &str {
        self.sub.as_deref().unwrap_or_default()
    }

    /// The raw body bytes.
    pub(crate) async fn bytes(&mut self) -> Result<Bytes, ApiError> {
        if let Some(b) = self.pre_body.take() {
            return Ok(b);
        }
        let Some(body) = self.body.take() else {
            return Ok(Bytes::new());
        };
        axum::body::to_bytes(body, MAX_JSON)
            .await
            .map_err(|_| ApiError::bad_request("body", "could not read the request body"))
    }

    /// The JSON body as an object; an empty body is `{}`; anything else is a 400.
    pub(crate) async fn json(&mut self) -> Result<serde_json::Map<String, Value>, ApiError> {
        let bytes = self.bytes().await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(serde_json::Map::new());
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(ApiError::bad_request("body", "expected a JSON object")),
            Err(e) => Err(ApiError::bad_request(
                "body",
                format!("malformed JSON: {e}"),
            )),
        }
    }

    /// Takes the streaming body (uploads).
    pub(crate) fn take_body(&mut self) -> Body {
        if let Some(b) = self.pre_body.take() {
            return Body::from(b);
        }
        self.body.take().unwrap_or_else(Body::empty)
    }
}

/// `limit`/`offset` from the query (limit defaults to 100, capped at 500).
pub(crate) fn paging(req: &Req) -> Result<(usize, usize), ApiError> {
    let num = |k: &str, default: usize| -> Result<usize, ApiError> {
        match req.q(k) {
            None | Some("") => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| ApiError::bad_request(k, "must be a non-negative integer")),
        }
    };
    let limit = num("limit", 100)?.clamp(1, 500);
    Ok((limit, num("offset", 0)?))
}

/// The string field `key` (`None` when absent or null).
pub(crate) fn opt_str(body: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(key, "must be a string")),
    }
}

/// The boolean field `key` (`None` when absent or null).
pub(crate) fn opt_bool(body: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(key, "must be a boolean")),
    }
}

/// The non-negative integer field `key` (`None` when absent or null).
pub(crate) fn opt_u64(body: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(key, "must be a non-negative integer")),
    }
}

/// The list-of-strings field `key` (`None` when absent or null).
pub(crate) fn opt_str_list(
    body: &Map<String, Value>,
    key: &str,
) -> Result<Option<Vec<String>>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(key, "must be a list of strings")),
        Some(_) => Err(ApiError::bad_request(key, "must be a list of strings")),
    }
}

/// The object-of-strings field `key` (`None` when absent or null).
pub(crate) fn opt_str_map(
    body: &Map<String, Value>,
    key: &str,
) -> Result<Option<BTreeMap<String, String>>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            let mut out = BTreeMap::new();
            for (k, v) in m {
                let Some(v) = v.as_str() else {
                    return Err(ApiError::bad_request(
                        key,
                        format!("value of {k:?} must be a string"),
                    ));
                };
                out.insert(k.clone(), v.to_owned());
            }
            Ok(Some(out))
        }
        Some(_) => Err(ApiError::bad_request(key, "must be an object of strings")),
    }
}
