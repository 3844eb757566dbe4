//! In-guest self-service: a sandbox asking its own local agent to pause or delete it.
//!
//! These calls only work from inside a sandbox: they go to the guest agent at
//! `http://127.0.0.1:1029`, not to the control plane, carry no API key, and succeed on HTTP 202.
//! Deleting is irreversible.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};

use crate::error::ApiError;
use crate::{Error, Result};

/// Address of the in-guest agent.
pub const AGENT_BASE_URL: &str = "http://127.0.0.1:1029";

/// Default timeout of a self-service call (10 s, as in the Python SDK).
pub const DEFAULT_SELF_SERVICE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest agent error body kept in the error.
const MAX_AGENT_ERROR_BODY: usize = 64 * 1024;

/// Asks the local agent to pause this sandbox (`POST /self/pause?reason=…`, expects 202).
/// An empty `reason` is not sent.
pub async fn self_pause(reason: &str, timeout: Duration) -> Result<()> {
    self_request(AGENT_BASE_URL, "pause", reason, timeout).await
}

/// Asks the local agent to delete this sandbox (`POST /self/delete?reason=…`, expects 202).
/// Irreversible. An empty `reason` is not sent.
pub async fn self_delete(reason: &str, timeout: Duration) -> Result<()> {
    self_request(AGENT_BASE_URL, "delete", reason, timeout).await
}

pub(crate) async fn self_request(
    base: &str,
    action: &str,
    reason: &str,
    timeout: Duration,
) -> Result<()> {
    let endpoint = format!("/self/{action}");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .build()
        .map_err(|e| Error::Config(format!("cannot build the agent HTTP client: {e}")))?;
    let mut request = http.post(format!("{base}{endpoint}"));
    if !reason.is_empty() {
        request = request.query(&[("reason", reason)]);
    }
    let response = request.send().await.map_err(|e| {
        if e.is_timeout() {
            Error::Timeout {
                method: Method::POST,
                endpoint: endpoint.clone(),
                after: timeout,
            }
        } else {
            Error::Transport {
                method: Method::POST,
                endpoint: endpoint.clone(),
                message: e.to_string(),
                source: Box::new(e),
            }
        }
    })?;
    let status = response.status();
    if status == StatusCode::ACCEPTED {
        return Ok(());
    }
    if status.is_success() {
        return Err(Error::protocol(format!(
            "agent answered {endpoint} with HTTP {}, expected 202",
            status.as_u16()
        )));
    }
    let headers = response.headers().clone();
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut body = response.bytes().await.unwrap_or_default();
    let truncated = body.len() > MAX_AGENT_ERROR_BODY;
    if truncated {
        body = body.slice(..MAX_AGENT_ERROR_BODY);
    }
    let message = agent_message(&body);
    Err(Error::Api(Box::new(ApiError {
        status,
        method: Method::POST,
        endpoint,
        code: 0,
        message,
        request_id,
        body,
        body_truncated: truncated,
        retry_after: None,
        headers: strip_sensitive(&headers),
    })))
}

fn agent_message(body: &Bytes) -> String {
    if let Ok(serde_json::Value::Object(obj)) = serde_json::from_slice::<serde_json::Value>(body) {
        for key in ["message", "error", "data"] {
            if let Some(text) = obj
                .get(key)
                .and_then(serde_json::Value::as_str)
                .filter(|t| !t.is_empty())
            {
                return text.to_owned();
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "request failed".to_owned()
    } else {
        text.chars().take(500).collect()
    }
}

fn strip_sensitive(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        if !matches!(
            name.as_str(),
            "set-cookie" | "cookie" | "authorization" | "x-api-key"
        ) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use httpmock::prelude::*;

    #[tokio::test]
    async fn pause_posts_reason_and_accepts_202() {
        let server = MockServer::start_async().await;
        let mock = server
            .mock_async(|when, then| {
                when.method(POST)
                    .path("/self/pause")
                    .query_param("reason", "idle work done")
                    .header_missing("x-api-key");
                then.status(202);
            })
            .await;
        self_request(
            &server.base_url(),
            "pause",
            "idle work done",
            DEFAULT_SELF_SERVICE_TIMEOUT,
        )
        .await
        .unwrap();
        mock.assert_async().await;
    }

    #[tokio::test]
    async fn delete_without_reason_sends_no_query() {
        let server = MockServer::start_async().await;
        let with_reason = server
            .mock_async(|when, then| {
                when.method(POST)
                    .path("/self/delete")
                    .query_param_exists("reason");
                then.status(500);
            })
            .await;
        let mock = server
            .mock_async(|when, then| {
                when.method(POST).path("/self/delete");
                then.status(202);
            })
            .await;
        self_request(
            &server.base_url(),
            "delete",
            "",
            DEFAULT_SELF_SERVICE_TIMEOUT,
        )
        .await
        .unwrap();
        mock.assert_async().await;
        with_reason.assert_calls_async(0).await;
    }

    #[tokio::test]
    async fn other_statuses_are_errors() {
        let server = MockServer::start_async().await;
        server
            .mock_async(|when, then| {
                when.method(POST).path("/self/pause");
                then.status(200).body("ok");
            })
            .await;
        server
            .mock_async(|when, then| {
                when.method(POST).path("/self/delete");
                then.status(409)
                    .json_body(serde_json::json!({"message": "already deleting"}));
            })
            .await;
        let err = self_request(
            &server.base_url(),
            "pause",
            "",
            DEFAULT_SELF_SERVICE_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Protocol { .. }), "{err:?}");
        let err = self_request(
            &server.base_url(),
            "delete",
            "x",
            DEFAULT_SELF_SERVICE_TIMEOUT,
        )
        .await
        .unwrap_err();
        let api = err.as_api().expect("api error");
        assert_eq!(api.status.as_u16(), 409);
        assert_eq!(api.message, "already deleting");
        assert_eq!(api.endpoint, "/self/delete");
    }
}
