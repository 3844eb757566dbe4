//! Entry points for the fuzz targets in `fuzz/` (`scripts/fuzz-gateway`): the gateway's
//! parsers on arbitrary bytes, with the properties they must keep checked here, so that a
//! broken property is a panic (a crash to libFuzzer). Not an API: hidden from the docs and free
//! to change.
//!
//! - [`serve_bytes`]: one connection that sends the input, served in memory by the gateway's
//!   own connection handler (hyper's HTTP/1 parser, then every check: framing, target,
//!   credential, allowlist, limits, resolution). Its resolver answers only non-public addresses
//!   and nothing else resolves, so no input can be admitted: any `200` is a bypass.
//! - [`request_target`]: the `CONNECT` and absolute-URI target check alone.
//! - [`proxy_authorization`]: the credential check of one `Proxy-Authorization` value.
//! - [`client_hello`]: the `ClientHello` reader, whole and by prefixes; and the same bytes
//!   through what reads a handshake after a `HelloRetryRequest` (the server's side, split
//!   every way, and the client's second hello).
//!
//! Inputs may hold [`TOKEN_PLACEHOLDER`], replaced by a valid token before use, so the fuzzer
//! gets past the credential check without forging a MAC.

use std::sync::OnceLock;
use std::time::Duration;

use crate::allowlist::{Pattern, normalize_host};
use crate::config::GatewayConfig;
use crate::server::Harness;
use crate::tls::{
    AfterRetry, HelloError, MAX_HELLO_BYTES, RetryWatch, after_retry, parse_client_hello,
};
use crate::token::{Secret, mint};

/// Replaced in every input by a valid token for [`ALLOWLIST`] (guest `fuzz`).
pub const TOKEN_PLACEHOLDER: &[u8] = b"@T@";

/// What the fuzzing token allows.
pub const ALLOWLIST: [&str; 3] = ["pkg.test", "*.pkg.test", "pkg.test:8443"];

/// The names the harness resolves, each to addresses the gateway never connects to.
const NAMES: [(&str, &str); 3] = [
    ("pkg.test", "127.0.0.1"),
    ("a.pkg.test", "169.254.169.254"),
    ("b.pkg.test", "::ffff:10.0.0.1"),
];

struct State {
    harness: Harness,
    token: String,
    basic: String,
    runtime: tokio::runtime::Runtime,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let secret = Secret::new(b"egress-gateway fuzzing secret, 32 bytes+".to_vec())
            .expect("a long secret");
        let token = mint(
            &secret,
            "fuzz",
            &ALLOWLIST,
            Duration::from_secs(7 * 24 * 3600),
        )
        .expect("a valid token");
        let mut config = GatewayConfig::new(secret)
            .with_test_only_resolver(
                NAMES
                    .iter()
                    .map(|(n, ip)| ((*n).to_owned(), vec![ip.parse().expect("an address")])),
            )
            .expect("valid names");
        config.handshake_timeout = Duration::from_secs(1);
        config.connect_timeout = Duration::from_secs(1);
        config.idle_timeout = Duration::from_secs(1);
        let basic = {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(format!("run:{token}"))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        State {
            harness: Harness::new(config),
            token,
            basic,
            runtime,
        }
    })
}

/// `input` with every [`TOKEN_PLACEHOLDER`] replaced by `with`.
fn substitute(input: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() + with.len());
    let mut rest = input;
    while let Some(at) = rest
        .windows(TOKEN_PLACEHOLDER.len())
        .position(|w| w == TOKEN_PLACEHOLDER)
    {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + TOKEN_PLACEHOLDER.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The status code of an HTTP/1 answer, if it starts with a status line.
fn status(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\r').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let rest = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))?;
    rest.get(..3)?.parse().ok()
}

/// One connection sending `input` (with [`TOKEN_PLACEHOLDER`] as the `Basic` credential's
/// base64, `run:TOKEN`), served in memory. Panics when a property breaks: an answer that is
/// not HTTP, an admission (`2xx`), an attempt to connect, or the token in the answer.
pub fn serve_bytes(input: &[u8]) -> Vec<u8> {
    let st = state();
    let input = substitute(input, st.basic.as_bytes());
    let answer = st.runtime.block_on(st.harness.serve(&input));
    if answer.is_empty() {
        return answer;
    }
    let code = status(&answer).unwrap_or_else(|| {
        panic!(
            "an answer that is not HTTP: {:?}",
            String::from_utf8_lossy(&answer)
        )
    });
    assert!(
        !(200..300).contains(&code),
        "admitted with nowhere to connect to: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let text = String::from_utf8_lossy(&answer);
    assert!(
        !text.contains("connect_failed") && !text.contains("connect_timeout"),
        "tried to connect: {text:?}"
    );
    assert!(
        !text.contains(&st.token) && !text.contains(&st.basic),
        "the token in an answer"
    );
    answer
}

/// The target check on `method` and `target`; panics when an admitted host is not in its
/// normal form or the port is zero.
pub fn request_target(method: &[u8], target: &[u8]) -> Result<(String, u16), &'static str> {
    let got = Harness::target(method, target);
    if let Ok((host, port)) = &got {
        assert_ne!(*port, 0, "port 0 admitted");
        assert_eq!(
            normalize_host(host).as_deref(),
            Ok(host.as_str()),
            "a target host not in its normal form"
        );
    }
    got
}

/// The credential check of one `Proxy-Authorization` value (with [`TOKEN_PLACEHOLDER`] as the
/// `Basic` credential's base64, `run:TOKEN`); panics when a credential of another guest than
/// the fuzzing token's is accepted (a forged MAC) or the answer is inconsistent.
pub fn proxy_authorization(value: &[u8]) -> Result<String, &'static str> {
    let st = state();
    let value = substitute(value, st.basic.as_bytes());
    let got = st.harness.credential(&value);
    match &got {
        Ok(guest) => assert_eq!(guest, "fuzz", "a credential no token of ours carries"),
        Err(code) => assert!(
            [
                "bad_header",
                "bad_credentials",
                "token_expired",
                "no_credentials"
            ]
            .contains(code),
            "{code}"
        ),
    }
    got
}

