//! A filtering egress gateway for CreateOS guests: "let this code reach `PyPI` and nothing else".
//!
//! CreateOS enforces egress rules made of addresses (`IP:port`, CIDR) and accepts, but does not
//! enforce, host names. This crate turns a list of host names into something that holds: the
//! guest's egress is limited to the gateway's `IP:port`, and the gateway, an HTTP forward
//! proxy, admits only the names the guest's credential lists.
//!
//! - [`mint`] makes a guest's credential: a short-lived token, signed with a secret the plugin
//!   and the gateway share ([`token`]), naming the guest, its allowlist and an expiry. The guest
//!   sends it as proxy credentials (`HTTPS_PROXY=http://run:TOKEN@gateway:port`).
//! - [`serve`] runs the gateway on a listener with a [`GatewayConfig`]: `CONNECT host:port` for
//!   TLS (never decrypted; every `ClientHello` sent in the clear must name the `CONNECT` host
//!   in its `server_name` and must not offer Encrypted Client Hello, see [`tls`]) and
//!   absolute-form `http://` requests (forwarded without hop-by-hop headers and
//!   without the credential). A host is admitted when the credential's [`allowlist`] names it;
//!   the gateway resolves it itself, once per connection, and connects only to public
//!   addresses that are not its own host's ([`addr`]).
//! - Bounded: connections per credential and in total, idle and total connection time, bytes
//!   per credential (metered while copying), the request head and the `ClientHello` size and
//!   time. When every slot is taken, a connection that has not sent its request head yet makes
//!   room for a new one, so idle or slow connections cannot lock other guests out.
//! - One `tracing` record per connection (target `egress_gateway::connection`): peer, guest,
//!   kind, host, port, upstream address, bytes up and down, duration, verdict and reason. The
//!   token is never logged.
//! - Stateless between requests: any replica that knows the secret admits any token. The
//!   per-credential counters live in each process's memory, so with several replicas behind
//!   one address the limits hold per replica.

pub mod addr;
pub use egress_credential::allowlist;
pub mod cli;
mod config;
#[doc(hidden)]
pub mod fuzzing;
mod server;
pub mod tls;
pub use egress_credential::token;

pub use config::GatewayConfig;
pub use server::{REASON_HEADER, serve, serve_until};
pub use token::{Credential, Secret, TokenError, mint, mint_until, verify};
