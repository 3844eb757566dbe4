//! A private network for the gateway, made of Linux network namespaces (root, `ip`, `nft`):
//!
//! ```text
//!   guests (createos-fake --enforce-egress, one namespace each, firewall = egress rules)
//!      \
//!       hub (a router) ---- gw (the egress-gateway binary, 10.214.0.1; also 11.0.0.9, "its
//!                      \        public address", with listeners of its own on :80 and :443)
//!                       \--- inet (the test "internet": pkg.test 11.0.0.1, api.test 11.0.0.2,
//!                                  evil.test 11.0.0.66, a DNS server on 11.0.0.53, and
//!                                  10.99.0.1, 169.254.169.254 to prove refusals matter)
//! ```
//!
//! The "internet" serves HTTP on port 80 and HTTPS on 443 (a certificate for `pkg.test` and
//! `api.test`, signed by a CA made at start), and on 9444 a raw TCP sink that holds what
//! connects, from this test process: its listeners are bound inside `inet`. Every listener,
//! the gateway namespace's own included, counts the connections it accepts by the address they
//! were made to ([`Net::accepts`]), so a test proves that a refusal reached nothing. The gateway
//! resolves names through `--test-only-resolve` ([`Gateway::start`]) or through the system
//! resolver, whose `resolv.conf` in the gateway's namespace names the test DNS server
//! ([`Gateway::start_system_dns`], [`dns::Dns`]). Raw protocol checks connect from the hub
//! namespace.
#![allow(dead_code)]

pub mod dns;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader};
use std::net::{IpAddr, SocketAddr};
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

/// A public-looking address of the gateway's own namespace (as a gateway host's public IP):
/// listeners of the gateway's namespace answer on it.
pub const GW_PUBLIC_IP: &str = "11.0.0.9";

/// The test DNS server's address (in the "internet").
pub const DNS_IP: &str = "11.0.0.53";

/// An address in the "internet" that no test allowlist names: where a bypass would land.
pub const EVIL_IP: &str = "11.0.0.66";

/// The raw TCP sink's port in the "internet" (it holds every connection, reading and
/// discarding).
pub const SINK_PORT: u16 = 9444;

/// Accepted connections, by the address they were made to.
pub type Accepts = Arc<Mutex<BTreeMap<SocketAddr, u64>>>;

fn count(accepts: &Accepts, local: &std::io::Result<SocketAddr>) {
    if let Ok(addr) = local {
        let mut map = accepts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *map.entry(*addr).or_insert(0) += 1;
    }
}