/// Host names and allowlist entries: normalising is idempotent and yields a plain DNS name;
/// an entry prints in a form that parses back to itself.
pub fn names(input: &str) {
    if let Ok(name) = normalize_host(input) {
        assert_eq!(
            normalize_host(&name).as_deref(),
            Ok(name.as_str()),
            "{input:?}"
        );
        assert!(name.len() <= 253, "{name}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
            "{name:?}"
        );
        assert!(name.parse::<std::net::IpAddr>().is_err(), "{name}");
    }
    if let Ok(pattern) = Pattern::parse(input) {
        let shown = pattern.to_string();
        assert_eq!(
            Pattern::parse(&shown).as_ref(),
            Ok(&pattern),
            "{input:?} -> {shown:?}"
        );
    }
}

/// The `ClientHello` reader on `input`, whole and as the gateway feeds it (everything read so
/// far, at most [`MAX_HELLO_BYTES`]); panics when a prefix of a complete hello is judged
/// otherwise than "need more" (or "too large" at the bound), or a name is not normal. The same
/// bytes as a server's side of a handshake: the retry watch must judge them alike whether they
/// come at once or byte by byte. And as a client's stream after a retry request: what it
/// passes on or reads as a hello lies within the input.
pub fn client_hello(input: &[u8]) {
    let mut whole = RetryWatch::default();
    whole.feed(input);
    let mut bytewise = RetryWatch::default();
    for byte in input.chunks(1) {
        bytewise.feed(byte);
    }
    assert_eq!(
        (whole.retries(), whole.settled()),
        (bytewise.retries(), bytewise.settled()),
        "the retry watch depends on how the stream is split"
    );
    match after_retry(input) {
        Ok(AfterRetry::Pass(n)) => assert!(n > 5 && n <= input.len()),
        Ok(AfterRetry::Hello(hello)) => assert!(hello.consumed <= input.len()),
        Ok(AfterRetry::NeedMore) | Err(_) => {}
    }
    let Ok(Some(hello)) = parse_client_hello(input) else {
        return;
    };
    assert!(hello.consumed <= input.len());
    if let Some(name) = &hello.server_name {
        assert_eq!(normalize_host(name).as_deref(), Ok(name.as_str()));
    }
    for cut in [0, 1, 5, 9, hello.consumed / 2, hello.consumed - 1] {
        if cut < hello.consumed {
            match parse_client_hello(&input[..cut]) {
                Ok(None) => {}
                Err(HelloError::TooLarge) if cut >= MAX_HELLO_BYTES => {}
                other => panic!("a prefix of {cut} bytes of a complete hello gave {other:?}"),
            }
        }
    }
    // The same bytes with anything after them: the same hello.
    let mut longer = input[..hello.consumed].to_vec();
    longer.extend_from_slice(b"\x17\x03\x03\x00\x01x");
    assert_eq!(parse_client_hello(&longer), Ok(Some(hello)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_refuses_what_it_cannot_connect_to_and_answers_http() {
        let refused =
            serve_bytes(b"CONNECT pkg.test:443 HTTP/1.1\r\nProxy-Authorization: Basic @T@\r\n\r\n");
        assert_eq!(
            status(&refused),
            Some(403),
            "{}",
            String::from_utf8_lossy(&refused)
        );
        let no_token = serve_bytes(b"CONNECT pkg.test:443 HTTP/1.1\r\n\r\n");
        assert_eq!(status(&no_token), Some(407));
        assert!(serve_bytes(b"").is_empty());
        assert_eq!(
            request_target(b"CONNECT", b"PKG.test:443"),
            Ok(("pkg.test".to_owned(), 443))
        );
        assert_eq!(
            request_target(b"CONNECT", b"a@pkg.test:443"),
            Err("bad_request")
        );
        assert_eq!(proxy_authorization(b"Basic x"), Err("bad_credentials"));
        assert_eq!(proxy_authorization(b"Basic @T@"), Ok("fuzz".to_owned()));
        names("Ｐｋｇ.test.");
        client_hello(&crate::tls::sample_hello(Some("pkg.test"), 10));
    }
}
