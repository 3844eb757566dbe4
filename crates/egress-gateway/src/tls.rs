//! Reading the `server_name` of a TLS `ClientHello`, without decrypting anything.
//!
//! A `CONNECT pypi.org:443` tunnel must carry TLS for `pypi.org`, not for a host the allowlist
//! does not name that happens to share an address (a CDN front). The gateway reads the first
//! bytes the client sends through the tunnel, which for TLS are a `ClientHello` in the clear,
//! and compares its `server_name` with the `CONNECT` host. Nothing is decrypted or changed: the
//! bytes read are forwarded as they are once the name matches.
//!
//! The parser is incremental and bounded: it is given everything read so far and answers
//! "need more", "done" or "refuse". The hello may be split across reads and across TLS records
//! (it is reassembled from consecutive handshake records), and it must fit in
//! [`MAX_HELLO_BYTES`]. Every length field is checked against what it is inside of.
//!
//! The name in the clear is the name asked for only when the hello seals no other: a hello that
//! offers Encrypted Client Hello names a front (a CDN's public name) in its `server_name` and
//! carries the real one encrypted, so the parser reports it
//! ([`ClientHello::encrypted_client_hello`]) and the gateway refuses it. A server may also answer
//! the first hello with a `HelloRetryRequest`, after which the client sends a second hello in
//! the clear: [`RetryWatch`] follows the server's side far enough to see one, and
//! [`after_retry`] finds that second hello in the client's stream, so that it gets the same
//! checks.

use crate::allowlist::normalize_host;

/// The most bytes read while waiting for a complete `ClientHello` (records and headers
/// included). Real hellos are well under 2 KiB, even with post-quantum key shares.
pub const MAX_HELLO_BYTES: usize = 16 * 1024;

/// TLS record type of `ChangeCipherSpec` (sent, and ignored, in TLS 1.3 for middleboxes).
const CHANGE_CIPHER_SPEC: u8 = 20;
/// TLS record type of alerts.
const ALERT: u8 = 21;
/// TLS record type of handshake messages.
const HANDSHAKE: u8 = 22;
/// TLS record type of application data (early data, before a server's answer).
const APPLICATION_DATA: u8 = 23;
/// Handshake message type of a `ClientHello`.
const CLIENT_HELLO: u8 = 1;
/// Handshake message type of a `ServerHello` (and of a `HelloRetryRequest`).
const SERVER_HELLO: u8 = 2;
/// Extension number of `server_name` (RFC 6066).
const SERVER_NAME: u16 = 0;
/// Extension numbers that mean the hello's real server name, if any, is sealed: ECH's
/// `encrypted_client_hello` (0xfe0d) and the numbers its drafts used (0xfe08 to 0xfe0c);
/// `ech_outer_extensions` (0xfd00), which belongs only in the encrypted inner hello; and the
/// older `encrypted_server_name` (ESNI, 0xffce).
const SEALED_NAME: [u16; 8] = [
    0xfe0d, 0xfe08, 0xfe09, 0xfe0a, 0xfe0b, 0xfe0c, 0xfd00, 0xffce,
];
/// Largest record payload allowed (2^14, RFC 8446 §5.1).
const MAX_RECORD: usize = 16 * 1024;
/// Largest protected record payload allowed (2^14 + 256, RFC 8446 §5.2).
const MAX_PROTECTED_RECORD: usize = MAX_RECORD + 256;
/// The `random` of a `ServerHello` that is a `HelloRetryRequest`: SHA-256 of
/// the ASCII string `HelloRetryRequest` (RFC 8446 §4.1.3).
const RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];
/// The bytes of a `ServerHello` that tell a `HelloRetryRequest`: the handshake header, the
/// version and the random.
const SERVER_HELLO_HEAD: usize = 4 + 2 + 32;

/// A complete `ClientHello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The `server_name` (`host_name` type), normalised; `None` when the client sent none.
    pub server_name: Option<String>,
    /// The hello offers Encrypted Client Hello, or carries another extension of a sealed name
    /// (a draft's ECH, `ech_outer_extensions`, ESNI): the name it really asks for, if any, is
    /// encrypted, and `server_name` may name only a front. A decoy ("GREASE") ECH extension
    /// looks the same and counts the same.
    pub encrypted_client_hello: bool,
    /// How many bytes of the input the records holding the hello take (anything after them,
    /// such as early data, belongs to the stream and is forwarded too).
    pub consumed: usize,
}

