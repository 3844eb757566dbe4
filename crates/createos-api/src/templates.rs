//! Custom root filesystems built from a Dockerfile (`/v1/templates`).
//!
//! A template moves `pending → building → ready | failed`. Once `ready`, its id can be passed as
//! `rootfs` when creating a sandbox.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::transport::{BodyCap, RawBody, Transport, ndjson_frames, paginate, seg};
use crate::wire_enum::{lenient_enum, nullable, protocol_error};
use crate::{Client, PaginationOptions, RequestOptions, Result};

/// Longest plain-text build log [`Templates::logs`] reads: 16 MiB. Use
/// [`Templates::follow_logs`] to stream a longer one.
pub const MAX_TEMPLATE_LOG_BYTES: usize = 16 * 1024 * 1024;

lenient_enum! {
    /// Build status of a template.
    pub enum TemplateStatus {
        /// Accepted, not yet building.
        Pending => "pending",
        /// Being built.
        Building => "building",
        /// Built; usable as a sandbox `rootfs`.
        Ready => "ready",
        /// The build failed; see its logs.
        Failed => "failed",
    }
}

impl TemplateStatus {
    /// Whether the build is over (`ready` or `failed`).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Ready | Self::Failed)
    }
}

/// A custom root filesystem template.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Template {
    /// Template id (usable as `rootfs`).
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// Name given at creation.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Base image or rootfs the build started from.
    #[serde(deserialize_with = "nullable")]
    pub base: String,
    /// Build status.
    #[serde(deserialize_with = "nullable")]
    pub status: TemplateStatus,
    /// Size of the built ext4 image.
    #[serde(deserialize_with = "nullable")]
    pub ext4_size_bytes: u64,
    /// Creation time (RFC 3339).
    #[serde(deserialize_with = "nullable")]
    pub created_at: String,
    /// When the build finished.
    pub built_at: Option<String>,
    /// The Dockerfile; present only when requested with [`GetTemplateOptions::include_dockerfile`].
    pub dockerfile: Option<String>,
}

/// Body of `POST /v1/templates`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateCreateRequest {
    /// Template name (required).
    pub name: String,
    /// Dockerfile text (required).
    pub dockerfile: String,
    /// Base rootfs; omitted when empty (server default).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub base: String,
}

impl TemplateCreateRequest {
    /// A request for `name` built from `dockerfile`.
    pub fn new(name: impl Into<String>, dockerfile: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            dockerfile: dockerfile.into(),
            base: String::new(),
        }
    }
}

/// Options for [`Templates::get`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetTemplateOptions {
    /// Also return the Dockerfile (`include=dockerfile`).
    pub include_dockerfile: bool,
}

/// Options for [`Templates::logs`] and [`Templates::follow_logs`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateLogsOptions {
    /// Build attempt to read; `0` means the latest (omitted from the query).
    pub attempt: u32,
}

/// One line of a followed template build log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct TemplateLogEvent {
    /// Timestamp of the line.
    pub ts: Option<String>,
    /// Log level (`info`, `error` …).
    pub level: Option<String>,
    /// The log text.
    #[serde(deserialize_with = "nullable")]
    pub line: String,
    /// Build attempt this line belongs to.
    #[serde(deserialize_with = "nullable")]
    pub attempt: u32,
    /// `true` on the last frame of the build; the stream ends after it.
    #[serde(rename = "final", deserialize_with = "nullable")]
    pub is_final: bool,
    /// The build's outcome, on the final frame.
    pub status: Option<TemplateStatus>,
    /// Keys this client does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Template operations; get it from [`Client::templates`].
#[derive(Clone)]
pub struct Templates {
    transport: Arc<Transport>,
    options: RequestOptions,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates").finish_non_exhaustive()
    }
}

impl Client {
    /// Custom rootfs templates of this account.
    pub fn templates(&self) -> Templates {
        Templates {
            transport: Arc::clone(self.transport()),
            options: RequestOptions::default(),
        }
    }
}

impl Templates {
    /// The same service with `options` applied to every call.
    #[must_use]
    pub fn with_options(mut self, options: RequestOptions) -> Self {
        self.options = options;
        self
    }

