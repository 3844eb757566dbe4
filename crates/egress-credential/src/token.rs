//! Credentials without shared state: short-lived tokens signed with a secret the plugin and
//! the gateway share.
//!
//! A token names the guest it was minted for, that guest's allowlist and an expiry, and carries
//! an HMAC-SHA256 over all of them. The gateway keeps no table of guests: any replica that knows
//! the secret can check a token on its own, and a guest cannot change its list or its expiry
//! without breaking the MAC (checked in constant time).
//!
//! Wire form: `base64url(payload || mac)` without padding, so it is safe in a URL's userinfo
//! (`http://run:TOKEN@gateway:3128`). The payload is binary:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version ([`VERSION`]) |
//! | 8 | expiry, seconds since the Unix epoch, big-endian |
//! | 1 + n | guest (length, then ASCII) |
//! | 1 | number of allowlist entries |
//! | (1 + n) each | entry (length, then its normal form, `*.name:port` style) |
//!
//! The MAC input is [`MAC_CONTEXT`] followed by the payload, so a MAC made for anything else
//! with the same secret is never a valid token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;

use crate::allowlist::{Allowlist, HostError};

/// The environment variable both sides read the shared secret from.
pub const SECRET_ENV: &str = "CREATEOS_GATEWAY_SECRET";
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;
/// The token format this build mints and accepts.
pub const VERSION: u8 = 1;
/// Prefix of every MAC input (domain separation).
pub const MAC_CONTEXT: &[u8] = b"createos-egress-gateway token v1\0";
/// The longest lifetime a token may be minted with, or carry when checked.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most allowlist entries one token carries.
pub const MAX_ENTRIES: usize = 64;
/// The longest guest name or id, in bytes.
pub const MAX_GUEST: usize = 128;
/// The longest token accepted, in characters (checked before decoding).
pub const MAX_TOKEN_CHARS: usize = 4096;

/// The length of a token's MAC (HMAC-SHA256), and so of [`Credential::id`].
pub const MAC_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Why a secret, a mint or a token was refused. No variant carries the secret or the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// `CREATEOS_GATEWAY_SECRET` is not set.
    #[error(
        "{SECRET_ENV} is not set: set it to a random secret of at least {MIN_SECRET_BYTES} bytes (e.g. `openssl rand -hex 32`), the same for the plugin and the gateway"
    )]
    SecretMissing,
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "{SECRET_ENV} is {0} bytes long: it needs at least {MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32`)"
    )]
    SecretTooShort(usize),
    /// The secret is not valid Unicode (UTF-8 on Unix, UTF-16 on Windows).
    #[error(
        "{SECRET_ENV} is not valid Unicode: both sides read it as text, so set it to printable characters (e.g. the 64 hex digits of `openssl rand -hex 32`)"
    )]
    SecretNotUnicode,
    /// The guest name is empty, too long or has characters outside `[A-Za-z0-9._:-]`.
    #[error(
        "the guest name must be 1 to {MAX_GUEST} characters of letters, digits, `.`, `_`, `:` and `-`"
    )]
    BadGuest,
    /// No allowlist entry: a token that allows nothing is never minted.
    #[error("the allowlist is empty")]
    EmptyAllowlist,
    /// More than [`MAX_ENTRIES`] entries.
    #[error("the allowlist has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    /// An entry that is not a valid pattern.
    #[error("allowlist entry {index} is not valid: {error}")]
    BadEntry {
        /// Its position in the list.
        index: usize,
        /// What is wrong with it.
        error: HostError,
    },
    /// The token would be longer than [`MAX_TOKEN_CHARS`] (too many long entries).
    #[error("the allowlist is too long for one token (at most {MAX_TOKEN_CHARS} characters)")]
    TooLarge,
    /// A lifetime of zero or above [`MAX_TTL`].
    #[error("the token lifetime must be between 1 s and {} s", MAX_TTL.as_secs())]
    BadTtl,
    /// Not a token of this format (bad encoding, lengths that do not add up, too long).
    #[error("malformed token")]
    Malformed,
    /// The MAC does not match: altered, or signed with another secret.
    #[error("token signature does not match")]
    BadSignature,
    /// A version this build does not know.
    #[error("unsupported token version")]
    UnsupportedVersion,
    /// Past its expiry.
    #[error("token expired")]
    Expired,
}

