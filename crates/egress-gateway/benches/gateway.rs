//! The egress gateway's figures in `BENCHMARKS.md`: added latency per connection, throughput
//! through one `CONNECT` tunnel, memory per idle tunnel, connections per second, and a
//! well-behaved client's served rate and the gateway's memory under attack (slowloris, a
//! `CONNECT` flood).
//!
//! ```sh
//! cargo bench -p egress-gateway --bench gateway     # as root (a network namespace)
//! cargo bench -p egress-gateway --bench gateway -- memory cps   # only these parts
//! ```
//!
//! Parts: `latency`, `throughput`, `memory`, `cps`, `attack`; all of them when none is named.
//!
//! The gateway never connects to loopback nor to its own host's addresses, so "loopback" here is
//! two network namespaces joined by a veth pair: one whose `lo` carries the public-looking
//! address 11.0.0.1, where the servers and the clients run (the bench re-runs itself inside
//! it), and one for the released `egress-gateway` binary (the one the wheel runs), listening on
//! 10.1.0.1; all on this machine's cores. Upstream servers:
//! 11.0.0.1:443 is HTTPS (rustls, `GET /hello`); :9443 reads the `ClientHello` and then streams
//! zeros until the client leaves; :9444 reads the `ClientHello` and holds the connection.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, ServerName};

const SECRET: &str = "egress-gateway-bench-secret-0123456789abcdef";
const INSIDE: &str = "EGW_BENCH_INSIDE";
/// The gateway's namespace, named to the process that runs inside the clients' one.
const GATEWAY_NS: &str = "EGW_BENCH_GATEWAY_NS";
/// Where the gateway listens, in its namespace.
const GATEWAY_IP: &str = "10.1.0.1";
const UPSTREAM: &str = "11.0.0.1";

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "the gateway benchmark runs with `cargo bench -p egress-gateway --bench gateway`"
        );
        return;
    }
    if std::env::var_os(INSIDE).is_some() {
        inside();
        return;
    }
    if let Err(why) = createos_fake::netns::support() {
        eprintln!("skipped: the gateway benchmark needs a network namespace: {why}");
        return;
    }
    let ns = createos_fake::netns::Netns::create("egw-bench").expect("namespace");
    ns.ip(&["addr", "add", &format!("{UPSTREAM}/32"), "dev", "lo"])
        .expect("address");
    let gw_ns = createos_fake::netns::Netns::create("egw-bench").expect("gateway namespace");
    ns.link(
        "to-gw",
        "10.1.0.0/31",
        &gw_ns,
        "eth0",
        &format!("{GATEWAY_IP}/31"),
    )
    .expect("link");
    gw_ns
        .ip(&["route", "add", "default", "via", "10.1.0.0"])
        .expect("gateway route");
    let status = ns
        .command(std::env::current_exe().expect("own path"))
        .expect("command")
        .args(std::env::args_os().skip(1))
        .env(INSIDE, "1")
        .env(GATEWAY_NS, gw_ns.name())
        .status()
        .expect("run inside the namespace");
    assert!(status.success(), "the benchmark failed");
}

fn inside() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

/// A running gateway binary and its process id.
struct Gateway {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Gateway {
    /// A gateway whose limits stay out of the way of the measures.
    fn start() -> Gateway {
        Gateway::start_with(&[
            "--max-connections",
            "100000",
            "--max-connections-per-credential",
            "100000",
            "--max-bytes-per-credential",
            "1T",
        ])
    }

    /// A gateway with the shipped defaults and `extra` options (the resolver aside).
    fn start_with(extra: &[&str]) -> Gateway {
        // `ip netns exec` runs the gateway in place (same pid) in its namespace.
        let ns = std::env::var(GATEWAY_NS).expect("the gateway's namespace");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_egress-gateway")])
            .args([
                "--listen",
                &format!("{GATEWAY_IP}:0"),
                "--test-only-resolve",
                &format!("bench.test={UPSTREAM}"),
            ])
            .args(extra)
            .env("CREATEOS_GATEWAY_SECRET", SECRET)
            .env("CREATEOS_GATEWAY_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("gateway");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("first line");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .expect("listening line");
        Gateway { child, addr }
    }

    /// CPU time the gateway process has used (user + system), in seconds. `/proc` counts it in
    /// `USER_HZ` ticks, 100 per second on Linux.
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("stat");
        let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<&str> = after_name.split(' ').collect();
        let ticks: u64 =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        #[allow(clippy::cast_precision_loss)]
        let secs = ticks as f64 / 100.0;
        secs
    }

