//! Typed async client for the CreateOS sandbox control plane.
//!
//! ```no_run
//! use createos_api::{Client, CreateSandboxRequest, ExecOptions, RunCommandRequest};
//!
//! # async fn demo() -> createos_api::Result<()> {
//! let client = Client::from_env()?;
//! let sandbox = client
//!     .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb").rootfs("devbox:1"))
//!     .await?;
//! let out = sandbox
//!     .run_command(RunCommandRequest::new("echo").arg("hello"), ExecOptions::default())
//!     .await?;
//! print!("{}", out.result.stdout);
//! sandbox.destroy().await?;
//! # Ok(())
//! # }
//! ```
//!
//! See the crate README for transport guarantees (credential hygiene, retries, redirects,
//! timeouts and lenient decoding).

// One `mod x; pub use x::*;` line per module: other modules plug in here.
mod client;
pub use client::*;
mod error;
pub use error::*;
mod exec;
pub use exec::*;
mod files;
pub use files::*;
mod models;
pub use models::*;
mod net;
pub use net::*;
mod options;
pub use options::*;
mod sandbox;
pub use sandbox::*;
mod processes;
pub(crate) mod transport;
pub use transport::{
    LineFramer, LineTooLong, MAX_DETAIL_CHARS, MAX_PAGES, MAX_STREAM_LINE, MIN_SECRET_FRAGMENT,
    REDACTED, Redactor, cap_detail, redact_url,
};
mod wire_enum;
pub use processes::*;
mod tokens;
pub use tokens::*;
mod templates;
pub use templates::*;
mod networks;
pub use networks::*;
mod disks;
pub use disks::*;
mod hosts;
pub use hosts::*;
mod computer;
pub use computer::*;
pub mod self_service;

pub use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
pub use reqwest::{Method, StatusCode};
pub use secrecy::SecretString;
