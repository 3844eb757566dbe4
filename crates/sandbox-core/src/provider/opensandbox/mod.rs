//! The OpenSandbox provider (issue 41): a self-hosted OpenSandbox server behind
//! [`super::Provider`], over `opensandbox-api`.
//!
//! Placeholder: the `osprov` branch fills this module (the `OpenSandbox` type and its gates:
//! isolation attestation and probe, the `dns+nft` read-back, the host-mode canary, nonce
//! adoption on create, `/ping` after `Running`, clamped renew, retried delete).