    /// Resident memory of the gateway process, in KiB.
    fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The most resident memory the gateway process has had, in KiB.
    fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("a memory figure")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn auth() -> String {
    auth_for("bench")
}

/// The `Proxy-Authorization` value of a token for `guest`.
fn auth_for(guest: &str) -> String {
    let secret = egress_gateway::Secret::new(SECRET.as_bytes().to_vec()).expect("secret");
    let token = egress_gateway::mint(
        &secret,
        guest,
        &["bench.test", "bench.test:9443", "bench.test:9444"],
        Duration::from_secs(3600),
    )
    .expect("token");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("run:{token}"))
    )
}

/// A real `ClientHello` for `bench.test`, from rustls.
fn client_hello() -> Vec<u8> {
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut conn = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("bench.test").expect("name"),
    )
    .expect("client");
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).expect("hello");
    hello
}

/// Reads one TLS record (the `ClientHello`) from a raw stream.
async fn skip_hello(s: &mut TcpStream) -> std::io::Result<()> {
    let mut header = [0_u8; 5];
    s.read_exact(&mut header).await?;
    let mut body = vec![0; usize::from(u16::from_be_bytes([header[3], header[4]]))];
    s.read_exact(&mut body).await?;
    Ok(())
}

async fn servers() -> (rustls::RootCertStore, Vec<tokio::task::JoinHandle<()>>) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA");
    let key = rcgen::KeyPair::generate().expect("key");
    let leaf = rcgen::CertificateParams::new(vec!["bench.test".into()])
        .expect("leaf")
        .signed_by(&key, &ca)
        .expect("leaf");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).expect("root");

    let https = TcpListener::bind((UPSTREAM, 443)).await.expect("443");
    let stream = TcpListener::bind((UPSTREAM, 9443)).await.expect("9443");
    let hold = TcpListener::bind((UPSTREAM, 9444)).await.expect("9444");
    let mut tasks = vec![tokio::spawn(async move {
        while let Ok((s, _)) = https.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = [0_u8; 1024];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    })];
    tasks.push(tokio::spawn(async move {
        while let Ok((mut s, _)) = stream.accept().await {
            tokio::spawn(async move {
                if skip_hello(&mut s).await.is_err() {
                    return;
                }
                let zeros = vec![0_u8; 256 * 1024];
                while s.write_all(&zeros).await.is_ok() {}
            });
        }
    }));
    tasks.push(tokio::spawn(async move {
        while let Ok((mut s, _)) = hold.accept().await {
            tokio::spawn(async move {
                let _ = skip_hello(&mut s).await;
                let mut sink = [0_u8; 64];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    }));
    (roots, tasks)
}

/// Opens a tunnel to `target` through the gateway; returns the stream after the `200`.
async fn tunnel(gw: SocketAddr, target: &str, auth: &str) -> TcpStream {
    let mut s = TcpStream::connect(gw).await.expect("connect gateway");
    s.set_nodelay(true).expect("nodelay");
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.expect("CONNECT");
    let mut got = Vec::new();
    let mut byte = [0_u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.expect("read head");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.push(byte[0]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s
}

/// One HTTPS `GET /hello` over `s`.
async fn https_hello(tls: &tokio_rustls::TlsConnector, s: TcpStream) {
    let mut conn = tls
        .connect(ServerName::try_from("bench.test").expect("name"), s)
        .await
        .expect("TLS");
    conn.write_all(b"GET /hello HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out).await;
    assert!(out.ends_with(b"hello"), "{}", String::from_utf8_lossy(&out));
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at].as_secs_f64() * 1e3
}

fn summary(name: &str, mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    let median = percentile(&samples, 0.5);
    println!(
        "{name:<34} median {median:7.3} ms  p90 {:7.3} ms  p99 {:7.3} ms  (n={})",
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
        samples.len()
    );
    median
}

async fn run() {
    let named: Vec<String> = std::env::args()
        .filter(|a| ["latency", "throughput", "memory", "cps", "attack"].contains(&a.as_str()))
        .collect();
    let part = |name: &str| named.is_empty() || named.iter().any(|n| n == name);
    let (roots, _servers) = servers().await;
    let gw = Gateway::start();
    let auth = auth();
    let hello = client_hello();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ));
    let upstream: SocketAddr = format!("{UPSTREAM}:443").parse().expect("addr");
    println!(
        "egress-gateway benchmark ({} cores)",
        std::thread::available_parallelism().map_or(0, usize::from)
    );

    if part("latency") {
        latency(&gw, &tls, &auth, upstream).await;
    }
    if part("throughput") {
        throughput(&gw, &auth, &hello).await;
    }
    if part("memory") {
        memory(&gw, &auth, &hello).await;
    }
    if part("cps") {
        connections_per_second(&gw, &auth, &hello).await;
    }
    drop(gw);
    if part("attack") {
        under_attack(&tls, &hello).await;
    }
}

/// A whole HTTPS request on a new connection, direct and through the gateway, interleaved so
/// both see the same machine; and the `CONNECT` round trip alone against a TCP connect.
async fn latency(gw: &Gateway, tls: &tokio_rustls::TlsConnector, auth: &str, upstream: SocketAddr) {
    let rounds = 300;
    let (mut direct, mut proxied, mut connect_only, mut tcp_only) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..20 {
        https_hello(tls, TcpStream::connect(upstream).await.expect("direct")).await;
        https_hello(tls, tunnel(gw.addr, "bench.test:443", auth).await).await;
    }
    for _ in 0..rounds {
        let t = Instant::now();
        https_hello(tls, TcpStream::connect(upstream).await.expect("direct")).await;
        direct.push(t.elapsed());
        let t = Instant::now();
        https_hello(tls, tunnel(gw.addr, "bench.test:443", auth).await).await;
        proxied.push(t.elapsed());
        let t = Instant::now();
        let s = TcpStream::connect(upstream).await.expect("direct");
        tcp_only.push(t.elapsed());
        drop(s);
        let t = Instant::now();
        let s = tunnel(gw.addr, "bench.test:443", auth).await;
        connect_only.push(t.elapsed());
        drop(s);
    }
    println!("\nper connection ({rounds} each, sequential):");
    let https_direct = summary("HTTPS GET, direct", direct);
    let https_proxied = summary("HTTPS GET, through the gateway", proxied);
    let tcp = summary("TCP connect, direct", tcp_only);
    let until_200 = summary("CONNECT until 200, via gateway", connect_only);
    println!(
        "added by the gateway: {:.3} ms per HTTPS request (medians); CONNECT until 200 takes {until_200:.3} ms where a TCP connect takes {tcp:.3} ms",
        https_proxied - https_direct
    );
}

/// One tunnel, 4 GiB of payload after the `ClientHello`; and the same direct.
#[allow(clippy::cast_precision_loss)]
async fn throughput(gw: &Gateway, auth: &str, hello: &[u8]) {
    let total: u64 = 4 << 30;
    let mut buf = vec![0_u8; 256 * 1024];
    println!("\nthroughput, one connection, {} GiB:", total >> 30);
    for via in ["direct", "through the gateway"] {
        let mut s = if via == "direct" {
            TcpStream::connect(format!("{UPSTREAM}:9443"))
                .await
                .expect("direct")
        } else {
            tunnel(gw.addr, "bench.test:9443", auth).await
        };
        s.write_all(hello).await.expect("hello");
        let t = Instant::now();
        let mut got = 0_u64;
        while got < total {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed after {got} bytes");
            got += n as u64;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {via:<22} {:8.0} MiB/s",
            got as f64 / secs / f64::from(1 << 20)
        );
    }
}

/// Idle tunnels (`ClientHello` passed, upstream connected, nothing moving): the gateway's RSS
/// before and after.
#[allow(clippy::cast_precision_loss)]
async fn memory(gw: &Gateway, auth: &str, hello: &[u8]) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = gw.rss_kib();
    let idle = 2000;
    let mut held = Vec::with_capacity(idle);
    for _ in 0..idle {
        let mut s = tunnel(gw.addr, "bench.test:9444", auth).await;
        s.write_all(hello).await.expect("hello");
        held.push(s);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = gw.rss_kib();
    println!(
        "\nmemory: {idle} idle tunnels: RSS {before} KiB -> {after} KiB, {:.1} KiB per idle tunnel",
        (after.saturating_sub(before)) as f64 / idle as f64
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// 64 clients, each opening a tunnel, sending the `ClientHello` and closing, for 5 s. Clients,
/// servers and gateway share this machine's cores.
#[allow(clippy::cast_precision_loss)]
async fn connections_per_second(gw: &Gateway, auth: &str, hello: &[u8]) {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(5);
    let mut clients = Vec::new();
    for _ in 0..64 {
        let (done, auth, hello) = (Arc::clone(&done), auth.to_owned(), hello.to_vec());
        let gw_addr = gw.addr;
        clients.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let mut s = tunnel(gw_addr, "bench.test:9444", &auth).await;
                s.write_all(&hello).await.expect("hello");
                drop(s);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let (t, cpu) = (Instant::now(), gw.cpu_seconds());
    for c in clients {
        c.await.expect("client");
    }
    let n = done.load(Ordering::Relaxed) as f64;
    let (wall, gw_cpu) = (t.elapsed().as_secs_f64(), gw.cpu_seconds() - cpu);
    println!(
        "\nconnections per second (64 concurrent clients, 5 s, each: CONNECT + token check + upstream connect + ClientHello check): {:.0}/s; the gateway used {:.2} of the 2 cores, {:.0} connections per gateway CPU-second",
        n / wall,
        gw_cpu / wall,
        n / gw_cpu
    );
}

/// What attacks the gateway while a well-behaved client is measured.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// Nothing: the reference.
    None,
    /// This many connections sending a request head one byte a second, re-opened when closed.
    Slowloris(usize),
    /// One token holds its 64 tunnels and 64 clients `CONNECT` again as fast as they can.
    ConnectFlood,
}

/// The well-behaved client's served rate and the gateway's memory under each attack, each on a
/// fresh gateway with the shipped defaults (4,096 connections at once, 64 per token, 10 s to
/// send a request head, 60 s idle).
#[allow(clippy::cast_precision_loss)]
async fn under_attack(tls: &tokio_rustls::TlsConnector, hello: &[u8]) {
    println!(
        "\nunder attack (gateway defaults; a well-behaved client: 8 concurrent loops of CONNECT + TLS + GET /hello, 5 s):"
    );
    for attack in [
        Attack::None,
        Attack::Slowloris(2000),
        Attack::Slowloris(6000),
        Attack::ConnectFlood,
    ] {
        let gw = Gateway::start_with(&[]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rest = gw.rss_kib();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let attacked = Arc::new(AtomicU64::new(0));
        // The attacker runs on a thread and runtime of its own (at most one core), as traffic
        // from elsewhere would: not in the well-behaved client's runtime.
        let attack_thread = {
            let (stop, attacked, hello, addr) = (
                Arc::clone(&stop),
                Arc::clone(&attacked),
                hello.to_vec(),
                gw.addr,
            );
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("attacker runtime")
                    .block_on(attack_until_stopped(attack, addr, hello, stop, attacked));
            })
        };
        // Let the attack build up (a slowloris connection lives up to the 10 s head timeout).
        tokio::time::sleep(Duration::from_secs(match attack {
            Attack::None => 0,
            _ => 3,
        }))
        .await;
        let attacked_before = attacked.load(Ordering::Relaxed);
        let cpu_before = gw.cpu_seconds();
        let (served, failed, worst, secs) = well_behaved(gw.addr, tls, &auth_for("good")).await;
        let gw_cores = (gw.cpu_seconds() - cpu_before) / secs;
        let attacked_n = attacked.load(Ordering::Relaxed) - attacked_before;
        let (rss, peak) = (gw.rss_kib(), gw.peak_rss_kib());
        stop.store(true, Ordering::Relaxed);
        attack_thread.join().expect("attacker");
        let what = match attack {
            Attack::None => "no attack".to_owned(),
            Attack::Slowloris(n) => format!("slowloris, {n} connections ({attacked_n} re-opened)"),
            Attack::ConnectFlood => {
                format!(
                    "CONNECT flood ({:.0} refused 429/s)",
                    attacked_n as f64 / secs
                )
            }
        };
        println!(
            "  {what:<44} served {:6.0}/s ({failed} failed, slowest {:.1} ms); gateway RSS {rest} KiB at rest, {rss} KiB under attack, peak {peak} KiB; gateway CPU {gw_cores:.2} of the 2 cores",
            served as f64 / secs,
            worst.as_secs_f64() * 1e3
        );
        drop(gw);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs `attack` against the gateway at `gw` until `stop`, counting in `attacked`.
async fn attack_until_stopped(
    attack: Attack,
    gw: SocketAddr,
    hello: Vec<u8>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    attacked: Arc<AtomicU64>,
) {
    let mut attackers = Vec::new();
    let mut held = Vec::new();
    match attack {
        Attack::None => {}
        Attack::Slowloris(n) => {
            for _ in 0..n {
                attackers.push(tokio::spawn(slowloris(
                    gw,
                    Arc::clone(&stop),
                    Arc::clone(&attacked),
                )));
            }
        }
        Attack::ConnectFlood => {
            let flood = auth_for("flood");
            for _ in 0..64 {
                let mut s = tunnel(gw, "bench.test:9444", &flood).await;
                s.write_all(&hello).await.expect("hello");
                held.push(s);
            }
            for _ in 0..64 {
                attackers.push(tokio::spawn(connect_flood(
                    gw,
                    flood.clone(),
                    Arc::clone(&stop),
                    Arc::clone(&attacked),
                )));
            }
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for a in attackers {
        a.abort();
    }
}

/// Eight loops of a whole HTTPS request through a new tunnel, for 5 s: served, failed (an
/// error or over 10 s), the slowest, and the seconds measured.
#[allow(clippy::cast_precision_loss)]
async fn well_behaved(
    gw: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
    auth: &str,
) -> (u64, u64, Duration, f64) {
    let served = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let start = Instant::now();
    let stop = start + Duration::from_secs(5);
    let mut loops = Vec::new();
    for _ in 0..8 {
        let (served, failed, worst) =
            (Arc::clone(&served), Arc::clone(&failed), Arc::clone(&worst));
        let (tls, auth) = (tls.clone(), auth.to_owned());
        loops.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let t = Instant::now();
                let one = async {
                    let s = try_tunnel(gw, "bench.test:443", &auth).await?;
                    let mut conn = tls
                        .connect(ServerName::try_from("bench.test").expect("name"), s)
                        .await?;
                    conn.write_all(
                        b"GET /hello HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n\r\n",
                    )
                    .await?;
                    let mut out = Vec::new();
                    let _ = conn.read_to_end(&mut out).await;
                    if out.ends_with(b"hello") {
                        Ok(())
                    } else {
                        Err(std::io::Error::other("no answer"))
                    }
                };
                match tokio::time::timeout(Duration::from_secs(10), one).await {
                    Ok(Ok(())) => {
                        served.fetch_add(1, Ordering::Relaxed);
                        let took = t.elapsed();
                        let mut w = worst.lock().expect("lock");
                        *w = (*w).max(took);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for l in loops {
        l.await.expect("client loop");
    }
    let secs = start.elapsed().as_secs_f64();
    let worst = *worst.lock().expect("lock");
    (
        served.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        worst,
        secs,
    )
}

/// `CONNECT` to `target`; the stream after a `200`, or an error.
async fn try_tunnel(gw: SocketAddr, target: &str, auth: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(gw).await?;
    s.set_nodelay(true)?;
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await?;
    let mut got = Vec::new();
    let mut byte = [0_u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            return Err(std::io::Error::other("closed"));
        }
        got.push(byte[0]);
    }
    if got.starts_with(b"HTTP/1.1 200") {
        Ok(s)
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&got).into_owned(),
        ))
    }
}

/// One slowloris connection: a request head one byte a second, never finished; re-opened when
/// the gateway closes it, until `stop`. Counts each re-opening in `reopened`.
async fn slowloris(
    gw: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
    reopened: Arc<AtomicU64>,
) {
    let head = b"CONNECT bench.test:443 HTTP/1.1\r\nHost: bench.test:443\r\nX-Padding: ";
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(gw).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if !first {
            reopened.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        for b in head.iter().chain(std::iter::repeat(&b'a')) {
            if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// One flooding client: `CONNECT` with a token whose connections are all taken, again and
/// again, until `stop`. Counts each `429` in `refused`.
async fn connect_flood(
    gw: SocketAddr,
    auth: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    refused: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        match try_tunnel(gw, "bench.test:9444", &auth).await {
            Err(e) if e.to_string().starts_with("HTTP/1.1 429") => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}
