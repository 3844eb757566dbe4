//! The gateway against the attacks egress proxies are known to face, one class per section:
//! destinations, names, protocol, tokens, load. Every test drives the `egress-gateway` binary in
//! the enforcing test network (`common/mod.rs`): it asserts the verdict (status and reason),
//! that nothing was reached where the request is refused (every listener of the network counts
//! the connections it accepts, the gateway namespace's own included), and that the log holds
//! one escaped line per connection and never the token. Names are resolved by the test DNS
//! server through the system resolver where the answer is what is attacked (destinations,
//! names), by `--test-only-resolve` elsewhere. Without root, `ip` or `nft` every test passes
//! after saying why it did not run.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use common::{
    EVIL_IP, GW_PUBLIC_IP, Gateway, Head, Net, SINK_PORT, basic, body_text, exchange, get, name,
    read_all, token,
};
use egress_gateway::REASON_HEADER;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A `CONNECT` head for `target` with `auth` as `Proxy-Authorization`.
fn connect_head(target: &str, auth: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n")
}

/// A plain-HTTP `GET url` head through the proxy with `auth`.
fn get_head(url: &str, host: &str, auth: &str) -> String {
    format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: {auth}\r\n\r\n")
}

/// Sends raw `bytes` on a new connection from the hub and reads until the gateway closes
/// (bounded): the status, the reason header and the whole answer.
async fn send_raw(net: &Net, gw: &Gateway, bytes: &[u8]) -> (u16, String, String) {
    let mut stream = net.connect_from_hub(gw.addr);
    let _ = stream.write_all(bytes).await;
    let raw = read_all(&mut stream).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let reason = text
        .split("\r\n")
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case(REASON_HEADER))
        })
        .map_or(String::new(), |(_, v)| v.trim().to_owned());
    (status, reason, text)
}

/// Asserts `head` on a new connection is refused with `status` and `reason`.
async fn refused(net: &Net, gw: &Gateway, head: &str, status: u16, reason: &str) {
    let (got, why, text) = send_raw(net, gw, head.as_bytes()).await;
    assert_eq!(
        (got, why.as_str()),
        (status, reason),
        "request:\n{head}\nanswer:\n{text}"
    );
}

/// The network's accept counts, to compare with [`nothing_reached`].
fn snapshot(net: &Net) -> BTreeMap<SocketAddr, u64> {
    net.all_accepts()
}

/// Asserts that no listener of the network accepted a connection since `before`, except at
/// the addresses in `allowed`.
fn nothing_reached(net: &Net, before: &BTreeMap<SocketAddr, u64>, allowed: &[&str]) {
    let allowed: Vec<SocketAddr> = allowed.iter().map(|a| a.parse().expect("addr")).collect();
    for (addr, n) in net.all_accepts() {
        let was = before.get(&addr).copied().unwrap_or(0);
        assert!(
            n == was || allowed.contains(&addr),
            "{addr} accepted {} connection(s) it must never see",
            n - was
        );
    }
}

/// The keys of a connection record, in order.
const RECORD_KEYS: [&str; 12] = [
    "peer",
    "guest",
    "kind",
    "host",
    "port",
    "upstream",
    "bytes_up",
    "bytes_down",
    "duration_ms",
    "verdict",
    "reason",
    "",
];

/// Asserts the log is clean: no token in any form (whole, as the `Basic` value, or any
/// 16-character piece of either), no control character or replacement character on any line,
/// and every connection record made of exactly its `key=value` words.
fn log_is_clean(gw: &Gateway, tokens: &[&str]) {
    let log = gw.log();
    for tok in tokens {
        let basic_value = basic(tok);
        let encoded = basic_value.trim_start_matches("Basic ");
        for secret in [*tok, encoded] {
            assert!(!log.contains(secret), "a token reached the log");
            let chars: Vec<char> = secret.chars().collect();
            for piece in chars.windows(16).step_by(4) {
                let piece: String = piece.iter().collect();
                assert!(!log.contains(&piece), "a piece of a token reached the log");
            }
        }
    }
    for line in log.lines() {
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{fffd}'),
            "an unescaped byte in the log: {line:?}"
        );
        let Some((_, fields)) = line.split_once("egress_gateway::connection: connection ") else {
            continue;
        };
        let keys: Vec<&str> = fields
            .split(' ')
            .map(|w| w.split_once('=').map_or("", |(k, _)| k))
            .chain([""])
            .collect();
        assert_eq!(keys, RECORD_KEYS, "a record of other words: {line}");
    }
}

/// The value of `key` in a record.
fn field<'a>(record: &'a str, key: &str) -> &'a str {
    record
        .split(' ')
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {record}"))
}

/// A `ClientHello` for `sni` made by rustls (none when `None`).
fn hello(sni: Option<&str>) -> Vec<u8> {
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let server = match sni {
        Some(n) => ServerName::try_from(n.to_owned()).expect("server name"),
        None => ServerName::IpAddress(std::net::Ipv4Addr::new(11, 0, 0, 1).into()),
    };
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
    let mut out = Vec::new();
    conn.write_tls(&mut out).expect("hello");
    out
}

/// A minimal `ClientHello` record whose `server_name` is `sni` byte for byte (for names rustls
/// refuses to send).
fn raw_hello(sni: &[u8]) -> Vec<u8> {
    raw_hello_with(sni, &[])
}

/// [`raw_hello`] with the extensions `extra` (type, content) after the `server_name`.
fn raw_hello_with(sni: &[u8], extra: &[(u16, &[u8])]) -> Vec<u8> {
    let be16 = |n: usize| u16::try_from(n).expect("short").to_be_bytes();
    let mut entry = vec![0];
    entry.extend(be16(sni.len()));
    entry.extend(sni);
    let mut list = be16(entry.len()).to_vec();
    list.extend(entry);
    let mut exts = vec![0, 0];
    exts.extend(be16(list.len()));
    exts.extend(list);
    for (kind, content) in extra {
        exts.extend(kind.to_be_bytes());
        exts.extend(be16(content.len()));
        exts.extend(*content);
    }
    let mut body = vec![3, 3];
    body.extend([7; 32]);
    body.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend(be16(exts.len()));
    body.extend(exts);
    let mut msg = vec![1];
    msg.extend(&u32::try_from(body.len()).expect("short").to_be_bytes()[1..]);
    msg.extend(body);
    let mut rec = vec![22, 3, 1];
    rec.extend(be16(msg.len()));
    rec.extend(msg);
    rec
}

/// A `ClientHello` from rustls offering Encrypted Client Hello. With `Some(inner)` it is the
/// real thing: the client holds an ECH configuration whose public name is `front` (as a CDN
/// publishes one for all its sites), so the hello names `front` in the clear and seals `inner`
/// in its `encrypted_client_hello` extension. With `None` it is the GREASE form, a decoy
/// extension beside the clear name `front` that a client sends when it has no configuration.
fn ech_hello(front: &str, inner: Option<&str>) -> Vec<u8> {
    use rustls::client::{EchConfig, EchGreaseConfig, EchMode};
    use rustls::crypto::aws_lc_rs::hpke::{
        ALL_SUPPORTED_SUITES, DH_KEM_X25519_HKDF_SHA256_AES_128,
    };
    use rustls::crypto::hpke::Hpke as _;
    let suite = DH_KEM_X25519_HKDF_SHA256_AES_128;
    let (public_key, _) = suite.generate_key_pair().expect("HPKE key pair");
    let mode = if inner.is_some() {
        // An ECHConfigList of one ECHConfig (version 0xfe0d): config id 7, DHKEM(X25519,
        // HKDF-SHA256), one suite (HKDF-SHA256, AES-128-GCM), no name length hint, the public
        // name, no extensions.
        let be16 = |n: usize| u16::try_from(n).expect("short").to_be_bytes();
        let mut contents = vec![7, 0x00, 0x20];
        contents.extend(be16(public_key.0.len()));
        contents.extend(&public_key.0);
        contents.extend([0, 4, 0x00, 0x01, 0x00, 0x01]);
        contents.push(0);
        contents.push(u8::try_from(front.len()).expect("short"));
        contents.extend(front.as_bytes());
        contents.extend([0, 0]);
        let mut config = vec![0xfe, 0x0d];
        config.extend(be16(contents.len()));
        config.extend(contents);
        let mut list = be16(config.len()).to_vec();
        list.extend(config);
        let ech = EchConfig::new(list.into(), ALL_SUPPORTED_SUITES).expect("ECH config");
        EchMode::Enable(ech)
    } else {
        EchMode::Grease(EchGreaseConfig::new(suite, public_key))
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_ech(mode)
    .expect("ECH client")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let server = ServerName::try_from(inner.unwrap_or(front).to_owned()).expect("server name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
    let mut out = Vec::new();
    conn.write_tls(&mut out).expect("hello");
    out
}

/// The `encrypted_client_hello` extension type (0xfe0d).
const ECH_EXTENSION: u16 = 0xfe0d;

/// Whether a `ClientHello` record carries the extension `kind` (a test's own check that the
/// hello it sends is the one it means; single-record hellos only).
fn has_extension(record: &[u8], kind: u16) -> bool {
    let body = &record[9..];
    let mut at = 2 + 32;
    at += 1 + usize::from(body[at]);
    at += 2 + usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
    at += 1 + usize::from(body[at]);
    let end = at + 2 + usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
    at += 2;
    while at < end {
        let ext = u16::from_be_bytes([body[at], body[at + 1]]);
        if ext == kind {
            return true;
        }
        at += 4 + usize::from(u16::from_be_bytes([body[at + 2], body[at + 3]]));
    }
    false
}

/// The port of [`RetryServer`] on `pkg.test`.
const RETRY_PORT: u16 = 9445;

/// A fatal TLS `access_denied` alert, what the gateway answers a `ClientHello` it refuses.
const ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 49];

/// A `ChangeCipherSpec` record, which a TLS 1.3 client sends before its second hello.
const CCS: [u8; 6] = [20, 3, 3, 0, 1, 1];

/// A TLS 1.3 `HelloRetryRequest` record (a `ServerHello` whose random is the special value of
/// RFC 8446 4.1.3) asking for a secp256r1 key share, then the server's `ChangeCipherSpec`.
fn retry_request() -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([
        0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8,
        0x91, 0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8,
        0x33, 0x9c,
    ]);
    body.push(0); // session id echo
    body.extend([0x13, 0x01, 0]); // TLS_AES_128_GCM_SHA256, null compression
    body.extend([0, 12, 0x00, 0x2b, 0, 2, 3, 4, 0x00, 0x33, 0, 2, 0x00, 0x17]);
    let mut msg = vec![2, 0, 0, u8::try_from(body.len()).expect("short")];
    msg.extend(body);
    let mut out = vec![22, 3, 3, 0, u8::try_from(msg.len()).expect("short")];
    out.extend(msg);
    out.extend(CCS);
    out
}

