//! Policy and guest lifecycle for running untrusted code in disposable CreateOS microVMs.
//!
//! This crate decides *whether* and *how* code runs, independent of Langflow:
//!
//! - [`settings`]: typed settings from an environment lookup; a bad value names its variable.
//! - [`egress`]: the deny-all spelling, hostname refusal, the link-local opt-in, read-back
//!   comparison, and strict address-rule validation.
//! - [`gateway`]: domain allowlists through the egress gateway (its settings, the egress and
//!   the proxy environment of a domains run).
//! - [`shapes`]: shape selection that never rounds down.
//! - [`names`]: one-shot names minted before create, and stable derived names.
//! - [`guest`]: the guest handle and the primitives every surface composes (create, acquire
//!   by name, upload, egress read-back, exec stream, capture, download, destroy or release).
//! - [`session`]: the per-account client cache, credential check and shape catalog shared by
//!   every surface of a process, and its [`admission`] control (caps on live guests, fair
//!   waits).
//! - [`classify`]: the one classification (and wording) of failed control-plane calls.
//! - [`reaper`]: a registry of guests with guards whose drop guarantees destroy.
//! - [`orphans`]: finding and deleting paused one-shot guests that a dead process left.
//! - [`pool`]: a warm pool of one-shot guests, created and verified ahead of the runs.
//! - [`plan`]: the decisions every surface makes before any I/O, made once: the network (egress,
//!   domains, the gateway grant) and how a core error is raised.
//! - [`surface`]: the surface kit every surface is built on: shared options, the one acquire
//!   path (pool, create or acquire by name, the fallback from a pooled guest that refused, the
//!   fork rule) and the lease that ends a run's guest.
//! - [`timings`]: where a run's time went, phase by phase, one type for every surface.
//! - [`output`], [`exec`], [`retry`], [`error`], [`vars`], [`kind`]: the pieces those are
//!   built from.
//! - [`withheld`]: what configures this plugin, withheld from every guest by name and by
//!   value.
//! - [`provider`]: the provider seam, what a sandbox provider must offer the surfaces in
//!   provider-neutral terms; [`provider::createos`] is CreateOS behind it; the self-hosted
//!   OpenSandbox server (issue 41) is the `sandbox-opensandbox` crate's.
//! - [`control`]: CreateOS's control-plane operations as an object-safe trait (test doubles
//!   implement it); the `sandbox-createos` crate implements it over `createos-api` and installs
//!   it as the session's connector ([`session::install_connector`]).

pub mod admission;
pub mod classify;
pub mod control;
pub mod egress;
pub mod error;
pub mod exec;
pub mod gateway;
pub mod guest;
pub mod kind;
pub mod lease;
pub mod names;
pub mod observe;
pub mod observed;
pub mod orphans;
pub mod output;
pub mod plan;
pub mod pool;
pub mod provider;
pub mod reaper;
pub mod retry;
pub mod session;
pub mod settings;
pub mod shapes;
pub mod surface;
pub mod timings;
pub mod vars;
pub mod withheld;

pub use error::{ErrorKind, Redactor, SandboxError};
/// The CreateOS provider under its first name: [`createos::CreateOs`] over a control plane (the
/// `createos-api` client is the `sandbox-createos` crate's).
pub use provider::createos;

/// The `tracing` target of every event this crate and its surfaces emit.
pub const LOG_TARGET: &str = "langflow_sandbox_createos";
