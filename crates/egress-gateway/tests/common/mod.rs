//! A private network for the gateway, made of Linux network namespaces (root, `ip`, `nft`):
//!
//! ```text
//!   guests (createos-fake --enforce-egress, one namespace each, firewall = egress rules)
//!      \
//!       hub (a router) ---- gw (the egress-gateway binary, 10.214.0.1)
//!                      \--- inet (the test "internet": pkg.test 11.0.0.1, api.test 11.0.0.2,
//!                                 and 10.99.0.1, 169.254.169.254 to prove refusals matter)
//! ```
//!
//! The "internet" serves HTTP on port 80 and HTTPS on 443 (a certificate for `pkg.test` and
//! `api.test`, signed by a CA made at start) from this test process: its listeners are bound
//! inside `inet`. The gateway resolves names only through `--test-only-resolve`. Raw protocol
//! checks connect from the hub namespace.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use createos_fake::netns::{self, Netns};
use createos_fake::{FakeOptions, FakeServer};
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The secret the tests' gateways run with.
pub const SECRET: &[u8] = b"egress-gateway-test-secret-0123456789abcdef";

/// Where the gateway listens.
pub const GW_IP: &str = "10.214.0.1";

/// The names the gateway resolves, and to what.
pub const NAMES: &[(&str, &str)] = &[
    ("pkg.test", "11.0.0.1"),
    ("api.test", "11.0.0.2"),
    ("loop.test", "127.0.0.1"),
    ("private.test", "10.99.0.1"),
    ("metadata.test", "169.254.169.254"),
    ("mixed.test", "10.99.0.1,11.0.0.1"),
];

/// Whether `python3 -m pip` works on this machine (the guests' Python is the host's).
pub fn python_has_pip() -> bool {
    std::process::Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `Some(reason)` when this machine cannot build the network.
pub fn unsupported() -> Option<String> {
    netns::support().err()
}

/// The namespaces, the test "internet" and its CA.
pub struct Net {
    pub hub: Netns,
    pub gw: Netns,
    pub inet: Netns,
    /// The CA that signed the servers' certificate, PEM.
    pub ca_pem: String,
    ca_der: CertificateDer<'static>,
    _servers: Vec<tokio::task::JoinHandle<()>>,
}

/// A small wheel the index serves: `tinypkg` 0.1 (a valid zip with its metadata).
pub fn tiny_wheel() -> Vec<u8> {
    let script = r#"
import io, sys, zipfile
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    z.writestr("tinypkg/__init__.py", "VALUE = 42\n")
    z.writestr("tinypkg-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n")
    z.writestr("tinypkg-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("tinypkg-0.1.dist-info/RECORD", "")
sys.stdout.buffer.write(buf.getvalue())
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .expect("python3 builds the test wheel");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    sha2::Sha256::digest(data)
        .iter()
        .fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

/// What the test "internet" answers, by path.
fn answer(
    req: &Request<hyper::body::Incoming>,
    wheel: &[u8],
    scheme: &'static str,
) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let path = req.uri().path().to_owned();
    let body: Vec<u8> = if path == "/hello" {
        format!("hello from {host} over {scheme}").into_bytes()
    } else if path == "/headers" {
        let seen = |name: &str| {
            if req.headers().contains_key(name) {
                "present"
            } else {
                "absent"
            }
        };
        format!(
            "host: {host}\nproxy-authorization: {}\nproxy-connection: {}\n",
            seen("proxy-authorization"),
            seen("proxy-connection")
        )
        .into_bytes()
    } else if path == "/simple/" {
        b"<html><body><a href=\"tinypkg/\">tinypkg</a></body></html>".to_vec()
    } else if path == "/simple/tinypkg/" {
        format!(
            "<html><body><a href=\"../../files/tinypkg-0.1-py3-none-any.whl#sha256={}\">tinypkg-0.1-py3-none-any.whl</a></body></html>",
            sha256_hex(wheel)
        )
        .into_bytes()
    } else if path == "/files/tinypkg-0.1-py3-none-any.whl" {
        wheel.to_vec()
    } else if let Some(n) = path.strip_prefix("/big/") {
        vec![b'x'; n.parse().unwrap_or(0)]
    } else {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"not found")));
        *resp.status_mut() = hyper::StatusCode::NOT_FOUND;
        return resp;
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    if path.starts_with("/simple/") {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/html"),
        );
    }
    resp
}