/// The shared secret. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(SecretSlice<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A secret from raw bytes; at least [`MIN_SECRET_BYTES`] of them.
    pub fn new(bytes: Vec<u8>) -> Result<Self, TokenError> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(TokenError::SecretTooShort(bytes.len()));
        }
        Ok(Self(SecretSlice::from(bytes)))
    }

    /// The secret from [`SECRET_ENV`]: the UTF-8 bytes of its text (e.g. 64 hex characters).
    pub fn from_env() -> Result<Self, TokenError> {
        Self::from_env_value(std::env::var_os(SECRET_ENV))
    }

    /// The secret from the value [`SECRET_ENV`] has (`None`: unset), as [`Secret::from_env`]
    /// reads it.
    ///
    /// The value must be Unicode, on every platform: the plugin reads the same variable as
    /// text (a value that is not Unicode is invisible to it), and a text secret is the same
    /// bytes on Linux, macOS and Windows, so a gateway on one and a plugin on another agree.
    /// An environment value is bytes on Unix and UTF-16 on Windows; taking its raw form would
    /// give each platform a different secret for the same setting.
    pub fn from_env_value(value: Option<std::ffi::OsString>) -> Result<Self, TokenError> {
        match value {
            None => Err(TokenError::SecretMissing),
            Some(value) if value.is_empty() => Err(TokenError::SecretMissing),
            Some(value) => match value.into_string() {
                Ok(text) => Self::new(text.into_bytes()),
                Err(_) => Err(TokenError::SecretNotUnicode),
            },
        }
    }

    fn mac(&self) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(self.0.expose_secret())
            .expect("HMAC accepts keys of any length");
        mac.update(MAC_CONTEXT);
        mac
    }
}

/// A checked token: who it was minted for and what it allows.
#[derive(Debug, Clone)]
pub struct Credential {
    /// The guest (name or id) the token was minted for.
    pub guest: String,
    /// Its allowlist.
    pub allowlist: Allowlist,
    /// When it stops being accepted.
    pub expires_at: SystemTime,
    /// The token's MAC: a stable identity for per-credential limits (not secret on its own,
    /// never logged).
    id: [u8; MAC_LEN],
}

impl Credential {
    /// The token's MAC: one key per credential for the gateway's per-credential limits (two
    /// tokens minted alike are still two credentials). Not secret on its own; never logged.
    pub fn id(&self) -> [u8; MAC_LEN] {
        self.id
    }
}

fn valid_guest(guest: &str) -> bool {
    !guest.is_empty()
        && guest.len() <= MAX_GUEST
        && guest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Mints a token for `guest` that allows `allowlist` for `ttl` from now.
///
/// Entries are validated and stored in their normal form ([`Allowlist`]); an empty list, an
/// invalid entry, a bad guest name or a lifetime outside 1 s to [`MAX_TTL`] is an error.
pub fn mint<S: AsRef<str>>(
    secret: &Secret,
    guest: &str,
    allowlist: &[S],
    ttl: Duration,
) -> Result<String, TokenError> {
    if ttl < Duration::from_secs(1) || ttl > MAX_TTL {
        return Err(TokenError::BadTtl);
    }
    mint_until(secret, guest, allowlist, SystemTime::now() + ttl)
}

/// Mints a token that expires at `expires_at` (which may be in the past: tests use that to
/// make an expired token). [`mint`] is the usual entry point.
pub fn mint_until<S: AsRef<str>>(
    secret: &Secret,
    guest: &str,
    allowlist: &[S],
    expires_at: SystemTime,
) -> Result<String, TokenError> {
    if !valid_guest(guest) {
        return Err(TokenError::BadGuest);
    }
    if allowlist.is_empty() {
        return Err(TokenError::EmptyAllowlist);
    }
    if allowlist.len() > MAX_ENTRIES {
        return Err(TokenError::TooManyEntries);
    }
    let parsed = Allowlist::parse(allowlist)
        .map_err(|(index, error)| TokenError::BadEntry { index, error })?;
    let mut payload = vec![VERSION];
    payload.extend(unix_secs(expires_at).to_be_bytes());
    push_field(&mut payload, guest.as_bytes());
    payload.push(u8::try_from(parsed.patterns().len()).map_err(|_| TokenError::TooManyEntries)?);
    for pattern in parsed.patterns() {
        push_field(&mut payload, pattern.to_string().as_bytes());
    }
    let mut mac = secret.mac();
    mac.update(&payload);
    payload.extend(mac.finalize().into_bytes());
    let token = URL_SAFE_NO_PAD.encode(payload);
    if token.len() > MAX_TOKEN_CHARS {
        return Err(TokenError::TooLarge);
    }
    Ok(token)
}

/// Appends a one-byte length and the bytes (callers keep fields under 256 bytes: guest names
/// by [`MAX_GUEST`], patterns by the DNS name limit).
fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    out.push(u8::try_from(field.len()).expect("fields are shorter than 256 bytes"));
    out.extend_from_slice(field);
}

