//! The credential a CreateOS guest shows the egress gateway, and the host allowlist it carries.
//!
//! Two parties use it and neither should carry the other's weight: the sandbox core mints a
//! credential for each guest it grants domains to, and the egress gateway (an HTTP proxy with a
//! server's dependencies) checks it on every connection. This crate is the contract between
//! them, with nothing but hashing and name normalisation underneath:
//!
//! - [`allowlist`]: host names in their one normal form ([`allowlist::normalize_host`]), the
//!   patterns a credential lists (`pypi.org`, `*.example.com:8443`) and the match.
//! - [`token`]: the wire form, [`mint`] and [`verify`] (an HMAC-SHA256 over the guest, its list
//!   and an expiry, with a secret both sides share, compared in constant time).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use egress_credential::allowlist::Decision;
//! use egress_credential::{Secret, mint, verify};
//!
//! let secret = Secret::new(vec![7u8; 32]).expect("32 bytes or more");
//! let token = mint(&secret, "lf-x-guest", &["pypi.org"], Duration::from_secs(60)).expect("token");
//! let credential = verify(&secret, &token, SystemTime::now()).expect("valid");
//! assert_eq!(credential.guest, "lf-x-guest");
//! assert_eq!(credential.allowlist.decide("pypi.org", 443), Decision::Allowed);
//! assert_ne!(credential.allowlist.decide("evil.test", 443), Decision::Allowed);
//! ```

pub mod allowlist;
pub mod token;

pub use token::{Credential, Secret, TokenError, mint, mint_until, verify};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