impl Net {
    /// Builds the namespaces and starts the servers. `None` (after saying why) when this
    /// machine cannot.
    pub fn setup() -> Option<Net> {
        if let Some(why) = unsupported() {
            eprintln!("skipped: network namespaces are not available here: {why}");
            return None;
        }
        netns::remove_stale("egw-test");
        let hub = Netns::create("egw-test").expect("hub");
        let gw = Netns::create("egw-test").expect("gw");
        let inet = Netns::create("egw-test").expect("inet");
        hub.enable_forwarding().expect("forwarding");
        hub.link("to-gw", "10.214.0.0/31", &gw, "eth0", "10.214.0.1/31")
            .expect("hub-gw link");
        hub.link("to-inet", "10.215.0.0/31", &inet, "eth0", "10.215.0.1/31")
            .expect("hub-inet link");
        gw.ip(&["route", "add", "default", "via", "10.214.0.0"])
            .expect("gw route");
        inet.ip(&["route", "add", "default", "via", "10.215.0.0"])
            .expect("inet route");
        for addr in ["11.0.0.1", "11.0.0.2", "10.99.0.1", "169.254.169.254"] {
            inet.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])
                .expect("inet address");
            hub.ip(&["route", "add", addr, "via", "10.215.0.1"])
                .expect("hub route");
        }

        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "egress-gateway test CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA cert");
        let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
        let leaf = rcgen::CertificateParams::new(vec!["pkg.test".into(), "api.test".into()])
            .expect("leaf params")
            .signed_by(&leaf_key, &ca)
            .expect("leaf cert");
        let server_config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone(), ca.der().clone()],
                PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));

        let wheel = Arc::new(tiny_wheel());
        let mut servers = Vec::new();
        for (port, tls) in [(80_u16, false), (443, true)] {
            let std = inet
                .bind_tcp(([0, 0, 0, 0], port).into())
                .expect("inet listener");
            let listener = tokio::net::TcpListener::from_std(std).expect("tokio listener");
            let (acceptor, wheel) = (acceptor.clone(), Arc::clone(&wheel));
            servers.push(tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (acceptor, wheel) = (acceptor.clone(), Arc::clone(&wheel));
                    tokio::spawn(async move {
                        let scheme = if tls { "https" } else { "http" };
                        let service = hyper::service::service_fn(move |req| {
                            std::future::ready(Ok::<_, std::convert::Infallible>(answer(
                                &req, &wheel, scheme,
                            )))
                        });
                        let builder = hyper::server::conn::http1::Builder::new();
                        if tls {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                            }
                        } else {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    });
                }
            }));
        }
        Some(Net {
            hub,
            gw,
            inet,
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            _servers: servers,
        })
    }

    /// A TCP connection to `addr` from the hub namespace.
    pub fn connect_from_hub(&self, addr: SocketAddr) -> TcpStream {
        let std = self
            .hub
            .enter(|| {
                let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .expect("connect from the hub");
        TcpStream::from_std(std).expect("tokio stream")
    }

    /// A TLS client that trusts the test CA only.
    pub fn tls(&self) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).expect("CA root");
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// This crate's `egress-gateway` binary: Cargo's path in tests, else (an example) the one of
/// the same profile, `target/<profile>/egress-gateway` next to the `examples` directory.
pub fn gateway_bin() -> PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_egress-gateway") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(std::path::Path::parent)
        .unwrap_or(std::path::Path::new("."))
        .join("egress-gateway")
}

/// A running gateway inside the `gw` namespace; killed when dropped.
pub struct Gateway {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Gateway {
    /// Starts this crate's `egress-gateway` binary ([`gateway_bin`]) with the test resolver and
    /// `extra` options.
    pub fn start(net: &Net, extra: &[&str]) -> Gateway {
        Gateway::start_command(net, &[gateway_bin().into_os_string()], extra, false)
    }

    /// Starts `program` (a command line whose options are the gateway's, e.g. the wheel's
    /// `python -m langflow_sandbox_createos gateway`) with the test resolver and `extra`
    /// options. With `echo`, every line it logs is also written to this process's stderr.
    pub fn start_command(net: &Net, program: &[OsString], extra: &[&str], echo: bool) -> Gateway {
        let (bin, args) = program.split_first().expect("a gateway command");
        let mut cmd = net.gw.command(bin).expect("gateway command");
        cmd.args(args);
        cmd.args(["--listen", &format!("{GW_IP}:0")]);
        for (name, ips) in NAMES {
            cmd.args(["--test-only-resolve", &format!("{name}={ips}")]);
        }
        let mut child = cmd
            .args(extra)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "CREATEOS_GATEWAY_SECRET",
                std::str::from_utf8(SECRET).expect("ascii"),
            )
            .env("CREATEOS_GATEWAY_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the gateway");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("first line");
        let addr: SocketAddr = first
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                log.push_str(&line);
                log.push('\n');
                if echo {
                    eprintln!("{line}");
                }
            }
        });
        Gateway { child, addr, log }
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The connection records logged so far.
    pub fn records(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("egress_gateway::connection"))
            .map(str::to_owned)
            .collect()
    }

    /// Waits (bounded) for a connection record holding every one of `fields`
    /// (`key=value` as the log writes them).
    pub async fn wait_record(&self, fields: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(r) = self
                .records()
                .into_iter()
                .find(|r| fields.iter().all(|f| r.split(' ').any(|w| w == *f)))
            {
                return r;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no record with {fields:?} in:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A token for `allow`, valid for five minutes.
pub fn token(guest: &str, allow: &[&str]) -> String {
    let secret = egress_gateway::Secret::new(SECRET.to_vec()).expect("secret");
    egress_gateway::mint(&secret, guest, allow, Duration::from_secs(300)).expect("mint")
}

/// The `Proxy-Authorization` value for `token`, as curl and Python send it.
pub fn basic(token: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("run:{token}"))
    )
}