/// Checks a token at time `now`: its encoding, its MAC (constant time, before anything in the
/// payload is trusted), its version and its expiry; returns what it grants.
pub fn verify(secret: &Secret, token: &str, now: SystemTime) -> Result<Credential, TokenError> {
    if token.is_empty() || token.len() > MAX_TOKEN_CHARS {
        return Err(TokenError::Malformed);
    }
    let raw = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| TokenError::Malformed)?;
    if raw.len() < 1 + 8 + MAC_LEN {
        return Err(TokenError::Malformed);
    }
    let (payload, tag) = raw.split_at(raw.len() - MAC_LEN);
    if !mac_matches(secret, payload, tag) {
        return Err(TokenError::BadSignature);
    }
    let mut id = [0; MAC_LEN];
    id.copy_from_slice(tag);
    // Authentic from here on; still parsed with bounds, as a bug elsewhere must not panic here.
    let mut rest = payload;
    let version = take(&mut rest, 1)?[0];
    if version != VERSION {
        return Err(TokenError::UnsupportedVersion);
    }
    let mut expiry = [0; 8];
    expiry.copy_from_slice(take(&mut rest, 8)?);
    let expires_at = UNIX_EPOCH + Duration::from_secs(u64::from_be_bytes(expiry));
    if now >= expires_at {
        return Err(TokenError::Expired);
    }
    if expires_at.duration_since(now).unwrap_or_default() > MAX_TTL + Duration::from_secs(60) {
        return Err(TokenError::Malformed);
    }
    let guest = std::str::from_utf8(field(&mut rest)?)
        .ok()
        .filter(|g| valid_guest(g))
        .ok_or(TokenError::Malformed)?
        .to_owned();
    let count = usize::from(take(&mut rest, 1)?[0]);
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(std::str::from_utf8(field(&mut rest)?).map_err(|_| TokenError::Malformed)?);
    }
    if !rest.is_empty() || entries.is_empty() {
        return Err(TokenError::Malformed);
    }
    let allowlist = Allowlist::parse(&entries).map_err(|_| TokenError::Malformed)?;
    Ok(Credential {
        guest,
        allowlist,
        expires_at,
        id,
    })
}

