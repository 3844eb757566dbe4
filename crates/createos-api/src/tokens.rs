//! Sandbox access tokens (`/v1/sandboxes/{id}/access-token`) and delegated handles.
//!
//! The owner of a sandbox can mint one token for it and hand that token to a worker. The worker
//! builds a delegated handle with [`Sandbox::with_access_token`]; the token travels in the same
//! `X-Api-Key` header the owner key would, and can only operate its own sandbox. Token
//! management itself always needs the owner key.

use std::fmt;
use std::sync::Arc;

use reqwest::Method;
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;

use crate::transport::seg;
use crate::{Error, RequestOptions, Result, Sandbox};

/// Prefix every delegated sandbox token carries.
pub const ACCESS_TOKEN_PREFIX: &str = "skp_sb_";

/// A freshly created or rotated access token. The plaintext is returned only by create and
/// rotate, is held as a [`SecretString`], and never appears in `Debug` output.
#[derive(Clone)]
#[non_exhaustive]
pub struct AccessToken {
    /// The plaintext token (`skp_sb_…`). Expose it only to hand it to the worker.
    pub token: SecretString,
    /// Whether the token is enabled.
    pub enabled: bool,
    /// When the token was created (RFC 3339).
    pub created_at: String,
    /// When it was last rotated (RFC 3339).
    pub rotated_at: Option<String>,
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessToken")
            .field("token", &"[REDACTED]")
            .field("enabled", &self.enabled)
            .field("created_at", &self.created_at)
            .field("rotated_at", &self.rotated_at)
            .finish()
    }
}

/// The wire shape of create/rotate; `token`, `enabled` and `created_at` are required.
#[derive(Deserialize)]
struct AccessTokenWire {
    token: String,
    enabled: bool,
    created_at: String,
    #[serde(default)]
    rotated_at: Option<String>,
}

impl From<AccessTokenWire> for AccessToken {
    fn from(wire: AccessTokenWire) -> Self {
        Self {
            token: SecretString::from(wire.token),
            enabled: wire.enabled,
            created_at: wire.created_at,
            rotated_at: wire.rotated_at,
        }
    }
}

/// What the owner can see about a sandbox's token after creation: never the plaintext.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct AccessTokenMetadata {
    /// Whether a token is enabled (required on the wire).
    pub enabled: bool,
    /// A redacted hint such as `skp_sb...irst`.
    #[serde(default)]
    pub token_hint: Option<String>,
    /// When the token was created.
    #[serde(default)]
    pub created_at: Option<String>,
    /// When it was last rotated.
    #[serde(default)]
    pub rotated_at: Option<String>,
}

/// Checks the shape of a delegated token without revealing it: not blank, `skp_sb_` followed by
/// at least one character, no whitespace or control characters.
pub fn validate_access_token(token: &str) -> Result<()> {
    if token.trim().is_empty() {
        return Err(Error::InvalidArgument(
            "access token must not be blank".into(),
        ));
    }
    let Some(rest) = token.strip_prefix(ACCESS_TOKEN_PREFIX) else {
        return Err(Error::InvalidArgument(format!(
            "access token must start with `{ACCESS_TOKEN_PREFIX}`"
        )));
    };
    if rest.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "access token has nothing after `{ACCESS_TOKEN_PREFIX}`"
        )));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::InvalidArgument(
            "access token must not contain whitespace or control characters".into(),
        ));
    }
    Ok(())
}

impl Sandbox {
    fn access_token_path(&self, tail: &str) -> String {
        format!("/v1/sandboxes/{}/access-token{tail}", seg(self.id()))
    }

    /// Creates this sandbox's access token (owner key required). The plaintext is returned only
    /// here and by [`Sandbox::rotate_access_token`]. A second create while a token is enabled
    /// fails with HTTP 409.
    pub async fn create_access_token(&self) -> Result<AccessToken> {
        let wire: AccessTokenWire = self
            .transport()
            .json(
                Method::POST,
                &self.access_token_path(""),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await?;
        Ok(wire.into())
    }

    /// Reads the token's metadata (enabled flag and a redacted hint).
    pub async fn get_access_token(&self) -> Result<AccessTokenMetadata> {
        self.transport()
            .json(
                Method::GET,
                &self.access_token_path(""),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await
    }

    /// Replaces the token with a new one and returns its plaintext; the old token stops working.
    /// Fails with HTTP 404 when there is no token.
    pub async fn rotate_access_token(&self) -> Result<AccessToken> {
        let wire: AccessTokenWire = self
            .transport()
            .json(
                Method::POST,
                &self.access_token_path("/rotate"),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await?;
        Ok(wire.into())
    }

    /// Disables the token (idempotent) and returns the resulting metadata.
    pub async fn disable_access_token(&self) -> Result<AccessTokenMetadata> {
        self.transport()
            .json(
                Method::DELETE,
                &self.access_token_path(""),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await
    }

    /// A handle on the same sandbox that authenticates with the delegated `token` instead of
    /// this handle's credential. It shares the HTTP pool, timeout and retry settings, and has
    /// its own service objects. A blank or malformed token is refused before anything is sent.
    pub fn with_access_token(&self, token: impl Into<SecretString>) -> Result<Sandbox> {
        let token: SecretString = token.into();
        let trimmed = token.expose_secret().trim();
        validate_access_token(trimmed)?;
        let credential = SecretString::from(trimmed.to_owned());
        Ok(self.with_transport(Arc::new(self.transport().with_credential(credential))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape_is_checked() {
        assert!(validate_access_token("skp_sb_first").is_ok());
        for bad in [
            "",
            "   ",
            "skp_sb_",
            "sk_live_x",
            "skp_sb_a b",
            "Bearer skp_sb_x",
        ] {
            let err = validate_access_token(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}");
            assert!(
                !err.to_string().contains("skp_sb_a b"),
                "the message must not echo the token"
            );
        }
    }

    #[test]
    fn plaintext_never_in_debug() {
        let wire: AccessTokenWire = serde_json::from_value(serde_json::json!({
            "token": "skp_sb_supersecret", "enabled": true, "created_at": "2026-01-01T00:00:00Z"
        }))
        .unwrap();
        let token = AccessToken::from(wire);
        let debug = format!("{token:?} {token:#?}");
        assert!(!debug.contains("supersecret"), "{debug}");
        assert!(debug.contains("REDACTED"));
        assert_eq!(token.token.expose_secret(), "skp_sb_supersecret");
    }

    #[test]
    fn create_requires_token_enabled_and_created_at() {
        for missing in ["token", "enabled", "created_at"] {
            let mut value = serde_json::json!({
                "token": "skp_sb_x", "enabled": true, "created_at": "2026-01-01T00:00:00Z"
            });
            value.as_object_mut().unwrap().remove(missing);
            assert!(
                serde_json::from_value::<AccessTokenWire>(value).is_err(),
                "{missing}"
            );
        }
        assert!(
            serde_json::from_value::<AccessTokenMetadata>(serde_json::json!({"token_hint": "x"}))
                .is_err()
        );
        let meta: AccessTokenMetadata =
            serde_json::from_value(serde_json::json!({"enabled": false})).unwrap();
        assert!(!meta.enabled && meta.token_hint.is_none());
    }
}