/// Why the bytes are not an acceptable `ClientHello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The stream does not start with a TLS handshake record.
    #[error("the tunnel does not carry TLS")]
    NotTls,
    /// A handshake, but not a `ClientHello`, or records of another type in its middle.
    #[error("the first TLS message is not a ClientHello")]
    NotClientHello,
    /// A length or field that does not fit where it is.
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
    /// More than [`MAX_HELLO_BYTES`] without a complete hello.
    #[error("ClientHello larger than {MAX_HELLO_BYTES} bytes")]
    TooLarge,
}

/// Parses the start of a client's TLS stream: `Ok(None)` means a complete hello needs more
/// bytes (read more, up to [`MAX_HELLO_BYTES`], and call again with everything so far).
pub fn parse_client_hello(input: &[u8]) -> Result<Option<ClientHello>, HelloError> {
    let mut message = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = input.get(at..at + 5) else {
            return need_more(input);
        };
        if header[0] != HANDSHAKE {
            return Err(if at == 0 {
                HelloError::NotTls
            } else {
                HelloError::NotClientHello
            });
        }
        if header[1] != 3 {
            return Err(HelloError::NotTls);
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(HelloError::Malformed("record length"));
        }
        let start = at + 5;
        let available = &input[start.min(input.len())..(start + len).min(input.len())];
        if message.len() < 4 {
            // Judge the handshake header as soon as its bytes are in, before the rest of a
            // record that may never come: a wrong type or a huge length fails at once.
            let mut head = message.clone();
            head.extend(available.iter().take(4 - message.len()));
            body_length(&head)?;
        }
        if available.len() < len {
            return need_more(input);
        }
        message.extend_from_slice(available);
        at = start + len;
        if let Some(body_len) = body_length(&message)?
            && message.len() >= 4 + body_len
        {
            // Bytes after the hello inside its last record would be another handshake
            // message; a client sends none before the server answers.
            if message.len() > 4 + body_len {
                return Err(HelloError::Malformed("data after the ClientHello"));
            }
            let (server_name, encrypted_client_hello) = extensions(&message[4..])?;
            return Ok(Some(ClientHello {
                server_name,
                encrypted_client_hello,
                consumed: at,
            }));
        }
    }
}

/// Checks the start of the handshake message: `Some(body length)` once its 4-byte header is
/// complete.
fn body_length(head: &[u8]) -> Result<Option<usize>, HelloError> {
    if head.first().is_some_and(|t| *t != CLIENT_HELLO) {
        return Err(HelloError::NotClientHello);
    }
    let [_, a, b, c, ..] = *head else {
        return Ok(None);
    };
    let body_len = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
    if body_len > MAX_HELLO_BYTES {
        return Err(HelloError::TooLarge);
    }
    Ok(Some(body_len))
}

fn need_more(input: &[u8]) -> Result<Option<ClientHello>, HelloError> {
    if input.len() >= MAX_HELLO_BYTES {
        Err(HelloError::TooLarge)
    } else {
        Ok(None)
    }
}

/// A bounds-checked reader over one message.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.rest.len() < n {
            return Err(HelloError::Malformed(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u8(what)?;
        self.take(usize::from(n), what)
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }
}

/// The `server_name` of a `ClientHello` body (after the 4-byte handshake header), and whether
/// it carries an extension of a sealed name.
fn extensions(body: &[u8]) -> Result<(Option<String>, bool), HelloError> {
    let mut r = Reader { rest: body };
    r.take(2, "client version")?;
    r.take(32, "random")?;
    let session = r.vec8("session id")?;
    if session.len() > 32 {
        return Err(HelloError::Malformed("session id"));
    }
    let suites = r.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suites"));
    }
    if r.vec8("compression methods")?.is_empty() {
        return Err(HelloError::Malformed("compression methods"));
    }
    if r.rest.is_empty() {
        return Ok((None, false)); // no extensions at all
    }
    let mut exts = Reader {
        rest: r.vec16("extensions")?,
    };
    if !r.rest.is_empty() {
        return Err(HelloError::Malformed("data after the extensions"));
    }
    let mut found = None;
    let mut sealed = false;
    while !exts.rest.is_empty() {
        let kind = exts.u16("extension type")?;
        let data = exts.vec16("extension")?;
        sealed |= SEALED_NAME.contains(&kind);
        if kind != SERVER_NAME {
            continue;
        }
        if found.is_some() {
            return Err(HelloError::Malformed("two server_name extensions"));
        }
        found = Some(host_name(data)?);
    }
    Ok((found, sealed))
}