/// The names the gateway resolves, and to what.
pub const NAMES: &[(&str, &str)] = &[
    ("pkg.test", "11.0.0.1"),
    ("api.test", "11.0.0.2"),
    ("loop.test", "127.0.0.1"),
    ("private.test", "10.99.0.1"),
    ("metadata.test", "169.254.169.254"),
    ("mixed.test", "10.99.0.1,11.0.0.1"),
    ("evil.test", "11.0.0.66"),
    ("self.test", "11.0.0.9"),
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
    /// The test DNS server (on [`DNS_IP`]), whose table a test fills.
    pub dns: dns::Dns,
    accepts: Accepts,
    /// `HOST PATH` of every request the "internet"'s HTTP and HTTPS servers answered.
    requests: Arc<Mutex<Vec<String>>>,
    /// `/etc/netns/GW`, holding the gateway namespace's `resolv.conf`.
    resolv_dir: PathBuf,
    _servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.resolv_dir);
    }
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
    requests: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let path = req.uri().path().to_owned();
    requests
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{host} {path}"));
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
    } else if path == "/framing" {
        let seen = |name: hyper::header::HeaderName| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("absent")
                .to_owned()
        };
        format!(
            "content-length: {}\ntransfer-encoding: {}\n",
            seen(hyper::header::CONTENT_LENGTH),
            seen(hyper::header::TRANSFER_ENCODING)
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
        // The `resolv.conf` directories of namespaces a killed run left (named by its pid).
        if let Ok(entries) = std::fs::read_dir("/etc/netns") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let pid = name
                    .strip_prefix("egw-test-")
                    .and_then(|rest| rest.split('-').next());
                if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
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
        for addr in [
            "11.0.0.1",
            "11.0.0.2",
            EVIL_IP,
            DNS_IP,
            "10.99.0.1",
            "169.254.169.254",
        ] {
            inet.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])
                .expect("inet address");
            hub.ip(&["route", "add", addr, "via", "10.215.0.1"])
                .expect("hub route");
        }
        // The gateway's own public-looking address, and a second source address in the hub
        // (another guest's, for tests that need two peers).
        gw.ip(&["addr", "add", &format!("{GW_PUBLIC_IP}/32"), "dev", "eth0"])
            .expect("gw public address");
        hub.ip(&["route", "add", GW_PUBLIC_IP, "via", "10.214.0.1"])
            .expect("hub route to the gateway's public address");
        hub.ip(&["addr", "add", "10.216.0.1/32", "dev", "lo"])
            .expect("hub second address");
        // The gateway's namespace resolves through the test DNS server (used by a gateway
        // started with the system resolver; `ip netns exec` mounts this file).
        let resolv_dir = PathBuf::from("/etc/netns").join(gw.name());
        std::fs::create_dir_all(&resolv_dir).expect("/etc/netns");
        std::fs::write(
            resolv_dir.join("resolv.conf"),
            format!("nameserver {DNS_IP}\noptions timeout:2 attempts:2\n"),
        )
        .expect("resolv.conf");

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
        let accepts: Accepts = Arc::default();
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut servers = Vec::new();
        for (port, tls) in [(80_u16, false), (443, true)] {
            let std = inet
                .bind_tcp(([0, 0, 0, 0], port).into())
                .expect("inet listener");
            let listener = tokio::net::TcpListener::from_std(std).expect("tokio listener");
            let (acceptor, wheel) = (acceptor.clone(), Arc::clone(&wheel));
            let (accepts, requests) = (Arc::clone(&accepts), Arc::clone(&requests));
            servers.push(tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    count(&accepts, &stream.local_addr());
                    let (acceptor, wheel) = (acceptor.clone(), Arc::clone(&wheel));
                    let requests = Arc::clone(&requests);
                    tokio::spawn(async move {
                        let scheme = if tls { "https" } else { "http" };
                        let service = hyper::service::service_fn(move |req| {
                            std::future::ready(Ok::<_, std::convert::Infallible>(answer(
                                &req, &wheel, scheme, &requests,
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
        // The sink: holds what connects, reading and discarding.
        let sink = inet
            .bind_tcp(([0, 0, 0, 0], SINK_PORT).into())
            .expect("sink listener");
        servers.push(hold(sink, &accepts));
        // Listeners of the gateway's own namespace (as services on the gateway's host would
        // be): what the gateway must never reach through its loopback or its own addresses.
        for addr in ["0.0.0.0:443", "0.0.0.0:80", "[::1]:443"] {
            match gw.bind_tcp(addr.parse().expect("addr")) {
                Ok(listener) => servers.push(hold(listener, &accepts)),
                Err(e) if addr.starts_with('[') => {
                    eprintln!("(no IPv6 loopback listener in the gateway's namespace: {e})");
                }
                Err(e) => panic!("gw listener {addr}: {e}"),
            }
        }
        let dns = dns::Dns::default();
        let udp = inet
            .enter(|| {
                let s = std::net::UdpSocket::bind((DNS_IP, 53))?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .expect("DNS socket");
        servers.push(dns.serve(udp));
        Some(Net {
            hub,
            gw,
            inet,
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            dns,
            accepts,
            requests,
            resolv_dir,
            _servers: servers,
        })
    }

    /// Connections accepted so far at `addr` (`IP:port`), by any listener of the network.
    pub fn accepts(&self, addr: &str) -> u64 {
        let addr: SocketAddr = addr.parse().expect("IP:port");
        self.accepts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&addr)
            .copied()
            .unwrap_or(0)
    }

    /// Every count of [`Net::accepts`] at once.
    pub fn all_accepts(&self) -> BTreeMap<SocketAddr, u64> {
        self.accepts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `HOST PATH` of every request the "internet"'s servers answered so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A TCP connection to `addr` from the hub namespace, from the source address `src`.
    pub async fn connect_from_hub_as(&self, src: IpAddr, addr: SocketAddr) -> TcpStream {
        let socket = self
            .hub
            .enter(|| {
                let s = tokio::net::TcpSocket::new_v4()?;
                s.bind(SocketAddr::new(src, 0))?;
                Ok(s)
            })
            .expect("socket in the hub");
        tokio::time::timeout(Duration::from_secs(5), socket.connect(addr))
            .await
            .expect("connect in time")
            .expect("connect from the hub")
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
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(self.roots())
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// The test CA as the only root.
    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).expect("CA root");
        roots
    }
}

/// Serves `listener` by holding every connection (reading and discarding until the peer
/// leaves), counting accepts in `accepts`.
fn hold(listener: std::net::TcpListener, accepts: &Accepts) -> tokio::task::JoinHandle<()> {
    let accepts = Arc::clone(accepts);
    tokio::spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        while let Ok((mut stream, _)) = listener.accept().await {
            count(&accepts, &stream.local_addr());
            tokio::spawn(async move {
                let mut sink = [0_u8; 4096];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    })
}

/// `program` found on `PATH` or in the usual directories.
pub fn find_program(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// This process's soft and hard limits on open files, from `/proc/self/limits`.
pub fn open_files_limits() -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut numbers = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    Some((numbers.next()?, numbers.next()?))
}

/// Makes sure this process (and the gateways it starts afterwards) may open `wanted` files,
/// raising its limits with util-linux's `prlimit` (root) when they are lower; `Some(why)` when
/// that cannot be done.
pub fn raise_open_files(wanted: u64) -> Option<String> {
    let Some((soft, _)) = open_files_limits() else {
        return Some("the open-files limit cannot be read (/proc/self/limits)".to_owned());
    };
    if soft >= wanted {
        return None;
    }
    let Some(prlimit) = find_program("prlimit") else {
        return Some(format!(
            "{wanted} open files needed, the limit is {soft} and `prlimit` is not installed"
        ));
    };
    let _ = std::process::Command::new(prlimit)
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--nofile={wanted}:{wanted}"),
        ])
        .status();
    match open_files_limits() {
        Some((soft, _)) if soft >= wanted => None,
        other => Some(format!(
            "{wanted} open files needed, the limit stays {other:?}"
        )),
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

    /// Starts this crate's `egress-gateway` binary with the system resolver (no
    /// `--test-only-resolve`): names are looked up with `getaddrinfo`, which asks the test DNS
    /// server ([`Net::dns`]), and `extra` options.
    pub fn start_system_dns(net: &Net, extra: &[&str]) -> Gateway {
        Gateway::spawn(net, &[gateway_bin().into_os_string()], extra, false, false)
    }

    /// Starts `program` (a command line whose options are the gateway's, e.g. the wheel's
    /// `python -m langflow_sandbox_createos gateway`) with the test resolver and `extra`
    /// options. With `echo`, every line it logs is also written to this process's stderr.
    pub fn start_command(net: &Net, program: &[OsString], extra: &[&str], echo: bool) -> Gateway {
        Gateway::spawn(net, program, extra, echo, true)
    }

    fn spawn(
        net: &Net,
        program: &[OsString],
        extra: &[&str],
        echo: bool,
        test_resolver: bool,
    ) -> Gateway {
        let (bin, args) = program.split_first().expect("a gateway command");
        let mut cmd = net.gw.command(bin).expect("gateway command");
        cmd.args(args);
        cmd.args(["--listen", &format!("{GW_IP}:0")]);
        if test_resolver {
            for (name, ips) in NAMES {
                cmd.args(["--test-only-resolve", &format!("{name}={ips}")]);
            }
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
            // Bytes, not `lines()`: a byte that is not UTF-8 must not end the capture (it shows
            // as U+FFFD, which the adversarial tests look for).
            let mut reader = BufReader::new(stderr);
            let mut raw = Vec::new();
            while matches!(reader.read_until(b'\n', &mut raw), Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&raw);
                let line = text.strip_suffix('\n').unwrap_or(&text);
                let mut log = sink
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                log.push_str(line);
                log.push('\n');
                if echo {
                    eprintln!("{line}");
                }
                drop(log);
                raw.clear();
            }
        });
        Gateway { child, addr, log }
    }

    /// The gateway's process id (`ip netns exec` execs it in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The gateway's resident memory (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
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