    /// All templates, page by page (legacy list key `templates` accepted).
    pub fn list(&self, pagination: PaginationOptions) -> BoxStream<'static, Result<Template>> {
        paginate(
            Arc::clone(&self.transport),
            "/v1/templates".to_owned(),
            pagination.query(),
            Some("templates"),
            self.options.clone(),
        )
    }

    /// Starts a build (`POST /v1/templates`); the template is normally `pending`.
    pub async fn create(&self, request: &TemplateCreateRequest) -> Result<Template> {
        let body = serde_json::to_value(request).map_err(|e| protocol_error(e.to_string()))?;
        self.transport
            .json(
                Method::POST,
                "/v1/templates",
                &[],
                Some(body),
                &self.options,
            )
            .await
    }

    /// Fetches a template, optionally with its Dockerfile.
    pub async fn get(&self, id: &str, options: GetTemplateOptions) -> Result<Template> {
        let query: Vec<(&str, String)> = if options.include_dockerfile {
            vec![("include", "dockerfile".to_owned())]
        } else {
            Vec::new()
        };
        self.transport
            .json(Method::GET, &path(id, ""), &query, None, &self.options)
            .await
    }

    /// Deletes a template. Sandboxes already created from it are unaffected.
    pub async fn delete(&self, id: &str) -> Result<()> {
        self.transport
            .unit(Method::DELETE, &path(id, ""), &[], None, &self.options)
            .await
    }

    /// The build log so far, as plain text (not JSend; invalid UTF-8 is replaced). A GET,
    /// so retried like every other; the request's timeout covers reading the body, and a
    /// log longer than [`MAX_TEMPLATE_LOG_BYTES`] fails with [`crate::Error::TooLarge`].
    pub async fn logs(&self, id: &str, options: TemplateLogsOptions) -> Result<String> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if options.attempt != 0 {
            query.push(("attempt", options.attempt.to_string()));
        }
        let cap = BodyCap {
            limit: MAX_TEMPLATE_LOG_BYTES,
            too_large: true,
        };
        let (_, body) = self
            .transport
            .fetch(
                Method::GET,
                &path(id, "/logs"),
                &query,
                None,
                &self.options,
                cap,
            )
            .await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Follows the build log as it is written (`?follow=true`, NDJSON or SSE). The stream ends
    /// after the frame with `final: true`, or when the server closes it. Never retried.
    pub async fn follow_logs(
        &self,
        id: &str,
        options: TemplateLogsOptions,
    ) -> Result<BoxStream<'static, Result<TemplateLogEvent>>> {
        let mut query: Vec<(&str, String)> = vec![("follow", "true".to_owned())];
        if options.attempt != 0 {
            query.push(("attempt", options.attempt.to_string()));
        }
        let response = self
            .transport
            .raw(
                Method::GET,
                &path(id, "/logs"),
                &query,
                RawBody::None,
                &self.options,
            )
            .await?;
        let transport = Arc::clone(&self.transport);
        let events = ndjson_frames(response).map(move |frame| {
            // Decoded like every other answer, so a reflected key is redacted from the error.
            frame.and_then(|map| {
                transport.decode_data::<TemplateLogEvent>(Value::Object(map), "template log frame")
            })
        });
        // Stop right after the final frame, even if the server keeps the connection open.
        let stream =
            futures::stream::unfold((events.boxed(), false), |(mut events, done)| async move {
                if done {
                    return None;
                }
                let item = events.next().await?;
                let finished = match &item {
                    Ok(event) => event.is_final,
                    Err(_) => true,
                };
                Some((item, (events, finished)))
            });
        Ok(stream.boxed())
    }
}

fn path(id: &str, tail: &str) -> String {
    format!("/v1/templates/{}{tail}", seg(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn create_request_omits_empty_base() {
        let req = TemplateCreateRequest::new("t", "FROM x");
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            json!({"name":"t","dockerfile":"FROM x"})
        );
        let req = TemplateCreateRequest {
            base: "devbox:1".into(),
            ..req
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap()["base"],
            json!("devbox:1")
        );
    }

    #[test]
    fn log_event_keeps_unknown_keys() {
        let event: TemplateLogEvent = serde_json::from_value(json!({
            "ts": "2026-01-01T00:00:00Z", "level": "info", "line": "step 1", "attempt": 2,
            "final": true, "status": "ready", "step": 3, "image": {"layers": 4}
        }))
        .unwrap();
        assert!(event.is_final);
        assert_eq!(event.status, Some(TemplateStatus::Ready));
        assert_eq!(event.attempt, 2);
        assert_eq!(event.extra.get("step"), Some(&json!(3)));
        assert_eq!(event.extra.get("image"), Some(&json!({"layers": 4})));
        assert!(!event.extra.contains_key("line"));
    }

    #[test]
    fn template_decodes_unknown_status() {
        let t: Template = serde_json::from_value(json!({"id":"tpl_1","status":"queued"})).unwrap();
        assert_eq!(t.status, TemplateStatus::Unknown("queued".into()));
        assert!(!t.status.is_terminal());
        assert!(TemplateStatus::Failed.is_terminal());
    }
}