/// The one `host_name` entry of a `server_name` extension, normalised.
fn host_name(data: &[u8]) -> Result<String, HelloError> {
    let mut ext = Reader { rest: data };
    let mut list = Reader {
        rest: ext.vec16("server name list")?,
    };
    if !ext.rest.is_empty() {
        return Err(HelloError::Malformed("data after the server name list"));
    }
    let mut name = None;
    while !list.rest.is_empty() {
        let kind = list.u8("server name type")?;
        let value = list.vec16("server name")?;
        if kind != 0 {
            continue; // no other type is defined; skipped as RFC 6066 allows
        }
        if name.is_some() {
            return Err(HelloError::Malformed("two host names"));
        }
        let text = std::str::from_utf8(value).map_err(|_| HelloError::Malformed("server name"))?;
        if !text.is_ascii() {
            return Err(HelloError::Malformed("server name"));
        }
        name = Some(normalize_host(text).map_err(|_| HelloError::Malformed("server name"))?);
    }
    name.ok_or(HelloError::Malformed("empty server name list"))
}

/// What starts the client's stream after the server answered its hello with a
/// `HelloRetryRequest` ([`after_retry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterRetry {
    /// More bytes are needed.
    NeedMore,
    /// A complete record of this many bytes that is not a handshake message: a
    /// `ChangeCipherSpec`, an alert, or early data sent before the retry request arrived (none
    /// can carry a hello in the clear); it may be passed on.
    Pass(usize),
    /// The client's next handshake message, complete: a second hello (its
    /// [`consumed`](ClientHello::consumed) bytes).
    Hello(ClientHello),
}

/// Reads the start of the client's stream after a `HelloRetryRequest`: the records before its
/// next handshake message, then that message, which must be a `ClientHello` (checked as
/// [`parse_client_hello`] checks the first). Call again with what follows a `Pass`.
pub fn after_retry(input: &[u8]) -> Result<AfterRetry, HelloError> {
    let Some(header) = input.get(..5) else {
        return Ok(AfterRetry::NeedMore);
    };
    match header[0] {
        CHANGE_CIPHER_SPEC | ALERT | APPLICATION_DATA => {
            if header[1] != 3 {
                return Err(HelloError::NotClientHello);
            }
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if len == 0 || len > MAX_PROTECTED_RECORD {
                return Err(HelloError::Malformed("record length"));
            }
            Ok(if input.len() < 5 + len {
                AfterRetry::NeedMore
            } else {
                AfterRetry::Pass(5 + len)
            })
        }
        HANDSHAKE => Ok(parse_client_hello(input)?.map_or(AfterRetry::NeedMore, AfterRetry::Hello)),
        _ => Err(HelloError::NotClientHello),
    }
}

/// Follows the server's side of a TLS handshake, copied as it passes, far enough to tell
/// whether each of its answers to a client's hello is a `HelloRetryRequest`: after one, the
/// client's next handshake message is a second hello in the clear, which must be checked like
/// the first; after any other answer (a `ServerHello`, TLS 1.3 or 1.2), or anything that is
/// not a handshake, no further hello is sent in the clear and the watch is over.
///
/// Only record and handshake headers and the first 38 bytes of each `ServerHello` are kept:
/// the watch holds a few dozen bytes however the stream is split.
#[derive(Debug, Default)]
pub struct RetryWatch {
    /// A record header being read.
    header: Vec<u8>,
    /// Type of the current record.
    record_type: u8,
    /// Bytes of the current record's payload still to come.
    record_left: usize,
    /// The start of the current handshake message (up to [`SERVER_HELLO_HEAD`] bytes).
    message: Vec<u8>,
    /// Bytes of the current handshake message still to pass over (the rest of a retry request).
    skip: usize,
    retries: usize,
    settled: bool,
}