/// Per connection, in accept order: every byte received, and whether it has ended.
type Seen = Arc<std::sync::Mutex<Vec<(Vec<u8>, bool)>>>;

/// A TLS server stand-in on `pkg.test:`[`RETRY_PORT`] (in the test "internet"): it reads one
/// record (a first hello), answers [`retry_request`], and keeps every byte each connection
/// sends it, to show what reached it.
struct RetryServer {
    seen: Seen,
    _task: tokio::task::JoinHandle<()>,
}

impl RetryServer {
    fn start(net: &Net) -> RetryServer {
        let std = net
            .inet
            .bind_tcp(([0, 0, 0, 0], RETRY_PORT).into())
            .expect("retry server");
        let listener = tokio::net::TcpListener::from_std(std).expect("tokio listener");
        let seen: Seen = Arc::default();
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let at = {
                    let mut seen = record.lock().expect("seen");
                    seen.push((Vec::new(), false));
                    seen.len() - 1
                };
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let keep = |bytes: &[u8], ended: bool| {
                        let mut seen = record.lock().expect("seen");
                        seen[at].0.extend_from_slice(bytes);
                        seen[at].1 |= ended;
                    };
                    let mut header = [0_u8; 5];
                    if stream.read_exact(&mut header).await.is_err() {
                        return keep(&[], true);
                    }
                    keep(&header, false);
                    let mut payload =
                        vec![0; usize::from(u16::from_be_bytes([header[3], header[4]]))];
                    if stream.read_exact(&mut payload).await.is_err() {
                        return keep(&[], true);
                    }
                    keep(&payload, false);
                    let _ = stream.write_all(&retry_request()).await;
                    let mut chunk = [0_u8; 4096];
                    loop {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return keep(&[], true),
                            Ok(n) => keep(&chunk[..n], false),
                        }
                    }
                });
            }
        });
        RetryServer { seen, _task: task }
    }

    /// How many connections it has accepted.
    fn connections(&self) -> usize {
        self.seen.lock().expect("seen").len()
    }

    /// What connection `n` received, once it has ended (bounded wait).
    async fn ended(&self, n: usize) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some((bytes, true)) = self.seen.lock().expect("seen").get(n) {
                return bytes.clone();
            }
            assert!(Instant::now() < deadline, "connection {n} never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (bounded) until connection `n` has received `bytes` exactly; what it received.
    async fn received(&self, n: usize, bytes: &[u8]) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = self
                .seen
                .lock()
                .expect("seen")
                .get(n)
                .map(|(b, _)| b.clone())
                .unwrap_or_default();
            if got == bytes || Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `CONNECT target` with `auth`, expecting `200`; returns the open tunnel.
async fn tunnel(net: &Net, gw: &Gateway, target: &str, auth: &str) -> TcpStream {
    let mut s = net.connect_from_hub(gw.addr);
    let head = exchange(&mut s, &connect_head(target, auth)).await;
    assert_eq!(head.status, 200, "CONNECT {target}: {head:?}");
    s
}

/// A well-behaved client's whole exchange: `CONNECT pkg.test:443`, TLS, `GET /hello`; how long
/// it took, or what went wrong.
async fn served(net: &Net, gw: &Gateway, auth: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = net.connect_from_hub(gw.addr);
    s.write_all(connect_head("pkg.test:443", auth).as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut byte = [0_u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            other => return Err(format!("no answer to CONNECT: {other:?}")),
        }
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&head).into_owned());
    }
    let mut tls = net
        .tls()
        .connect(name("pkg.test"), s)
        .await
        .map_err(|e| e.to_string())?;
    let raw = get(&mut tls, "pkg.test", "/hello").await;
    if body_text(&raw) != "hello from pkg.test over https" {
        return Err(String::from_utf8_lossy(&raw).into_owned());
    }
    Ok(t.elapsed())
}

/// [`served`] within `limit`, or a panic saying what happened.
async fn served_within(net: &Net, gw: &Gateway, auth: &str, limit: Duration) -> Duration {
    match tokio::time::timeout(limit, served(net, gw, auth)).await {
        Ok(Ok(took)) => took,
        Ok(Err(e)) => panic!("a well-behaved client was refused: {e}"),
        Err(tokio::time::error::Elapsed { .. }) => {
            panic!("a well-behaved client was not served within {limit:?}")
        }
    }
}

/// Waits (bounded) until `n` records hold every one of `fields`; returns them.
async fn wait_records(gw: &Gateway, fields: &[&str], n: usize, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let got: Vec<String> = gw
            .records()
            .into_iter()
            .filter(|r| fields.iter().all(|f| r.split(' ').any(|w| w == *f)))
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} records with {fields:?}; log:\n{}",
            got.len(),
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The escaped form the log gives a requested host that is not a name: every byte outside
/// `A-Z a-z 0-9 . - _ : [ ]` as `\xNN`.
fn escaped(host: &str) -> String {
    host.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b".-_:[]".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Destinations.

/// IP literals in the spellings resolvers and URL parsers accept (decimal, octal, hex,
/// shortened, IPv4-mapped and NAT64 IPv6, zone ids, unspecified), for loopback, the metadata
/// service, private ranges, the gateway's own addresses and public ones alike.
const LITERALS: &[&str] = &[
    "127.0.0.1",
    "2130706433",
    "017700000001",
    "0177.0.0.1",
    "0x7f.0.0.1",
    "0x7f000001",
    "0x7f.1",
    "127.1",
    "0",
    "0.0.0.0",
    "169.254.169.254",
    "0xa9.0xfe.0xa9.0xfe",
    "2852039166",
    "10.99.0.1",
    "10.214.0.1",
    "11.0.0.9",
    "11.0.0.1",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:169.254.169.254]",
    "[64:ff9b::a9fe:a9fe]",
    "[fe80::1]",
    "[fe80::1%25eth0]",
    "[fd00::1]",
];

#[tokio::test(flavor = "multi_thread")]
async fn ip_literals_in_every_spelling_are_refused_and_reach_nothing() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-dst-1", &["pkg.test", "*.pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    for lit in LITERALS {
        refused(
            &net,
            &gw,
            &connect_head(&format!("{lit}:443"), &auth),
            403,
            "ip_literal",
        )
        .await;
        refused(
            &net,
            &gw,
            &get_head(&format!("http://{lit}/latest/meta-data"), lit, &auth),
            403,
            "ip_literal",
        )
        .await;
    }
    nothing_reached(&net, &before, &[]);
    // Each refusal's record names what was asked for, escaped.
    for lit in [
        "2130706433",
        "0x7f.1",
        "[fe80::1%25eth0]",
        "[::ffff:127.0.0.1]",
    ] {
        let host = format!("host={}", escaped(lit));
        wait_records(
            &gw,
            &[
                "kind=connect",
                &host,
                "verdict=refused",
                "reason=ip_literal",
            ],
            1,
            Duration::from_secs(10),
        )
        .await;
    }
    log_is_clean(&gw, &[&tok]);
}

