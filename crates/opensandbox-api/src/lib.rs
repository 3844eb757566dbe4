//! A typed async client for [OpenSandbox](https://github.com/opensandbox-group/OpenSandbox)
//! 1.1.1: the lifecycle API (`/v1/sandboxes`, `/v1/snapshots`, network policy, endpoints,
//! diagnostics) and execd through the server's proxy (`/v1/sandboxes/{id}/proxy/44772/…`):
//! streamed commands, files and directories.
//!
//! ```no_run
//! use std::time::Duration;
//! use opensandbox_api::{Client, CreateSandbox, RunCommand, StreamOptions};
//!
//! # async fn demo() -> opensandbox_api::Result<()> {
//! let client = Client::from_env()?; // OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY
//! let sandbox = client
//!     .create_sandbox(
//!         &CreateSandbox::from_image("python:3.11", ["tail", "-f", "/dev/null"])
//!             .resource("cpu", "500m")
//!             .resource("memory", "512Mi"),
//!     )
//!     .await?;
//! let execd = client.execd(&sandbox.id);
//! execd.wait_until_ready(Duration::from_secs(30), Duration::from_millis(250)).await?;
//! let out = execd
//!     .run(&RunCommand::shell("echo hello"), StreamOptions::default())
//!     .await?
//!     .collect_output(1 << 20)
//!     .await?;
//! assert!(out.exit.success());
//! client.delete_sandbox(&sandbox.id).await?;
//! # Ok(()) }
//! ```
//!
//! See the crate README for the transport rules: the key and its header, plain `http`,
//! redirects, retries, bounds and lenient decoding.

mod client;
pub use client::*;
mod config;
pub use config::*;
mod diagnostics;
pub use diagnostics::*;
mod error;
pub use error::*;
mod exec;
pub use exec::*;
mod files;
pub use files::*;
mod frames;
pub use frames::*;
mod models;
pub use models::*;
mod multipart;
mod retry;
pub use retry::*;
mod scrub;
pub use scrub::{MAX_SNIPPET_CHARS, REDACTED, escape_line};
mod transport;
pub use transport::API_KEY_HEADER;
mod wire;
pub use wire::{MAX_ID_BYTES, is_server_id, parse_timestamp};

pub use reqwest::{Method, StatusCode};
pub use secrecy::SecretString;
pub use time::OffsetDateTime;