impl RetryWatch {
    /// Takes the next bytes the server sent.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.settled {
            if self.record_left == 0 {
                let take = (5 - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() < 5 {
                    return;
                }
                let len = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                let kind = self.header[0];
                let tls = self.header[1] == 3 && len > 0 && len <= MAX_PROTECTED_RECORD;
                self.header.clear();
                if !tls || !matches!(kind, HANDSHAKE | CHANGE_CIPHER_SPEC) {
                    self.settled = true;
                    return;
                }
                self.record_type = kind;
                self.record_left = len;
                continue;
            }
            let n = self.record_left.min(bytes.len());
            let (payload, rest) = bytes.split_at(n);
            bytes = rest;
            self.record_left -= n;
            if self.record_type == HANDSHAKE {
                self.handshake(payload);
            }
        }
    }

    /// Takes handshake bytes (messages may span records, and records hold several).
    fn handshake(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.settled {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (SERVER_HELLO_HEAD - self.message.len()).min(bytes.len());
            self.message.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.message[0] != SERVER_HELLO {
                self.settled = true;
            } else if self.message.len() == SERVER_HELLO_HEAD {
                let body_len = (usize::from(self.message[1]) << 16)
                    | (usize::from(self.message[2]) << 8)
                    | usize::from(self.message[3]);
                if self.message[6..] == RETRY_RANDOM && 4 + body_len >= SERVER_HELLO_HEAD {
                    self.retries += 1;
                    self.skip = 4 + body_len - SERVER_HELLO_HEAD;
                    self.message.clear();
                } else {
                    self.settled = true;
                }
            }
        }
    }

    /// How many `HelloRetryRequest`s the server has sent so far: each calls for one more hello
    /// from the client.
    #[must_use]
    pub fn retries(&self) -> usize {
        self.retries
    }

    /// Whether the server has answered with something other than a retry request (or sent
    /// something that is not a TLS handshake): no further hello comes in the clear.
    #[must_use]
    pub fn settled(&self) -> bool {
        self.settled
    }
}

/// Test support: a minimal, well-formed `ClientHello` record for `server_name` (none when
/// `None`), with `padding` bytes of an unknown extension to make it as large as wanted.
#[cfg(test)]
pub(crate) fn sample_hello(server_name: Option<&str>, padding: usize) -> Vec<u8> {
    sample_hello_with(server_name, padding, &[])
}