/// Names the test DNS server answers with an address the gateway must never connect to.
const INTERNAL: &[(&str, &[&str])] = &[
    ("loop.test", &["127.0.0.1"]),
    ("loop2.test", &["127.8.9.10"]),
    ("loop6.test", &["::1"]),
    ("zero.test", &["0.0.0.0"]),
    ("zero6.test", &["::"]),
    ("metadata.test", &["169.254.169.254"]),
    ("ll6.test", &["fe80::1"]),
    ("private.test", &["10.99.0.1"]),
    ("p172.test", &["172.16.0.1"]),
    ("p192.test", &["192.168.0.1"]),
    ("ula.test", &["fd00::1"]),
    ("cgnat.test", &["100.64.0.1"]),
    ("mapped.test", &["::ffff:127.0.0.1"]),
    ("mapped-meta.test", &["::ffff:169.254.169.254"]),
    ("nat64-meta.test", &["64:ff9b::a9fe:a9fe"]),
    ("gw-listen.test", &["10.214.0.1"]),
    ("gw-public.test", &[GW_PUBLIC_IP]),
    ("mcast.test", &["224.0.0.1"]),
    ("bcast.test", &["255.255.255.255"]),
    (
        "all-bad.test",
        &[
            "10.99.0.1",
            "127.0.0.1",
            "169.254.169.254",
            GW_PUBLIC_IP,
            "::1",
            "fd00::1",
            "::ffff:10.99.0.1",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn allowed_names_answered_with_internal_or_own_addresses_are_refused() {
    let Some(net) = Net::setup() else { return };
    for (name, ips) in INTERNAL {
        net.dns.set(name, ips);
    }
    let gw = Gateway::start_system_dns(&net, &[]);
    let names: Vec<&str> = INTERNAL.iter().map(|(n, _)| *n).collect();
    let tok = token("run-dst-2", &names);
    let auth = basic(&tok);
    let before = snapshot(&net);
    for name in &names {
        refused(
            &net,
            &gw,
            &connect_head(&format!("{name}:443"), &auth),
            403,
            "forbidden_address",
        )
        .await;
        refused(
            &net,
            &gw,
            &get_head(&format!("http://{name}/latest/meta-data"), name, &auth),
            403,
            "forbidden_address",
        )
        .await;
        // The answer came from DNS, through the system resolver.
        assert!(net.dns.queries(name) > 0, "{name} was never looked up");
    }
    nothing_reached(&net, &before, &[]);
    let record = gw
        .wait_record(&["host=gw-public.test", "reason=forbidden_address"])
        .await;
    assert_eq!(field(&record, "upstream"), "-", "{record}");
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_address_of_an_answer_is_checked_and_only_public_ones_are_used() {
    let Some(net) = Net::setup() else { return };
    net.dns.set(
        "mixed.test",
        &[
            "10.99.0.1",
            "169.254.169.254",
            GW_PUBLIC_IP,
            "11.0.0.1",
            "::1",
        ],
    );
    let gw = Gateway::start_system_dns(&net, &[]);
    let tok = token("run-dst-3", &["mixed.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    let mut s = tunnel(&net, &gw, "mixed.test:443", &auth).await;
    s.write_all(&hello(Some("mixed.test")))
        .await
        .expect("hello");
    drop(s);
    let record = gw.wait_record(&["host=mixed.test", "kind=connect"]).await;
    assert_eq!(field(&record, "upstream"), "11.0.0.1:443", "{record}");
    nothing_reached(&net, &before, &["11.0.0.1:443"]);
    assert_eq!(
        net.accepts("11.0.0.1:443")
            - before
                .get(&"11.0.0.1:443".parse().expect("addr"))
                .copied()
                .unwrap_or(0),
        1
    );
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_that_resolves_differently_on_its_second_lookup_is_used_as_checked() {
    let Some(net) = Net::setup() else { return };
    // The first lookup answers a public address, every later one a private one.
    net.dns
        .set_sequence("rebind.test", &[&["11.0.0.1"], &["10.99.0.1"]]);
    net.dns
        .set_sequence("rebind-http.test", &[&["11.0.0.1"], &["10.99.0.1"]]);
    let gw = Gateway::start_system_dns(&net, &[]);
    let tok = token("run-dst-4", &["rebind.test", "rebind-http.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    // One lookup per connection: the address checked is the address connected to.
    let mut s = tunnel(&net, &gw, "rebind.test:443", &auth).await;
    s.write_all(&hello(Some("rebind.test")))
        .await
        .expect("hello");
    drop(s);
    let record = gw.wait_record(&["host=rebind.test", "kind=connect"]).await;
    assert_eq!(field(&record, "upstream"), "11.0.0.1:443", "{record}");
    assert_eq!(net.dns.a_queries("rebind.test"), 1);
    let mut s = net.connect_from_hub(gw.addr);
    let head = exchange(
        &mut s,
        &get_head("http://rebind-http.test/hello", "rebind-http.test", &auth),
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    let mut body = head.rest.clone();
    body.extend(read_all(&mut s).await);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "hello from rebind-http.test over http"
    );
    assert_eq!(net.dns.a_queries("rebind-http.test"), 1);
    // The second lookup's private answer is refused, and nothing reaches it.
    refused(
        &net,
        &gw,
        &connect_head("rebind.test:443", &auth),
        403,
        "forbidden_address",
    )
    .await;
    refused(
        &net,
        &gw,
        &get_head("http://rebind-http.test/hello", "rebind-http.test", &auth),
        403,
        "forbidden_address",
    )
    .await;
    nothing_reached(&net, &before, &["11.0.0.1:443", "11.0.0.1:80"]);
    assert_eq!(
        net.accepts("10.99.0.1:443") + net.accepts("10.99.0.1:80"),
        0
    );
    log_is_clean(&gw, &[&tok]);
}

// ---------------------------------------------------------------------------------------------
// Names.

#[tokio::test(flavor = "multi_thread")]
async fn trailing_dots_and_case_are_the_same_name_and_nothing_else() {
    let Some(net) = Net::setup() else { return };
    net.dns.set("pkg.test", &["11.0.0.1"]);
    net.dns.set("*.test", &[EVIL_IP]);
    let gw = Gateway::start_system_dns(&net, &[]);
    let tok = token("run-name-1", &["pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    for spelling in ["PKG.TEST", "Pkg.Test.", "pkg.test."] {
        let mut s = net.connect_from_hub(gw.addr);
        let head = exchange(
            &mut s,
            &get_head(&format!("http://{spelling}/headers"), spelling, &auth),
        )
        .await;
        assert_eq!(head.status, 200, "{spelling}: {head:?}");
        let mut body = head.rest.clone();
        body.extend(read_all(&mut s).await);
        // Forwarded with the checked name, whatever the spelling.
        assert!(
            String::from_utf8_lossy(&body).starts_with("host: pkg.test\n"),
            "{spelling}: {body:?}"
        );
        let mut s = tunnel(&net, &gw, &format!("{spelling}:443"), &auth).await;
        s.write_all(&hello(Some("pkg.test"))).await.expect("hello");
    }
    for bad in ["pkg.test..", ".pkg.test", "pkg..test"] {
        refused(
            &net,
            &gw,
            &connect_head(&format!("{bad}:443"), &auth),
            400,
            "bad_request",
        )
        .await;
    }
    nothing_reached(&net, &before, &["11.0.0.1:80", "11.0.0.1:443"]);
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn lookalike_and_punycode_names_are_other_names() {
    let Some(net) = Net::setup() else { return };
    let bucher = egress_gateway::allowlist::normalize_host("bücher.test").expect("name");
    // Cyrillic `р` and `е`, fullwidth letters, a dotless i: each a different DNS name.
    let lookalikes: Vec<String> = [
        "рkg.test",
        "pkg.tеst",
        "bücһer.test",
        "pkğ.test",
        "pkı.test",
    ]
    .iter()
    .map(|n| egress_gateway::allowlist::normalize_host(n).expect("name"))
    .collect();
    net.dns.set("pkg.test", &["11.0.0.1"]);
    net.dns.set(&bucher, &["11.0.0.1"]);
    for n in &lookalikes {
        net.dns.set(n, &[EVIL_IP]);
    }
    let gw = Gateway::start_system_dns(&net, &[]);
    // The allowlist holds a Unicode entry: it matches its Punycode form, in any case.
    let tok = token("run-name-2", &["pkg.test", "bücher.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    for n in &lookalikes {
        assert!(n.starts_with("xn--") || n.contains(".xn--"), "{n}");
        refused(
            &net,
            &gw,
            &connect_head(&format!("{n}:443"), &auth),
            403,
            "host_not_allowed",
        )
        .await;
    }
    // Raw Unicode on the request line is not HTTP: refused before any check.
    let (status, _, text) =
        send_raw(&net, &gw, connect_head("рkg.test:443", &auth).as_bytes()).await;
    assert_eq!(status, 400, "{text}");
    // The Punycode of the listed name, in upper case, is the listed name.
    let upper = bucher.to_ascii_uppercase();
    let mut s = tunnel(&net, &gw, &format!("{upper}:443"), &auth).await;
    s.write_all(&hello(Some(&bucher))).await.expect("hello");
    drop(s);
    gw.wait_record(&[&format!("host={bucher}"), "upstream=11.0.0.1:443"])
        .await;
    // A TLS name in Unicode, or a lookalike, does not pass the check of an allowed CONNECT.
    for sni in [lookalikes[0].as_bytes(), "рkg.test".as_bytes()] {
        let mut s = tunnel(&net, &gw, "pkg.test:443", &auth).await;
        s.write_all(&raw_hello(sni)).await.expect("hello");
        assert_eq!(read_all(&mut s).await, [21, 3, 3, 0, 2, 2, 49]);
    }
    nothing_reached(&net, &before, &["11.0.0.1:443"]);
    assert_eq!(net.accepts(&format!("{EVIL_IP}:443")), 0);
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn suffix_path_and_userinfo_tricks_do_not_reach_the_other_host() {
    let Some(net) = Net::setup() else { return };
    net.dns.set("pkg.test", &["11.0.0.1"]);
    net.dns.set("*.test", &[EVIL_IP]);
    net.dns.set("*.evil.test", &[EVIL_IP]);
    let gw = Gateway::start_system_dns(&net, &[]);
    let tok = token("run-name-3", &["pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    let cases: &[(&str, u16, &str)] = &[
        ("CONNECT pkg.test.evil.test:443", 403, "host_not_allowed"),
        ("CONNECT evilpkg.test:443", 403, "host_not_allowed"),
        ("GET http://pkg.test.evil.test/", 403, "host_not_allowed"),
        ("GET http://evil.test/pkg.test", 403, "host_not_allowed"),
        (
            "GET http://evil.test/http://pkg.test/",
            403,
            "host_not_allowed",
        ),
        ("GET http://evil.test?pkg.test", 403, "host_not_allowed"),
        ("CONNECT evil.test/pkg.test:443", 400, ""),
        ("CONNECT pkg.test@evil.test:443", 400, "bad_request"),
        ("CONNECT evil.test@pkg.test:443", 400, "bad_request"),
        ("CONNECT run:x@pkg.test:443", 400, "bad_request"),
        ("GET http://pkg.test@evil.test/", 400, "bad_request"),
        ("GET http://evil.test@pkg.test/", 400, "bad_request"),
        ("GET http://pkg.test:80@evil.test/", 400, "bad_request"),
        ("GET http://evil.test%2fpkg.test/", 400, ""),
        ("GET http://evil.test%40pkg.test/", 400, ""),
        ("CONNECT pkg.test:443:443", 400, ""),
        ("CONNECT pkg.test:+443", 400, "bad_request"),
        ("CONNECT http://pkg.test:443", 400, "bad_request"),
        ("CONNECT pkg.test:443/evil.test", 400, ""),
    ];
    for (line, status, reason) in cases {
        let host = line
            .split(' ')
            .nth(1)
            .and_then(|t| t.strip_prefix("http://").or(Some(t)))
            .unwrap_or_default()
            .split('/')
            .next()
            .unwrap_or_default();
        let head =
            format!("{line} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: {auth}\r\n\r\n");
        let (got, why, text) = send_raw(&net, &gw, head.as_bytes()).await;
        assert_eq!(got, *status, "{line}: {text}");
        if !reason.is_empty() {
            assert_eq!(why, *reason, "{line}: {text}");
        }
    }
    nothing_reached(&net, &before, &[]);
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn wildcards_admit_names_below_the_suffix_only() {
    let Some(net) = Net::setup() else { return };
    net.dns.set("*.wild.test", &["11.0.0.1"]);
    net.dns.set("wild.test", &[EVIL_IP]);
    net.dns.set("*.test", &[EVIL_IP]);
    net.dns.set("*.evil.test", &[EVIL_IP]);
    let gw = Gateway::start_system_dns(&net, &[]);
    let tok = token("run-name-4", &["*.wild.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    for ok in ["a.wild.test", "A.B.Wild.Test.", "x-1.wild.test"] {
        let mut s = tunnel(&net, &gw, &format!("{ok}:443"), &auth).await;
        s.write_all(&hello(Some(&ok.trim_end_matches('.').to_ascii_lowercase())))
            .await
            .expect("hello");
    }
    for (no, status, reason) in [
        ("wild.test", 403, "host_not_allowed"),
        ("evilwild.test", 403, "host_not_allowed"),
        ("a.wild.test.evil.test", 403, "host_not_allowed"),
        ("wild.test.evil.test", 403, "host_not_allowed"),
        ("*.wild.test", 400, "bad_request"),
        (".wild.test", 400, "bad_request"),
        ("a..wild.test", 400, "bad_request"),
    ] {
        refused(
            &net,
            &gw,
            &connect_head(&format!("{no}:443"), &auth),
            status,
            reason,
        )
        .await;
    }
    // A port the wildcard does not name.
    refused(
        &net,
        &gw,
        &connect_head("a.wild.test:8443", &auth),
        403,
        "port_not_allowed",
    )
    .await;
    nothing_reached(&net, &before, &["11.0.0.1:443"]);
    log_is_clean(&gw, &[&tok]);
}

// ---------------------------------------------------------------------------------------------
// Protocol.

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_name_other_than_the_connect_host_gets_no_byte_through() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-proto-1", &["pkg.test", "api.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    let alert = [21_u8, 3, 3, 0, 2, 2, 49];
    for (sni, reason) in [
        (Some("evil.test"), "sni_mismatch"),
        (Some("api.test"), "sni_mismatch"),
        (Some("pkg.test.evil.test"), "sni_mismatch"),
        (None, "no_sni"),
    ] {
        let mut s = tunnel(&net, &gw, "pkg.test:443", &auth).await;
        s.write_all(&hello(sni)).await.expect("hello");
        assert_eq!(read_all(&mut s).await, alert, "{sni:?}");
        let record = wait_records(
            &gw,
            &["host=pkg.test", &format!("reason={reason}")],
            1,
            Duration::from_secs(10),
        )
        .await;
        assert!(
            record.iter().all(|r| field(r, "bytes_up") == "0"),
            "{record:?}"
        );
    }
    // Hostile names in the hello are refused as malformed, never compared or logged raw.
    for sni in [&b"pkg.test\r\nX: 1"[..], b"pkg.test\0", b"\x1b[31mpkg.test"] {
        let mut s = tunnel(&net, &gw, "pkg.test:443", &auth).await;
        s.write_all(&raw_hello(sni)).await.expect("hello");
        assert_eq!(read_all(&mut s).await, alert);
    }
    // The same name in another spelling is the same name.
    let mut s = tunnel(&net, &gw, "pkg.test:443", &auth).await;
    s.write_all(&raw_hello(b"PKG.Test.")).await.expect("hello");
    drop(s);
    // The gateway connects to the CONNECT host before it answers 200, and to nothing else; no
    // TLS server ever saw a request.
    nothing_reached(&net, &before, &["11.0.0.1:443"]);
    assert!(net.requests().is_empty(), "{:?}", net.requests());
    gw.wait_record(&["reason=bad_client_hello"]).await;
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hello_offering_encrypted_client_hello_is_refused_before_the_upstream_sees_it() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let upstream = RetryServer::start(&net);
    let target = format!("pkg.test:{RETRY_PORT}");
    let tok = token("run-proto-ech", &[&target]);
    let auth = basic(&tok);
    // The attack: a front the allowlist names (`pkg.test`) in the clear, another site of the
    // same CDN sealed inside. Then the decoy form a client sends with no ECH configuration
    // (the gateway cannot tell it from the real thing), and the code points of the drafts
    // (0xfe08 to 0xfe0c), of ECH's inner-only `ech_outer_extensions` (0xfd00) and of the
    // older encrypted SNI (0xffce), each beside a clear `server_name` that matches.
    let real = ech_hello("pkg.test", Some("evil.test"));
    let grease = ech_hello("pkg.test", None);
    assert!(has_extension(&real, ECH_EXTENSION) && has_extension(&grease, ECH_EXTENSION));
    let mut hellos = vec![("real ECH", real), ("GREASE ECH", grease)];
    for kind in [0xfe08_u16, 0xfe0a, 0xfe0c, ECH_EXTENSION, 0xfd00, 0xffce] {
        let hello = raw_hello_with(b"pkg.test", &[(kind, &[0, 1, 0, 1, 7, 0, 0, 0, 0])]);
        hellos.push(("hand-made", hello));
    }
    for (n, (what, hello)) in hellos.iter().enumerate() {
        let mut s = tunnel(&net, &gw, &target, &auth).await;
        s.write_all(hello).await.expect("hello");
        assert_eq!(read_all(&mut s).await, ALERT, "{what} hello #{n}");
        // The gateway connects before it answers 200; that connection carried nothing.
        assert!(
            upstream.ended(n).await.is_empty(),
            "the upstream received a {what} hello"
        );
    }
    assert_eq!(upstream.connections(), hellos.len());
    let records = wait_records(
        &gw,
        &["guest=run-proto-ech", "verdict=refused", "reason=ech"],
        hellos.len(),
        Duration::from_secs(10),
    )
    .await;
    assert!(
        records.iter().all(|r| field(r, "bytes_up") == "0"),
        "{records:?}"
    );
    assert!(
        !gw.log().contains("verdict=allowed"),
        "an ECH hello was allowed:\n{}",
        gw.log()
    );
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_hello_after_a_hello_retry_request_gets_the_same_checks() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let upstream = RetryServer::start(&net);
    let target = format!("pkg.test:{RETRY_PORT}");
    let tok = token("run-proto-hrr", &["pkg.test", &target]);
    let auth = basic(&tok);
    // A real TLS client whose first key share the server does not take is asked for another
    // (a HelloRetryRequest) and completes through the gateway.
    let retrying =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::CryptoProvider {
            kx_groups: vec![
                rustls::crypto::aws_lc_rs::kx_group::MLKEM768,
                rustls::crypto::aws_lc_rs::kx_group::X25519,
            ],
            ..rustls::crypto::aws_lc_rs::default_provider()
        }))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(net.roots())
        .with_no_client_auth();
    let s = tunnel(&net, &gw, "pkg.test:443", &auth).await;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(retrying))
        .connect(name("pkg.test"), s)
        .await
        .expect("TLS through a retry");
    assert_eq!(
        tls.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::FullWithHelloRetryRequest)
    );
    let raw = get(&mut tls, "pkg.test", "/hello").await;
    assert_eq!(body_text(&raw), "hello from pkg.test over https");
    drop(tls);
    gw.wait_record(&["guest=run-proto-hrr", "verdict=allowed", "reason=closed"])
        .await;

    // Against a server that always asks for a retry: the second hello is checked like the
    // first, whether it is sent after the retry request or with the first hello, before it.
    let first = hello(Some("pkg.test"));
    let mut not_a_hello = hello(Some("pkg.test"));
    not_a_hello[5] = 2; // a ServerHello's type
    let cases: [(&str, Vec<u8>, &str, bool); 6] = [
        (
            "real ECH",
            ech_hello("pkg.test", Some("evil.test")),
            "ech",
            false,
        ),
        ("GREASE ECH", ech_hello("pkg.test", None), "ech", false),
        (
            "another name",
            hello(Some("api.test")),
            "sni_mismatch",
            false,
        ),
        ("no name", hello(None), "no_sni", false),
        ("not a hello", not_a_hello, "bad_client_hello", false),
        (
            "real ECH, pipelined",
            ech_hello("pkg.test", Some("evil.test")),
            "ech",
            true,
        ),
    ];
    let retry = retry_request();
    for (what, second, reason, pipelined) in cases {
        let n = upstream.connections();
        let mut s = tunnel(&net, &gw, &target, &auth).await;
        let mut answer = Vec::new();
        if pipelined {
            s.write_all(&[&first[..], &CCS, &second].concat())
                .await
                .expect("hellos");
        } else {
            s.write_all(&first).await.expect("first hello");
            let mut got = vec![0; retry.len()];
            tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
                .await
                .expect("the retry request in time")
                .expect("the retry request");
            answer.extend(got);
            s.write_all(&[&CCS[..], &second].concat())
                .await
                .expect("second hello");
        }
        answer.extend(read_all(&mut s).await);
        assert_eq!(answer, [&retry[..], &ALERT].concat(), "{what}");
        // The ChangeCipherSpec before the second hello is passed on (it cannot carry one).
        let passed = [&first[..], &CCS].concat();
        assert_eq!(
            upstream.ended(n).await,
            passed,
            "{what}: the upstream got more than the first hello"
        );
        let records = wait_records(
            &gw,
            &[
                "guest=run-proto-hrr",
                "verdict=refused",
                &format!("reason={reason}"),
            ],
            1,
            Duration::from_secs(10),
        )
        .await;
        assert!(
            records
                .iter()
                .all(|r| field(r, "bytes_up") == passed.len().to_string()),
            "{what}: {records:?}"
        );
    }
    // A second hello that passes reaches the server as it was sent.
    let n = upstream.connections();
    let mut s = tunnel(&net, &gw, &target, &auth).await;
    s.write_all(&first).await.expect("first hello");
    let mut got = vec![0; retry.len()];
    s.read_exact(&mut got).await.expect("the retry request");
    let second = hello(Some("pkg.test"));
    s.write_all(&[&CCS[..], &second].concat())
        .await
        .expect("second hello");
    let expected = [&first[..], &CCS, &second].concat();
    assert_eq!(upstream.received(n, &expected).await, expected);
    drop(s);
    gw.wait_record(&["guest=run-proto-hrr", "port=9445", "verdict=allowed"])
        .await;
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_absolute_uri_is_forwarded_to_its_own_host_whatever_host_says() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-proto-2", &["pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    let mut s = net.connect_from_hub(gw.addr);
    let head = exchange(
        &mut s,
        &get_head("http://pkg.test/headers", "evil.test", &auth),
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    let mut body = head.rest.clone();
    body.extend(read_all(&mut s).await);
    assert!(
        String::from_utf8_lossy(&body).starts_with("host: pkg.test\n"),
        "{body:?}"
    );
    // Two Host headers, or a Host naming a port, change nothing either.
    let mut s = net.connect_from_hub(gw.addr);
    let head = exchange(
        &mut s,
        &format!(
            "GET http://pkg.test/headers HTTP/1.1\r\nHost: evil.test\r\nHost: evil.test:8080\r\nProxy-Authorization: {auth}\r\n\r\n"
        ),
    )
    .await;
    if head.status == 200 {
        let mut body = head.rest.clone();
        body.extend(read_all(&mut s).await);
        assert!(
            String::from_utf8_lossy(&body).starts_with("host: pkg.test\n"),
            "{body:?}"
        );
    } else {
        assert_eq!(head.status, 400, "{head:?}");
    }
    // The URI decides: an unlisted host in it is refused, whatever Host says.
    refused(
        &net,
        &gw,
        &get_head("http://evil.test/", "pkg.test", &auth),
        403,
        "host_not_allowed",
    )
    .await;
    // Origin-form (no host in the URI) is not a proxy request.
    refused(
        &net,
        &gw,
        &get_head("/hello", "pkg.test", &auth),
        400,
        "bad_request",
    )
    .await;
    nothing_reached(&net, &before, &["11.0.0.1:80"]);
    assert!(
        net.requests().iter().all(|r| r.starts_with("pkg.test ")),
        "{:?}",
        net.requests()
    );
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_proxy_authorization_headers_are_refused() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let narrow = token("run-proto-3a", &["pkg.test"]);
    let wide = token("run-proto-3b", &["evil.test", "pkg.test"]);
    let before = snapshot(&net);
    for (first, second) in [(&narrow, &wide), (&wide, &narrow), (&wide, &wide)] {
        let head = format!(
            "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\nProxy-Authorization: {}\r\nProxy-Authorization: {}\r\n\r\n",
            basic(first),
            basic(second)
        );
        refused(&net, &gw, &head, 407, "bad_credentials").await;
    }
    // Two credentials folded into one value.
    let head = format!(
        "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\nProxy-Authorization: {}, {}\r\n\r\n",
        basic(&narrow),
        basic(&wide)
    );
    refused(&net, &gw, &head, 407, "bad_credentials").await;
    nothing_reached(&net, &before, &[]);
    log_is_clean(&gw, &[&narrow, &wide]);
}

#[tokio::test(flavor = "multi_thread")]
async fn content_length_beside_transfer_encoding_is_read_by_the_coding_alone_then_closed() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-proto-4a", &["pkg.test"]);
    let auth = basic(&tok);
    let smuggled = format!(
        "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let before = snapshot(&net);
    // RFC 9112 §6.1: the coding wins, the length is dropped, the connection is closed after the
    // answer. Either order, a length shorter or longer than the chunked body.
    for framing in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 0\r\n",
        "Content-Length: 200\r\nTransfer-Encoding: chunked\r\n",
    ] {
        let head = format!(
            "POST http://pkg.test/framing HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: {auth}\r\n{framing}\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"
        );
        let (status, _, text) = send_raw(&net, &gw, head.as_bytes()).await;
        assert_eq!(status, 200, "{framing:?}: {text}");
        assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
        // The upstream got the gateway's own framing: the body chunked, no length of the
        // client's.
        assert!(
            text.ends_with("content-length: absent\ntransfer-encoding: chunked\n"),
            "{framing:?}: {text}"
        );
    }
    nothing_reached(&net, &before, &["11.0.0.1:80"]);
    assert_eq!(net.requests(), ["pkg.test /framing"; 3]);
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn ambiguous_message_framing_is_refused_before_anything_is_reached() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-proto-4", &["pkg.test"]);
    let auth = basic(&tok);
    let smuggled = "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    let before = snapshot(&net);
    let framings = [
        // Transfer codings that are not plain chunked.
        "Transfer-Encoding: chunked, identity\r\n".to_owned(),
        "Transfer-Encoding: xchunked\r\n".to_owned(),
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n".to_owned(),
        // Two lengths.
        "Content-Length: 0\r\nContent-Length: 52\r\n".to_owned(),
        "Content-Length: 0, 52\r\n".to_owned(),
    ];
    for framing in &framings {
        let head = format!(
            "POST http://pkg.test/hello HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: {auth}\r\n{framing}\r\n0\r\n\r\n{smuggled}"
        );
        let (status, why, text) = send_raw(&net, &gw, head.as_bytes()).await;
        assert_eq!(status, 400, "{framing:?}: {text}");
        assert!(
            why.is_empty() || why == "bad_request",
            "{framing:?}: {text}"
        );
    }
    // A CONNECT has no content: a length or a coding on it is refused.
    for framing in [
        "Content-Length: 5\r\n",
        "Transfer-Encoding: chunked\r\n",
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    ] {
        let head = format!(
            "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\nProxy-Authorization: {auth}\r\n{framing}\r\nhello"
        );
        refused(&net, &gw, &head, 400, "bad_request").await;
    }
    nothing_reached(&net, &before, &[]);
    assert!(net.requests().is_empty(), "{:?}", net.requests());
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_request_on_a_kept_alive_connection_is_never_served() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-proto-5", &["pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    // Pipelined: an allowed request, then an unlisted host, then the allowed host with another
    // Host, each with keep-alive asked for.
    let first = format!(
        "GET http://pkg.test/hello HTTP/1.1\r\nHost: pkg.test\r\nConnection: keep-alive\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let second = format!(
        "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\nConnection: keep-alive\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let third = format!(
        "GET http://pkg.test/smuggled HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let mut s = net.connect_from_hub(gw.addr);
    s.write_all(format!("{first}{second}{third}").as_bytes())
        .await
        .expect("send");
    let raw = read_all(&mut s).await;
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("hello from pkg.test over http"), "{text}");
    // A body that holds a request reaches the upstream as a body: one request, never two.
    let body = format!("{second}{third}");
    let post = format!(
        "POST http://pkg.test/hello HTTP/1.1\r\nHost: pkg.test\r\nContent-Length: {}\r\nProxy-Authorization: {auth}\r\n\r\n{body}",
        body.len()
    );
    let (status, _, text) = send_raw(&net, &gw, post.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    // The same with a chunked body.
    let chunked = format!(
        "POST http://pkg.test/hello HTTP/1.1\r\nHost: pkg.test\r\nTransfer-Encoding: chunked\r\nProxy-Authorization: {auth}\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n{third}",
        body.len()
    );
    let (status, _, text) = send_raw(&net, &gw, chunked.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    nothing_reached(&net, &before, &["11.0.0.1:80"]);
    assert_eq!(
        net.requests(),
        ["pkg.test /hello", "pkg.test /hello", "pkg.test /hello"]
    );
    assert_eq!(
        net.accepts("11.0.0.1:80")
            - before
                .get(&"11.0.0.1:80".parse().expect("addr"))
                .copied()
                .unwrap_or(0),
        3
    );
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn request_lines_and_headers_over_their_limits_are_refused() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &["--max-request-head-bytes", "8192"]);
    let tok = token("run-proto-6", &["pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    let long_line = format!(
        "GET http://pkg.test/{} HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: {auth}\r\n\r\n",
        "a".repeat(9000)
    );
    let long_header = format!(
        "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test\r\nX-Pad: {}\r\nProxy-Authorization: {auth}\r\n\r\n",
        "a".repeat(9000)
    );
    let many_headers = format!(
        "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test\r\n{}Proxy-Authorization: {auth}\r\n\r\n",
        "X-Many: a\r\n".repeat(200)
    );
    let huge = format!(
        "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    for head in [&long_line, &long_header, &many_headers, &huge] {
        let (status, _, text) = send_raw(&net, &gw, head.as_bytes()).await;
        assert!(
            status == 431 || status == 414 || (status == 0 && text.is_empty()),
            "{status}: {text}"
        );
    }
    // A head well inside the limit is served.
    let mut s = net.connect_from_hub(gw.addr);
    let head = exchange(
        &mut s,
        &format!(
            "GET http://pkg.test/hello HTTP/1.1\r\nHost: pkg.test\r\nX-Pad: {}\r\nProxy-Authorization: {auth}\r\n\r\n",
            "a".repeat(4000)
        ),
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    drop(s);
    nothing_reached(&net, &before, &["11.0.0.1:80"]);
    wait_records(&gw, &["reason=bad_request"], 4, Duration::from_secs(10)).await;
    log_is_clean(&gw, &[&tok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_bytes_reach_the_log_escaped_or_not_at_all() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let tok = token("run-proto-7", &["pkg.test"]);
    let auth = basic(&tok);
    let before = snapshot(&net);
    // Bytes HTTP refuses outright: control characters in the target or in a header.
    for head in [
        b"CONNECT pkg.test\x1b[2J:443 HTTP/1.1\r\n\r\n".to_vec(),
        b"CONNECT pkg.test:443 HTTP/1.1\r\nX: a\x1b[31mb\r\n\r\n".to_vec(),
        b"CONNECT pkg.test:443 HTTP/1.1\r\nX: a\0b\r\n\r\n".to_vec(),
        b"CONNECT pkg.test:443 HTTP/1.1\r\nX: a\rb\r\n\r\n".to_vec(),
        b"CONNECT pkg.test:443 HTTP/1.1\r\nX: a\xff\xfeb\r\n\r\n".to_vec(),
        b"GET http://pkg.test/\xc3\xa9\x1b HTTP/1.1\r\n\r\n".to_vec(),
    ] {
        let (status, _, text) = send_raw(&net, &gw, &head).await;
        assert!(status == 400 || status == 407, "{head:?}: {text}");
    }
    // Characters a URL allows but a DNS name does not: the record shows them escaped.
    let odd = "under_score=x!$'&(*).test";
    refused(
        &net,
        &gw,
        &connect_head(&format!("{odd}:443"), &auth),
        400,
        "bad_request",
    )
    .await;
    // Percent-escapes in a host are refused by the HTTP parser itself.
    let percent = "evil%0d%0a%1b.test";
    let (status, _, text) = send_raw(
        &net,
        &gw,
        connect_head(&format!("{percent}:443"), &auth).as_bytes(),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    // A user name of control characters beside a valid token: admitted, never logged.
    let user = base64::engine::general_purpose::STANDARD
        .encode(format!("\x1b[31m\r\nverdict=allowed\0:{tok}"));
    let mut s = net.connect_from_hub(gw.addr);
    let head = exchange(
        &mut s,
        &format!(
            "GET http://pkg.test/hello HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: Basic {user}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    drop(s);
    gw.wait_record(&[&format!("host={}", escaped(odd)), "reason=bad_request"])
        .await;
    nothing_reached(&net, &before, &["11.0.0.1:80"]);
    gw.wait_record(&["guest=run-proto-7", "kind=http", "verdict=allowed"])
        .await;
    let log = gw.log();
    assert!(
        !log.contains("verdict=allowed\0"),
        "the user name reached the log"
    );
    log_is_clean(&gw, &[&tok]);
}

// ---------------------------------------------------------------------------------------------
// Tokens.

#[tokio::test(flavor = "multi_thread")]
async fn expired_truncated_and_foreign_tokens_reach_nothing() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let secret = egress_gateway::Secret::new(common::SECRET.to_vec()).expect("secret");
    let good = token("run-tok-1", &["pkg.test"]);
    // A finished run's token: expired a second ago, or long ago.
    let expired = egress_gateway::mint_until(
        &secret,
        "run-tok-0",
        &["pkg.test"],
        SystemTime::now() - Duration::from_secs(1),
    )
    .expect("mint");
    let ancient = egress_gateway::mint_until(
        &secret,
        "run-tok-0",
        &["pkg.test"],
        SystemTime::now() - Duration::from_secs(30 * 86400),
    )
    .expect("mint");
    let other = egress_gateway::Secret::new(b"another deployment's secret, 32+ bytes".to_vec())
        .expect("secret");
    let foreign =
        egress_gateway::mint(&other, "run-tok-1", &["pkg.test"], Duration::from_secs(300))
            .expect("mint");
    let before = snapshot(&net);
    let mut cases: Vec<(String, &str)> = vec![
        (expired.clone(), "token_expired"),
        (ancient.clone(), "token_expired"),
        (foreign.clone(), "bad_credentials"),
        (String::new(), "bad_credentials"),
        ("x".repeat(5000), "bad_credentials"),
        (format!("{good}="), "bad_credentials"),
        (format!("{good}A"), "bad_credentials"),
    ];
    for cut in [1, 2, 10, 43, good.len() - 1] {
        cases.push((good[..good.len() - cut].to_owned(), "bad_credentials"));
    }
    for (tok, reason) in &cases {
        refused(
            &net,
            &gw,
            &connect_head("pkg.test:443", &basic(tok)),
            407,
            reason,
        )
        .await;
        refused(
            &net,
            &gw,
            &get_head("http://pkg.test/hello", "pkg.test", &basic(tok)),
            407,
            reason,
        )
        .await;
    }
    // The token in the user-name position is accepted (an empty password); anywhere else it
    // is not a credential.
    let as_user = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{good}:"))
    );
    refused(
        &net,
        &gw,
        &connect_head("evil.test:443", &as_user),
        403,
        "host_not_allowed",
    )
    .await;
    for value in [
        format!("Bearer {good}"),
        format!("Basic {good}"),
        format!("Digest {}", basic(&good).trim_start_matches("Basic ")),
    ] {
        let (status, _, text) =
            send_raw(&net, &gw, connect_head("pkg.test:443", &value).as_bytes()).await;
        assert_eq!(status, 407, "{value}: {text}");
    }
    nothing_reached(&net, &before, &[]);
    let mut all: Vec<&str> = cases
        .iter()
        .map(|(t, _)| t.as_str())
        .filter(|t| t.len() > 20)
        .collect();
    all.extend([good.as_str()]);
    log_is_clean(&gw, &all);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_runs_token_reaches_only_its_own_domains() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let run_a = token("run-tok-a", &["pkg.test"]);
    let run_b = token("run-tok-b", &["api.test"]);
    let before = snapshot(&net);
    refused(
        &net,
        &gw,
        &connect_head("api.test:443", &basic(&run_a)),
        403,
        "host_not_allowed",
    )
    .await;
    refused(
        &net,
        &gw,
        &get_head("http://api.test/hello", "api.test", &basic(&run_a)),
        403,
        "host_not_allowed",
    )
    .await;
    refused(
        &net,
        &gw,
        &connect_head("pkg.test:443", &basic(&run_b)),
        403,
        "host_not_allowed",
    )
    .await;
    nothing_reached(&net, &before, &[]);
    // Each still reaches its own.
    let mut s = tunnel(&net, &gw, "api.test:443", &basic(&run_b)).await;
    s.write_all(&hello(Some("api.test"))).await.expect("hello");
    drop(s);
    gw.wait_record(&["guest=run-tok-b", "host=api.test", "upstream=11.0.0.2:443"])
        .await;
    log_is_clean(&gw, &[&run_a, &run_b]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_replayed_from_another_guest_shares_its_runs_limits() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &["--max-connections-per-credential", "2"]);
    let tok = token("run-tok-r", &["pkg.test"]);
    let auth = basic(&tok);
    // The run's own guest holds two tunnels.
    let _t1 = tunnel(&net, &gw, "pkg.test:443", &auth).await;
    let _t2 = tunnel(&net, &gw, "pkg.test:443", &auth).await;
    // The upstream counts its accepts on its own task, which may lag the tunnels' 200s: wait
    // for both before the snapshot, so that only the replay could move it.
    let upstream: SocketAddr = "11.0.0.1:443".parse().expect("addr");
    let counted = tokio::time::Instant::now() + Duration::from_secs(10);
    while net.all_accepts().get(&upstream).copied().unwrap_or(0) < 2
        && tokio::time::Instant::now() < counted
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another guest (another source address) replaying the same token gets no more.
    let before = snapshot(&net);
    let other = "10.216.0.1".parse().expect("ip");
    let mut s = net.connect_from_hub_as(other, gw.addr).await;
    let head = exchange(&mut s, &connect_head("pkg.test:443", &auth)).await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (429, "connection_limit"),
        "{head:?}"
    );
    nothing_reached(&net, &before, &[]);
    let records = wait_records(
        &gw,
        &["guest=run-tok-r", "reason=connection_limit"],
        1,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        records
            .iter()
            .any(|r| field(r, "peer").starts_with("10.216.0.1:")),
        "{records:?}"
    );
    log_is_clean(&gw, &[&tok]);
}

// ---------------------------------------------------------------------------------------------
// Load.

/// Connections held open from the hub, each sending `head` one byte every `gap` (nothing at
/// all when `head` is empty); each task returns how long its connection lived.
fn dribblers(
    net: &Net,
    gw: &Gateway,
    count: usize,
    head: &str,
    gap: Duration,
) -> Vec<tokio::task::JoinHandle<Duration>> {
    (0..count)
        .map(|_| {
            let stream = net.connect_from_hub(gw.addr);
            let head = head.as_bytes().to_vec();
            tokio::spawn(async move {
                let started = Instant::now();
                let (mut reader, mut writer) = stream.into_split();
                let write = async move {
                    for byte in head {
                        if writer.write_all(&[byte]).await.is_err() {
                            break;
                        }
                        tokio::time::sleep(gap).await;
                    }
                    std::future::pending::<()>().await;
                };
                let mut sink = [0_u8; 1024];
                let read =
                    async move { while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {} };
                tokio::select! {
                    () = write => {},
                    () = read => {},
                    () = tokio::time::sleep(Duration::from_secs(30)) => {},
                }
                started.elapsed()
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn slowloris_heads_are_closed_at_the_handshake_timeout_while_others_are_served() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &["--handshake-timeout", "2"]);
    let tok = token("run-load-1", &["pkg.test"]);
    let good = token("run-load-1-good", &["pkg.test"]);
    let slow = connect_head("pkg.test:443", &basic(&tok));
    let before = snapshot(&net);
    let dribbling = dribblers(&net, &gw, 100, &slow, Duration::from_millis(100));
    // A slow ClientHello after an admitted CONNECT: the same bound.
    let mut slow_hello = tunnel(&net, &gw, "pkg.test:443", &basic(&tok)).await;
    let hello_started = Instant::now();
    let hello_bytes = hello(Some("pkg.test"));
    let hello_task = tokio::spawn(async move {
        for b in hello_bytes {
            if slow_hello.write_all(&[b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        read_all(&mut slow_hello).await
    });
    for _ in 0..10 {
        served_within(&net, &gw, &basic(&good), Duration::from_secs(2)).await;
    }
    for task in dribbling {
        let lived = task.await.expect("dribbler");
        assert!(
            lived >= Duration::from_millis(1500) && lived < Duration::from_secs(5),
            "a slowloris connection lived {lived:?}"
        );
    }
    let _ = hello_task.await;
    let lived = hello_started.elapsed();
    assert!(
        lived < Duration::from_secs(5),
        "a slow ClientHello lived {lived:?}"
    );
    wait_records(&gw, &["reason=head_timeout"], 100, Duration::from_secs(10)).await;
    gw.wait_record(&["guest=run-load-1", "reason=hello_timeout"])
        .await;
    nothing_reached(&net, &before, &["11.0.0.1:443"]);
    log_is_clean(&gw, &[&tok, &good]);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_beyond_the_cap_do_not_lock_other_guests_out() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(
        &net,
        &[
            "--max-connections",
            "40",
            "--handshake-timeout",
            "8",
            "--max-connections-per-credential",
            "100",
        ],
    );
    let good = token("run-load-2-good", &["pkg.test"]);
    // An attacker holds more idle connections than the gateway serves at once, and keeps
    // opening more.
    let idle = dribblers(&net, &gw, 60, "", Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..5 {
        let more = dribblers(&net, &gw, 20, "", Duration::ZERO);
        served_within(&net, &gw, &basic(&good), Duration::from_secs(2)).await;
        for task in more {
            task.abort();
        }
    }
    // The connections pushed out were those that had sent no request: logged as evicted.
    wait_records(&gw, &["reason=evicted"], 20, Duration::from_secs(10)).await;
    for task in idle {
        task.abort();
    }
    // The cap in all still holds for connections that are served: with every place taken by
    // an admitted tunnel, a newcomer waits until one closes.
    let holder = token("run-load-2-holder", &["pkg.test:9444"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut held = Vec::new();
    for _ in 0..40 {
        let target = format!("pkg.test:{SINK_PORT}");
        let mut t = tunnel(&net, &gw, &target, &basic(&holder)).await;
        t.write_all(&hello(Some("pkg.test"))).await.expect("hello");
        held.push(t);
    }
    let good_auth = basic(&good);
    let waiting = tokio::time::timeout(Duration::from_secs(1), served(&net, &gw, &good_auth));
    assert!(waiting.await.is_err(), "served beyond --max-connections");
    let late = tokio::spawn({
        let auth = basic(&good);
        let mut s = net.connect_from_hub(gw.addr);
        async move {
            exchange(&mut s, &connect_head("pkg.test:443", &auth))
                .await
                .status
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!late.is_finished(), "served beyond --max-connections");
    held.pop();
    let status = tokio::time::timeout(Duration::from_secs(5), late)
        .await
        .expect("served once a place is free")
        .expect("task");
    assert_eq!(status, 200);
    log_is_clean(&gw, &[&good, &holder]);
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let kill = common::find_program("kill").expect("`kill` (procps) is installed");
    let status = std::process::Command::new(kill)
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_idle_connections_in_the_backlog_does_not_stall_other_guests() {
    let Some(net) = Net::setup() else { return };
    // A gateway on one core (as on a small host, where the burst showed every time; on two it
    // did most times), serving 8 connections at once, with the default 10 s to send a request
    // head.
    let cap = 8;
    let mut program = vec![common::gateway_bin().into_os_string()];
    if let Some(taskset) = common::find_program("taskset") {
        program.splice(0..0, [taskset.into_os_string(), "-c".into(), "0".into()]);
    } else {
        eprintln!("(util-linux's `taskset` is not installed: the gateway runs on every core)");
    }
    let gw = Gateway::start_command(&net, &program, &["--max-connections", "8"], false);
    let good = token("run-load-burst-good", &["pkg.test"]);
    let auth = basic(&good);
    for burst in 1..=2 {
        // Twice the cap of idle connections arrive together, every other one having sent half
        // a request head, then another guest's CONNECT: the gateway is stopped meanwhile, so all
        // of them wait in its listen backlog, as when they arrive faster than it accepts.
        signal(gw.pid(), "STOP");
        let half_head = &connect_head("pkg.test:443", &auth)[..20];
        let mut idle = Vec::new();
        for n in 0..2 * cap {
            let mut s = net.connect_from_hub(gw.addr);
            if n % 2 == 1 {
                s.write_all(half_head.as_bytes())
                    .await
                    .expect("half a head");
            }
            idle.push(s);
        }
        let mut s = net.connect_from_hub(gw.addr);
        s.write_all(connect_head("pkg.test:443", &auth).as_bytes())
            .await
            .expect("CONNECT");
        signal(gw.pid(), "CONT");
        let started = Instant::now();
        let head = tokio::time::timeout(Duration::from_secs(1), exchange(&mut s, ""))
            .await
            .unwrap_or_else(|_| {
                panic!("burst {burst}: the CONNECT was not answered within 1 s of the burst")
            });
        assert_eq!(head.status, 200, "burst {burst}: {head:?}");
        eprintln!("burst {burst}: answered in {:?}", started.elapsed());
        // And the tunnel it opened works.
        let mut tls = net
            .tls()
            .connect(name("pkg.test"), s)
            .await
            .expect("TLS through the tunnel");
        let raw = get(&mut tls, "pkg.test", "/hello").await;
        assert_eq!(body_text(&raw), "hello from pkg.test over https");
        drop(idle);
    }
    // The idle connections made room, each logged as evicted: at least the burst's excess
    // over the cap, twice, and one more each time for the CONNECT.
    wait_records(
        &gw,
        &["verdict=refused", "reason=evicted"],
        2 * (cap + 1),
        Duration::from_secs(10),
    )
    .await;
    log_is_clean(&gw, &[&good]);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_beyond_the_descriptor_limit_do_not_lock_other_guests_out() {
    let Some(net) = Net::setup() else { return };
    let Some(prlimit) = common::find_program("prlimit") else {
        eprintln!("skipped: util-linux's `prlimit` is not installed");
        return;
    };
    // A gateway that may open 200 files, told it may serve 4,096 connections at once.
    let program = [
        prlimit.into_os_string(),
        "--nofile=200:200".into(),
        "--".into(),
        common::gateway_bin().into_os_string(),
    ];
    let gw = Gateway::start_command(&net, &program, &["--handshake-timeout", "8"], false);
    let good = token("run-load-5-good", &["pkg.test"]);
    let idle = dribblers(&net, &gw, 300, "", Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        served_within(&net, &gw, &basic(&good), Duration::from_secs(2)).await;
    }
    for task in idle {
        task.abort();
    }
    assert!(
        gw.log().contains("open files"),
        "no warning about the descriptor limit:\n{}",
        gw.log()
    );
    log_is_clean(&gw, &[&good]);
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_idle_connections_are_closed_on_time_in_bounded_memory() {
    let Some(net) = Net::setup() else { return };
    if let Some(why) = common::raise_open_files(12_000) {
        eprintln!("skipped: {why}");
        return;
    }
    let gw = Gateway::start(
        &net,
        &[
            "--handshake-timeout",
            "4",
            "--idle-timeout",
            "6",
            "--max-connections-per-credential",
            "5000",
        ],
    );
    let good = token("run-load-3-good", &["pkg.test"]);
    let holder = token("run-load-3", &["pkg.test:9444"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = gw.rss_kib();
    // 2,000 connections that never send a byte: closed at the handshake timeout.
    let opened = Instant::now();
    let silent = dribblers(&net, &gw, 2000, "", Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with_silent = gw.rss_kib();
    served_within(&net, &gw, &basic(&good), Duration::from_secs(2)).await;
    let mut late = 0;
    for task in silent {
        let lived = task.await.expect("task");
        if lived > Duration::from_secs(7) {
            late += 1;
        }
    }
    assert_eq!(late, 0, "connections outlived the handshake timeout");
    assert!(opened.elapsed() < Duration::from_secs(10));
    // 2,000 idle tunnels (ClientHello passed, upstream connected): closed at the idle timeout.
    let hello_bytes = hello(Some("pkg.test"));
    let mut tunnels = Vec::new();
    for chunk in 0..40 {
        let batch: Vec<_> = (0..50)
            .map(|_| {
                let mut s = net.connect_from_hub(gw.addr);
                let auth = basic(&holder);
                let hello_bytes = hello_bytes.clone();
                tokio::spawn(async move {
                    let head = exchange(
                        &mut s,
                        &connect_head(&format!("pkg.test:{SINK_PORT}"), &auth),
                    )
                    .await;
                    assert_eq!(head.status, 200, "{head:?}");
                    s.write_all(&hello_bytes).await.expect("hello");
                    s
                })
            })
            .collect();
        for t in batch {
            tunnels.push(t.await.unwrap_or_else(|e| panic!("batch {chunk}: {e}")));
        }
    }
    let all_open = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with_tunnels = gw.rss_kib();
    served_within(&net, &gw, &basic(&good), Duration::from_secs(2)).await;
    eprintln!(
        "gateway RSS: {baseline} KiB at rest, {with_silent} KiB with 2,000 silent connections, {with_tunnels} KiB with 2,000 idle tunnels"
    );
    // The bounds over the resting size: 24 KiB per silent connection, 56 KiB per idle tunnel
    // (measured in this debug build: about 12 and 39; the release bench: 26 per tunnel).
    assert!(with_silent < baseline + 2000 * 24, "{with_silent} KiB");
    assert!(with_tunnels < baseline + 2000 * 56, "{with_tunnels} KiB");
    let closed = tunnels.into_iter().map(|mut s| {
        tokio::spawn(async move {
            let mut sink = [0_u8; 64];
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
        })
    });
    for c in closed.collect::<Vec<_>>() {
        c.await.expect("reader");
    }
    let took = all_open.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "idle tunnels closed after {took:?}"
    );
    wait_records(
        &gw,
        &["guest=run-load-3", "reason=idle_timeout"],
        2000,
        Duration::from_secs(10),
    )
    .await;
    log_is_clean(&gw, &[&good, &holder]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connect_flood_on_one_token_is_capped_and_other_guests_are_served() {
    let Some(net) = Net::setup() else { return };
    let net = Arc::new(net);
    let hub_ip = "10.214.0.0".parse().expect("ip");
    let gw = Gateway::start(&net, &["--max-connections-per-credential", "8"]);
    let flood = token("run-load-4", &["pkg.test"]);
    let good = token("run-load-4-good", &["pkg.test"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = gw.rss_kib();
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(tunnel(&net, &gw, "pkg.test:443", &basic(&flood)).await);
    }
    let before = snapshot(&net);
    let refused_count = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(3);
    let mut flooders = Vec::new();
    for _ in 0..50 {
        let (refused_count, other) = (Arc::clone(&refused_count), Arc::clone(&other));
        let auth = basic(&flood);
        let net = Arc::clone(&net);
        let gw_addr = gw.addr;
        flooders.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let mut s = net.connect_from_hub_as(hub_ip, gw_addr).await;
                let answer: Head = exchange(&mut s, &connect_head("pkg.test:443", &auth)).await;
                if answer.status == 429 && answer.headers[REASON_HEADER] == "connection_limit" {
                    refused_count.fetch_add(1, Ordering::Relaxed);
                } else {
                    other.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut worst = Duration::ZERO;
    let mut good_served = 0;
    while Instant::now() < stop {
        worst = worst.max(served_within(&net, &gw, &basic(&good), Duration::from_secs(2)).await);
        good_served += 1;
    }
    let peak = gw.rss_kib();
    for f in flooders {
        f.await.expect("flooder");
    }
    let refused_n = refused_count.load(Ordering::Relaxed);
    eprintln!(
        "flood: {refused_n} CONNECTs refused 429 in 3 s; the other guest served {good_served} times, the slowest in {worst:?}; RSS {baseline} -> {peak} KiB"
    );
    assert_eq!(
        other.load(Ordering::Relaxed),
        0,
        "a flooding CONNECT got through"
    );
    assert!(
        refused_n >= 200,
        "only {refused_n} flood CONNECTs were answered"
    );
    assert!(good_served >= 5, "{good_served}");
    assert!(peak < baseline + 32 * 1024, "{peak} KiB under the flood");
    // The flood reached no upstream: only the other guest's tunnels did.
    nothing_reached(&net, &before, &["11.0.0.1:443"]);
    assert_eq!(
        net.accepts("11.0.0.1:443")
            - before
                .get(&"11.0.0.1:443".parse().expect("addr"))
                .copied()
                .unwrap_or(0),
        good_served
    );
    drop(held);
    log_is_clean(&gw, &[&flood, &good]);
}
