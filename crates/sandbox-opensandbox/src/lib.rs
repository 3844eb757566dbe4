//! The OpenSandbox provider: a self-hosted OpenSandbox 1.1.1 server, over `opensandbox-api`.
//!
//! What is OpenSandbox's lives here and nowhere else:
//!
//! - [`settings`]: `OPEN_SANDBOX_*` (the SDK's domain and key, then ours); the operator's
//!   isolation attestation and the container opt-in.
//! - [`gates`]: the checks without I/O: egress policy (deny-all, FQDN rules only) and its
//!   read-back (`dns+nft`, `deny`, the exact rules), the RuntimeClass cross-check, the
//!   in-guest probe (identity canary, gVisor, host kernel), host-network endpoints.
//! - [`lifecycle`]: create with a nonce, readiness, the checks in order before any user code,
//!   a run under two clocks and an idle deadline, destroy, renew (clamped), the orphan sweep.
//! - [`seam`]: [`OpenSandbox`], the same behind sandbox-core's [`sandbox_core::provider::Provider`].

pub mod gates;
pub mod lifecycle;
pub mod seam;
pub mod settings;

pub use gates::Egress;
pub use lifecycle::{OpenSandboxProvider, RunOutcome, Sandbox, SandboxSpec};
pub use seam::OpenSandbox;
pub use settings::OpenSandboxSettings;