/// Test support: [`sample_hello`] with the extensions `extra` (type, content) before the
/// `server_name`.
#[cfg(test)]
pub(crate) fn sample_hello_with(
    server_name: Option<&str>,
    padding: usize,
    extra: &[(u16, &[u8])],
) -> Vec<u8> {
    fn be16(n: usize) -> [u8; 2] {
        u16::try_from(n).unwrap().to_be_bytes()
    }
    let mut exts = Vec::new();
    for (kind, content) in extra {
        exts.extend(kind.to_be_bytes());
        exts.extend(be16(content.len()));
        exts.extend(*content);
    }
    if let Some(name) = server_name {
        let mut entry = vec![0];
        entry.extend(be16(name.len()));
        entry.extend(name.as_bytes());
        let mut list = be16(entry.len()).to_vec();
        list.extend(entry);
        exts.extend(be16(usize::from(SERVER_NAME)));
        exts.extend(be16(list.len()));
        exts.extend(list);
    }
    if padding > 0 {
        exts.extend([0xff, 0x01]);
        exts.extend(be16(padding));
        exts.extend(std::iter::repeat_n(0, padding));
    }
    let mut body = vec![3, 3];
    body.extend([7; 32]);
    body.push(0); // session id
    body.extend([0, 2, 0x13, 0x01]); // one cipher suite
    body.extend([1, 0]); // null compression
    body.extend(be16(exts.len()));
    body.extend(exts);
    let mut message = vec![CLIENT_HELLO];
    message.extend(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    message.extend(body);
    // Split into records of at most MAX_RECORD bytes.
    let mut out = Vec::new();
    for chunk in message.chunks(MAX_RECORD) {
        out.extend([HANDSHAKE, 3, 1]);
        out.extend(be16(chunk.len()));
        out.extend(chunk);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_server_name_and_the_length_taken() {
        let hello = sample_hello(Some("PyPI.org"), 0);
        let mut stream = hello.clone();
        stream.extend(b"early data");
        let got = parse_client_hello(&stream).unwrap().unwrap();
        assert_eq!(got.server_name.as_deref(), Some("pypi.org"));
        assert_eq!(got.consumed, hello.len());
        let none = parse_client_hello(&sample_hello(None, 10))
            .unwrap()
            .unwrap();
        assert_eq!(none.server_name, None);
    }

    #[test]
    fn every_split_point_asks_for_more_then_completes() {
        let hello = sample_hello(Some("files.pythonhosted.org"), 300);
        for cut in 0..hello.len() {
            assert_eq!(parse_client_hello(&hello[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(parse_client_hello(&hello).unwrap().is_some());
    }

    #[test]
    fn a_hello_spread_over_several_records_is_reassembled() {
        // A 20 KiB message needs two records; the bound on the whole applies.
        let big = sample_hello(Some("a.example"), 20 * 1024);
        assert_eq!(parse_client_hello(&big), Err(HelloError::TooLarge));
        // Re-split a normal hello into 3-byte records: still one ClientHello.
        let one = sample_hello(Some("a.example"), 0);
        let message = &one[5..];
        let mut records = Vec::new();
        for chunk in message.chunks(3) {
            records.extend([HANDSHAKE, 3, 3, 0, u8::try_from(chunk.len()).unwrap()]);
            records.extend(chunk);
        }
        let got = parse_client_hello(&records).unwrap().unwrap();
        assert_eq!(got.server_name.as_deref(), Some("a.example"));
        assert_eq!(got.consumed, records.len());
    }

    #[test]
    fn hostile_and_foreign_inputs_are_refused_without_panicking() {
        assert_eq!(
            parse_client_hello(b"GET / HTTP/1.1\r\n"),
            Err(HelloError::NotTls)
        );
        assert_eq!(
            parse_client_hello(b"SSH-2.0-OpenSSH_9.2\r\n"),
            Err(HelloError::NotTls)
        );
        assert_eq!(
            parse_client_hello(&[22, 2, 0, 0, 1, 1]),
            Err(HelloError::NotTls)
        );
        // A ServerHello (type 2) where a ClientHello belongs.
        let mut server = sample_hello(Some("a.example"), 0);
        server[5] = 2;
        assert_eq!(parse_client_hello(&server), Err(HelloError::NotClientHello));
        // Zero-length and over-long records.
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0, 0]),
            Err(HelloError::Malformed(_))
        ));
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0x40, 1]),
            Err(HelloError::Malformed(_))
        ));
        // A declared body larger than the bound fails at once, not after 16 MiB.
        assert_eq!(
            parse_client_hello(&[22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]),
            Err(HelloError::TooLarge)
        );
        // Endless "need more" is cut at the bound.
        let mut partial = sample_hello(Some("a.example"), 0);
        partial.truncate(9);
        partial[6] = 0xff; // a body length of ~16 MiB: too large
        assert_eq!(parse_client_hello(&partial), Err(HelloError::TooLarge));
        let good = sample_hello(Some("a.example"), 0);
        // Every single-byte corruption either parses, asks for more, or is refused: no panic.
        for i in 0..good.len() {
            for v in [0_u8, 1, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[i] = v;
                let _ = parse_client_hello(&bad);
            }
        }
        // Every truncation of the body lengths, no panic either.
        for len in 0..good.len() {
            let _ = parse_client_hello(&good[..len]);
        }
    }

    #[test]
    fn odd_server_names_are_refused() {
        for name in ["bad name", "a..b", "127.0.0.1", "x\u{e9}.example", ""] {
            let hello = sample_hello(Some(name), 0);
            assert!(
                matches!(parse_client_hello(&hello), Err(HelloError::Malformed(_))),
                "{name:?} accepted"
            );
        }
    }

    #[test]
    fn duplicate_names_are_refused() {
        // Build a server_name extension with two host_name entries by hand.
        let name = b"a.example";
        let mut entry = vec![0, 0, u8::try_from(name.len()).unwrap()];
        entry.extend(name);
        let two = [entry.clone(), entry].concat();
        let mut ext = u16::try_from(two.len()).unwrap().to_be_bytes().to_vec();
        ext.extend(two);
        assert_eq!(
            host_name(&ext),
            Err(HelloError::Malformed("two host names"))
        );
        // And two server_name extensions in one hello.
        let hello = sample_hello(Some("a.example"), 0);
        let body = &hello[9..];
        let mut r = Reader { rest: body };
        r.take(34, "").unwrap();
        r.vec8("").unwrap();
        r.vec16("").unwrap();
        r.vec8("").unwrap();
        let exts = r.vec16("").unwrap().to_vec();
        let doubled = [exts.clone(), exts].concat();
        let mut new_body = body[..body.len() - doubled.len() / 2 - 2].to_vec();
        new_body.extend(u16::try_from(doubled.len()).unwrap().to_be_bytes());
        new_body.extend(doubled);
        assert_eq!(
            extensions(&new_body),
            Err(HelloError::Malformed("two server_name extensions"))
        );
    }

    #[test]
    fn a_sealed_server_name_is_reported_whatever_the_clear_one() {
        let plain = parse_client_hello(&sample_hello(Some("pkg.test"), 0))
            .unwrap()
            .unwrap();
        assert!(!plain.encrypted_client_hello);
        for kind in SEALED_NAME {
            for name in [Some("pkg.test"), None] {
                let hello = sample_hello_with(name, 0, &[(kind, &[0, 1, 2, 3])]);
                let got = parse_client_hello(&hello).unwrap().unwrap();
                assert!(got.encrypted_client_hello, "{kind:#06x} {name:?}");
                assert_eq!(got.server_name.as_deref(), name);
            }
        }
        // GREASE extension numbers (RFC 8701) and other unknown ones are not sealed names.
        for kind in [0x0a0a_u16, 0xfafa, 0xfe0e, 0xfe07, 0xff01] {
            let hello = sample_hello_with(Some("pkg.test"), 0, &[(kind, &[])]);
            assert!(
                !parse_client_hello(&hello)
                    .unwrap()
                    .unwrap()
                    .encrypted_client_hello
            );
        }
    }

    /// A `ServerHello` record whose random is `random`, with `extra` bytes of extensions.
    fn server_hello(random: [u8; 32], extra: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend(random);
        body.extend([0, 0x13, 0x01, 0]);
        body.extend(u16::try_from(extra).unwrap().to_be_bytes());
        body.extend(std::iter::repeat_n(0xaa, extra));
        let mut msg = vec![SERVER_HELLO];
        msg.extend(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        msg.extend(body);
        let mut out = vec![HANDSHAKE, 3, 3];
        out.extend(u16::try_from(msg.len()).unwrap().to_be_bytes());
        out.extend(msg);
        out
    }

    const CCS: [u8; 6] = [CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1];

    /// Feeds `stream` to a new watch in pieces of `step` bytes.
    fn watched(stream: &[u8], step: usize) -> RetryWatch {
        let mut watch = RetryWatch::default();
        for piece in stream.chunks(step) {
            watch.feed(piece);
        }
        watch
    }

    #[test]
    fn a_retry_request_is_seen_however_the_stream_is_split() {
        let retry = [server_hello(RETRY_RANDOM, 12), CCS.to_vec()].concat();
        let answer = server_hello([9; 32], 40);
        for step in [1, 2, 5, 7, 38, 1000] {
            let watch = watched(&retry, step);
            assert_eq!(
                (watch.retries(), watch.settled()),
                (1, false),
                "step {step}"
            );
            // Then the real answer to the second hello: over.
            let watch = watched(&[&retry[..], &answer].concat(), step);
            assert_eq!((watch.retries(), watch.settled()), (1, true), "step {step}");
            // An answer that is not a retry request, with more handshake behind it.
            let watch = watched(&[&answer[..], &answer, &CCS].concat(), step);
            assert_eq!((watch.retries(), watch.settled()), (0, true), "step {step}");
            // Two retry requests call for two more hellos.
            let watch = watched(&[&retry[..], &retry].concat(), step);
            assert_eq!(
                (watch.retries(), watch.settled()),
                (2, false),
                "step {step}"
            );
        }
        // The retry request and the next message in one record.
        let mut one = server_hello(RETRY_RANDOM, 0);
        let second = server_hello([1; 32], 0);
        one.extend(&second[5..]);
        let len = u16::try_from(one.len() - 5).unwrap().to_be_bytes();
        one[3..5].copy_from_slice(&len);
        let watch = watched(&one, 3);
        assert_eq!((watch.retries(), watch.settled()), (1, true));
        // Nothing yet, or only part of the random: undecided.
        let retry = server_hello(RETRY_RANDOM, 0);
        for cut in 0..5 + SERVER_HELLO_HEAD {
            let watch = watched(&retry[..cut], 1);
            assert_eq!((watch.retries(), watch.settled()), (0, false), "cut {cut}");
        }
    }

    #[test]
    fn anything_but_a_handshake_ends_the_watch() {
        for stream in [
            b"HTTP/1.1 400 Bad Request\r\n".to_vec(),
            vec![ALERT, 3, 3, 0, 2, 2, 40],
            vec![APPLICATION_DATA, 3, 3, 0, 1, 0],
            vec![HANDSHAKE, 3, 3, 0, 0],
            vec![HANDSHAKE, 3, 3, 0x41, 0x01],
            vec![HANDSHAKE, 3, 3, 0, 4, 11, 0, 0, 0], // a Certificate first
        ] {
            let watch = watched(&stream, 1);
            assert!(watch.settled(), "{stream:?}");
        }
        // A retry request whose length is too short to hold its random.
        let mut short = server_hello(RETRY_RANDOM, 0);
        short[6..9].copy_from_slice(&[0, 0, 10]);
        assert_eq!(watched(&short, 4).retries(), 0);
        assert!(watched(&short, 4).settled());
    }

    #[test]
    fn after_a_retry_other_records_pass_and_the_next_handshake_must_be_a_hello() {
        let hello = sample_hello(Some("pkg.test"), 0);
        let early = [APPLICATION_DATA, 3, 3, 0, 3, 1, 2, 3];
        let stream = [&CCS[..], &early, &hello].concat();
        assert_eq!(after_retry(&stream), Ok(AfterRetry::Pass(6)));
        assert_eq!(after_retry(&stream[6..]), Ok(AfterRetry::Pass(8)));
        match after_retry(&stream[14..]) {
            Ok(AfterRetry::Hello(h)) => {
                assert_eq!(h.server_name.as_deref(), Some("pkg.test"));
                assert_eq!(h.consumed, hello.len());
            }
            other => panic!("{other:?}"),
        }
        for cut in 0..hello.len() {
            assert_eq!(
                after_retry(&hello[..cut]),
                Ok(AfterRetry::NeedMore),
                "{cut}"
            );
        }
        assert_eq!(after_retry(&CCS[..5]), Ok(AfterRetry::NeedMore));
        let mut server = hello.clone();
        server[5] = SERVER_HELLO;
        assert_eq!(after_retry(&server), Err(HelloError::NotClientHello));
        assert_eq!(
            after_retry(b"GET / HTTP/1.1\r\n"),
            Err(HelloError::NotClientHello)
        );
        assert_eq!(
            after_retry(&[CHANGE_CIPHER_SPEC, 2, 0, 0, 1, 1]),
            Err(HelloError::NotClientHello)
        );
        assert!(matches!(
            after_retry(&[APPLICATION_DATA, 3, 3, 0x41, 0x01]),
            Err(HelloError::Malformed(_))
        ));
        let sealed = sample_hello_with(Some("pkg.test"), 0, &[(0xfe0d, &[0])]);
        assert!(matches!(
            after_retry(&sealed),
            Ok(AfterRetry::Hello(ClientHello {
                encrypted_client_hello: true,
                ..
            }))
        ));
    }
}