/// Whether `tag` is the MAC of `payload`. The comparison is `hmac`'s `verify_slice`, which
/// compares in constant time (`subtle::ConstantTimeEq`): how long it takes does not depend on
/// where a wrong tag first differs, so a guest cannot find a valid MAC byte by byte. Never
/// compare the tag with `==`.
fn mac_matches(secret: &Secret, payload: &[u8], tag: &[u8]) -> bool {
    let mut mac = secret.mac();
    mac.update(payload);
    mac.verify_slice(tag).is_ok()
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], TokenError> {
    if rest.len() < n {
        return Err(TokenError::Malformed);
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn field<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], TokenError> {
    let n = usize::from(take(rest, 1)?[0]);
    take(rest, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allowlist::Decision;

    fn secret(byte: u8) -> Secret {
        Secret::new(vec![byte; 32]).unwrap()
    }

    #[test]
    fn the_environment_secret_is_the_utf8_of_its_text() {
        let text = "0123456789abcdef0123456789abcdef-é";
        let from_env = Secret::from_env_value(Some(text.into())).unwrap();
        let direct = Secret::new(text.as_bytes().to_vec()).unwrap();
        let token = mint(&from_env, "g", &["pypi.org"], Duration::from_secs(60)).unwrap();
        // The same text gives the same key: a token minted with one verifies with the other.
        verify(&direct, &token, SystemTime::now()).unwrap();
    }

    #[test]
    fn an_unset_empty_or_short_environment_secret_is_refused_by_name() {
        for value in [None, Some(std::ffi::OsString::new())] {
            let err = Secret::from_env_value(value).unwrap_err();
            assert_eq!(err, TokenError::SecretMissing);
            assert!(err.to_string().contains(SECRET_ENV), "{err}");
        }
        let err = Secret::from_env_value(Some("short".into())).unwrap_err();
        assert_eq!(err, TokenError::SecretTooShort(5));
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_that_is_not_unicode_is_refused_by_name_without_its_bytes() {
        use std::os::unix::ffi::OsStringExt as _;
        let mut raw = vec![b'k'; 40];
        raw[3] = 0xff;
        let err = Secret::from_env_value(Some(std::ffi::OsString::from_vec(raw))).unwrap_err();
        assert_eq!(err, TokenError::SecretNotUnicode);
        let shown = err.to_string();
        assert!(shown.contains(SECRET_ENV), "{shown}");
        assert!(!shown.contains("kkk"), "{shown}");
    }

    #[test]
    fn a_minted_token_verifies_and_grants_exactly_its_list() {
        let s = secret(1);
        let token = mint(
            &s,
            "lf-run-7",
            &["PyPI.org", "*.pythonhosted.org"],
            Duration::from_secs(60),
        )
        .unwrap();
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let cred = verify(&s, &token, SystemTime::now()).unwrap();
        assert_eq!(cred.guest, "lf-run-7");
        let shown: Vec<String> = cred
            .allowlist
            .patterns()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown, ["pypi.org", "*.pythonhosted.org"]);
        assert_eq!(
            cred.allowlist.decide("files.pythonhosted.org", 443),
            Decision::Allowed
        );
        assert_eq!(
            cred.allowlist.decide("example.com", 443),
            Decision::HostNotAllowed
        );
        assert!(cred.expires_at > SystemTime::now());
    }

    #[test]
    fn expiry_is_enforced() {
        let s = secret(1);
        let token = mint(&s, "g", &["pypi.org"], Duration::from_secs(30)).unwrap();
        let later = SystemTime::now() + Duration::from_secs(31);
        assert_eq!(verify(&s, &token, later).unwrap_err(), TokenError::Expired);
        let past = mint_until(
            &s,
            "g",
            &["pypi.org"],
            SystemTime::now() - Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(
            verify(&s, &past, SystemTime::now()).unwrap_err(),
            TokenError::Expired
        );
    }

    #[test]
    fn any_altered_byte_or_another_secret_is_refused() {
        let s = secret(1);
        let token = mint(&s, "g", &["pypi.org"], Duration::from_secs(60)).unwrap();
        let raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            let err = verify(&s, &URL_SAFE_NO_PAD.encode(&bad), SystemTime::now()).unwrap_err();
            assert_eq!(err, TokenError::BadSignature, "byte {i}");
        }
        assert_eq!(
            verify(&secret(2), &token, SystemTime::now()).unwrap_err(),
            TokenError::BadSignature
        );
    }

    #[test]
    fn a_guest_cannot_widen_its_list_or_extend_its_expiry() {
        let s = secret(1);
        let token = mint(&s, "g", &["pypi.org"], Duration::from_secs(60)).unwrap();
        let raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
        let (payload, tag) = raw.split_at(raw.len() - 32);
        // Swap the entry for a wildcard of the same length, keep the MAC.
        let mut widened = payload.to_vec();
        let at = widened.windows(8).position(|w| w == b"pypi.org").unwrap();
        widened[at..at + 8].copy_from_slice(b"*.py.org");
        widened.extend(tag);
        assert_eq!(
            verify(&s, &URL_SAFE_NO_PAD.encode(&widened), SystemTime::now()).unwrap_err(),
            TokenError::BadSignature
        );
        // Push the expiry a year out, keep the MAC.
        let mut extended = payload.to_vec();
        extended[1..9].copy_from_slice(&(unix_secs(SystemTime::now()) + 365 * 86400).to_be_bytes());
        extended.extend(tag);
        assert_eq!(
            verify(&s, &URL_SAFE_NO_PAD.encode(&extended), SystemTime::now()).unwrap_err(),
            TokenError::BadSignature
        );
        // Append an entry, keep the MAC.
        let mut appended = payload.to_vec();
        appended.extend([9]);
        appended.extend(b"evil.test");
        appended.extend(tag);
        assert_eq!(
            verify(&s, &URL_SAFE_NO_PAD.encode(&appended), SystemTime::now()).unwrap_err(),
            TokenError::BadSignature
        );
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let s = secret(1);
        for bad in [
            "",
            "!!!",
            "a",
            &"A".repeat(MAX_TOKEN_CHARS + 1),
            "AAAA",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
        ] {
            assert!(matches!(
                verify(&s, bad, SystemTime::now()),
                Err(TokenError::Malformed | TokenError::BadSignature)
            ));
        }
        // A correctly signed payload of another version, or with trailing bytes, is refused.
        let mut payload = vec![2];
        payload.extend((unix_secs(SystemTime::now()) + 60).to_be_bytes());
        payload.extend([1, b'g', 1, 8]);
        payload.extend(b"pypi.org");
        let sign = |p: &[u8]| {
            let mut mac = s.mac();
            mac.update(p);
            let mut out = p.to_vec();
            out.extend(mac.finalize().into_bytes());
            URL_SAFE_NO_PAD.encode(out)
        };
        assert_eq!(
            verify(&s, &sign(&payload), SystemTime::now()).unwrap_err(),
            TokenError::UnsupportedVersion
        );
        payload[0] = VERSION;
        assert!(verify(&s, &sign(&payload), SystemTime::now()).is_ok());
        payload.push(0);
        assert_eq!(
            verify(&s, &sign(&payload), SystemTime::now()).unwrap_err(),
            TokenError::Malformed
        );
    }

    #[test]
    fn minting_refuses_what_would_be_unsafe_or_useless() {
        let s = secret(1);
        let ttl = Duration::from_secs(60);
        assert_eq!(
            Secret::new(vec![0; 31]).unwrap_err(),
            TokenError::SecretTooShort(31)
        );
        assert_eq!(
            mint::<&str>(&s, "g", &[], ttl).unwrap_err(),
            TokenError::EmptyAllowlist
        );
        assert!(matches!(
            mint(&s, "g", &["ok.example", "*"], ttl),
            Err(TokenError::BadEntry { index: 1, .. })
        ));
        assert!(matches!(
            mint(&s, "g", &["10.0.0.1"], ttl),
            Err(TokenError::BadEntry { index: 0, .. })
        ));
        for bad in ["", "has space", "new\nline", &"g".repeat(MAX_GUEST + 1)] {
            assert_eq!(
                mint(&s, bad, &["pypi.org"], ttl).unwrap_err(),
                TokenError::BadGuest
            );
        }
        assert_eq!(
            mint(&s, "g", &["pypi.org"], Duration::ZERO).unwrap_err(),
            TokenError::BadTtl
        );
        assert_eq!(
            mint(&s, "g", &["pypi.org"], MAX_TTL + Duration::from_secs(1)).unwrap_err(),
            TokenError::BadTtl
        );
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("h{i}.example")).collect();
        assert_eq!(
            mint(&s, "g", &many, ttl).unwrap_err(),
            TokenError::TooManyEntries
        );
        // A list too long for one token is refused; what fits is accepted back.
        let long: Vec<String> = (0..MAX_ENTRIES)
            .map(|i| format!("*.{}{i}.example:65535", "a".repeat(60)))
            .collect();
        assert_eq!(mint(&s, "g", &long, ttl).unwrap_err(), TokenError::TooLarge);
        let token = mint(&s, &"g".repeat(MAX_GUEST), &long[..30], ttl).unwrap();
        assert!(token.len() <= MAX_TOKEN_CHARS, "{}", token.len());
        assert!(verify(&s, &token, SystemTime::now()).is_ok());
    }

    #[test]
    fn a_wrong_mac_differing_in_its_first_or_last_byte_is_refused_alike() {
        let s = secret(1);
        let token = mint(&s, "g", &["pypi.org"], Duration::from_secs(60)).unwrap();
        let raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
        let (payload, tag) = raw.split_at(raw.len() - MAC_LEN);
        assert!(mac_matches(&s, payload, tag));
        for at in [0, MAC_LEN - 1] {
            let mut wrong = tag.to_vec();
            wrong[at] ^= 0x80;
            assert!(!mac_matches(&s, payload, &wrong), "byte {at}");
            let forged = [payload, &wrong].concat();
            assert_eq!(
                verify(&s, &URL_SAFE_NO_PAD.encode(forged), SystemTime::now()).unwrap_err(),
                TokenError::BadSignature,
                "byte {at}"
            );
        }
        // A tag of another length is never a match (no prefix comparison).
        assert!(!mac_matches(&s, payload, &tag[..MAC_LEN - 1]));
        assert!(!mac_matches(&s, payload, &[tag, &[0]].concat()));
        assert!(!mac_matches(&s, payload, &[]));
    }

    #[test]
    fn the_mac_is_compared_in_constant_time_and_nowhere_else() {
        // By structure: the one comparison of a tag is `hmac`'s constant-time `verify_slice`,
        // inside `mac_matches`, which `verify` calls. A `==` on a tag or a MAC output would be
        // a timing oracle; this source must hold none.
        let source = include_str!("token.rs");
        let code: String = source
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let code = code.split("#[cfg(test)]").next().unwrap();
        assert_eq!(code.matches("verify_slice(tag)").count(), 1);
        assert!(code.contains("if !mac_matches(secret, payload, tag)"));
        for oracle in ["== tag", "tag ==", "into_bytes() ==", "== mac", "ct_eq"] {
            assert!(!code.contains(oracle), "{oracle:?} in token.rs");
        }
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let s = Secret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
    }
}
