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
//! ([`ClientHello::encrypted_client_hello`]) and the gateway refuses it.

use crate::allowlist::normalize_host;

/// The most bytes read while waiting for a complete `ClientHello` (records and headers
/// included). Real hellos are well under 2 KiB, even with post-quantum key shares.
pub const MAX_HELLO_BYTES: usize = 16 * 1024;

/// TLS record type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake message type of a `ClientHello`.
const CLIENT_HELLO: u8 = 1;
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
}