/// A proxy response head: status, headers (lowercased names) and the bytes of body read with
/// it.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub rest: Vec<u8>,
}

/// Sends a request head and reads the response head (bounded).
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, head: &str) -> Head {
    stream.write_all(head.as_bytes()).await.expect("send head");
    let mut buf = Vec::new();
    let mut chunk = [0_u8; 4096];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = tokio::time::timeout(Duration::from_secs(15), stream.read(&mut chunk))
            .await
            .expect("response in time")
            .expect("read response");
        assert!(n > 0, "closed before a response head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
        assert!(buf.len() < 64 * 1024, "endless head");
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Head {
        status,
        headers,
        rest: buf[end + 4..].to_vec(),
    }
}

/// `CONNECT target` through the gateway from the hub, with `auth` as `Proxy-Authorization`.
pub async fn connect(
    net: &Net,
    gw: &Gateway,
    target: &str,
    auth: Option<&str>,
) -> (Head, TcpStream) {
    let mut stream = net.connect_from_hub(gw.addr);
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(a) = auth {
        head = format!("{head}Proxy-Authorization: {a}\r\n");
    }
    head.push_str("\r\n");
    let got = exchange(&mut stream, &head).await;
    (got, stream)
}

/// Reads until EOF or error (bounded), returning what arrived.
pub async fn read_all<S: AsyncRead + Unpin>(stream: &mut S) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out)).await;
    out
}

/// `GET path` over an established (TLS or plain) stream to `host`; returns the raw answer.
pub async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    path: &str,
) -> Vec<u8> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .expect("send request");
    read_all(stream).await
}

/// The body of a raw HTTP/1.1 answer, as text.
pub fn body_text(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    text.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned())
}

/// A server name for a TLS client.
pub fn name(host: &str) -> ServerName<'static> {
    ServerName::try_from(host.to_owned()).expect("server name")
}

/// The fake control plane in its enforcing mode, guests linked to the hub.
pub struct Guests {
    pub fake: FakeServer,
    http: reqwest::Client,
}

impl Guests {
    /// The enforcing fake; guests run the machine's `python3`.
    pub async fn start(net: &Net) -> Guests {
        Guests::start_with(net, Vec::new()).await
    }

    /// The enforcing fake with `guest_path` first on its guests' `PATH` (whose `python3` they
    /// run).
    pub async fn start_with(net: &Net, guest_path: Vec<PathBuf>) -> Guests {
        let fake = FakeServer::start(FakeOptions {
            enforce_egress: true,
            egress_uplink_netns: Some(net.hub.name().to_owned()),
            guest_path,
            destroy_delay: Duration::from_millis(10),
            ..FakeOptions::default()
        })
        .await
        .expect("enforcing fake");
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        Guests { fake, http }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.fake.url())
    }

    async fn call(&self, rb: reqwest::RequestBuilder) -> Value {
        let resp = rb
            .header("X-Api-Key", self.fake.api_key())
            .send()
            .await
            .expect("fake request");
        let v: Value = resp.json().await.expect("fake JSON");
        assert_eq!(v["status"], "success", "{v}");
        v["data"].clone()
    }

    /// A guest with these egress rules and environment, holding the test CA at
    /// `/workspace/ca.pem`.
    pub async fn create(&self, net: &Net, egress: &[String], envs: &[(&str, &str)]) -> String {
        let envs: BTreeMap<&str, &str> = envs.iter().copied().collect();
        let body = json!({"shape": "s-1vcpu-256mb", "egress": egress, "envs": envs});
        let made = self
            .call(self.http.post(self.url("/v1/sandboxes")).json(&body))
            .await;
        let id = made["id"].as_str().expect("id").to_owned();
        self.call(
            self.http
                .put(self.url(&format!("/v1/sandboxes/{id}/files")))
                .query(&[("path", "/workspace/ca.pem")])
                .body(net.ca_pem.clone()),
        )
        .await;
        id
    }

    /// Runs a command in a guest; returns `(exit code, stdout, stderr)`.
    pub async fn exec(&self, id: &str, cmd: &str, args: &[&str]) -> (i64, String, String) {
        let body = json!({"cmd": cmd, "args": args});
        let data = self
            .call(
                self.http
                    .post(self.url(&format!("/v1/sandboxes/{id}/exec")))
                    .json(&body),
            )
            .await;
        let r = &data["result"];
        (
            r["exit_code"].as_i64().unwrap_or(-1),
            r["stdout"].as_str().unwrap_or_default().to_owned(),
            r["stderr"].as_str().unwrap_or_default().to_owned(),
        )
    }
}
