//! A server on another host, as docs/opensandbox.md sets it up: the OpenSandbox fake behind an
//! HTTPS reverse proxy whose certificate a private CA signed (made at test time). With
//! `OPEN_SANDBOX_CA_FILE` the provider runs a program through it; without, the first call is
//! refused at once, naming the setting. Plain `http://` to another host needs
//! `OPEN_SANDBOX_ALLOW_PLAIN_HTTP`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use opensandbox_fake::{Config, FakeOptions, FakeServer};
use sandbox_core::ErrorKind;
use sandbox_opensandbox::settings::{ENV_ALLOW_PLAIN_HTTP, ENV_CA_FILE, ENV_DOMAIN};
use sandbox_opensandbox::{Egress, OpenSandboxProvider, OpenSandboxSettings, SandboxSpec};

const KEY: &str = "os-tls-key-3c9d2b";

/// A throwaway CA's PEM file and a TLS setup whose certificate, for `localhost`, it signed.
fn private_ca() -> (tempfile::NamedTempFile, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "opensandbox proxy test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), ca.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    (file, Arc::new(server))
}

/// A TLS-terminating front for `upstream` (the reverse proxy): its port and the number of
/// connections it accepted.
async fn https_front(upstream: String, tls: Arc<rustls::ServerConfig>) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(inbound).await else {
                    return;
                };
                let Ok(mut out) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut out).await;
            });
        }
    });
    (port, accepted)
}

fn settings(vars: &[(&str, &str)]) -> Result<OpenSandboxSettings, sandbox_core::SandboxError> {
    let mut map: BTreeMap<String, String> = BTreeMap::from([
        ("OPEN_SANDBOX_API_KEY".into(), KEY.into()),
        (
            "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION".into(),
            "true".into(),
        ),
        ("OPEN_SANDBOX_READY_SECONDS".into(), "20".into()),
        ("OPEN_SANDBOX_SERVER_UNREACHABLE".into(), "true".into()),
    ]);
    for (k, v) in vars {
        map.insert((*k).into(), (*v).into());
    }
    OpenSandboxSettings::from_lookup(move |n| map.get(n).cloned())
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        egress: Egress::Unrestricted,
        memory_mb: 256,
        surface: "backend",
        run_budget: Duration::from_secs(10),
    }
}

/// Runs `code` in a new sandbox of `p` and deletes it; the program's stdout.
async fn run_once(p: &OpenSandboxProvider, code: &str) -> String {
    let mut sb = p.create(&spec()).await.unwrap();
    let out = sb
        .run_python(code, &BTreeMap::new(), Duration::from_secs(10), 1 << 20)
        .await
        .unwrap();
    sb.destroy().await;
    out.stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_behind_a_private_ca_runs_with_the_ca_file_and_is_refused_without() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            pending_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let (ca, tls) = private_ca();
    let (port, accepted) = https_front(fake.addr().to_string(), tls).await;
    let domain = format!("https://localhost:{port}");
    let ca_path = ca.path().display().to_string();

    // Without the CA: refused at the first call, naming the setting, nothing retried.
    let p = OpenSandboxProvider::new(settings(&[(ENV_DOMAIN, &domain)]).unwrap()).unwrap();
    let started = Instant::now();
    let e = p.create(&spec()).await.unwrap_err();
    eprintln!("without the CA file: {e}");
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.message().contains(ENV_CA_FILE), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one handshake, not retried"
    );
    assert_eq!(fake.stats().created, 0);

    // With it: a program runs through the proxy, and its sandbox is deleted.
    let s = settings(&[(ENV_DOMAIN, &domain), (ENV_CA_FILE, &ca_path)]).unwrap();
    assert_eq!(s.ca_file.as_deref(), Some(ca.path()));
    let p = OpenSandboxProvider::new(s).unwrap();
    assert_eq!(run_once(&p, "print(6*7)\n").await, "42\n");
    for _ in 0..50 {
        if fake.stats().live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[test]
fn a_ca_file_that_cannot_be_used_is_refused_naming_the_setting() {
    let not_pem = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_pem.path(), "not a certificate").unwrap();
    let not_pem = not_pem.path().display().to_string();
    for path in ["/nonexistent/ca.pem", not_pem.as_str()] {
        let e = settings(&[(ENV_CA_FILE, path)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused);
        assert!(
            e.message().starts_with(&format!("{ENV_CA_FILE}={path}")),
            "{e}"
        );
    }
}

#[test]
fn a_pem_block_that_is_not_a_certificate_is_refused_naming_the_setting() {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        f.path(),
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let path = f.path().display().to_string();
    let refusal = settings(&[(ENV_CA_FILE, &path)]).unwrap_err();
    eprintln!("refused as: {refusal}");
    assert_eq!(refusal.kind(), ErrorKind::Refused);
    assert!(
        refusal
            .message()
            .starts_with(&format!("{ENV_CA_FILE}={path}: a certificate is unusable")),
        "{refusal}"
    );
}

/// This machine's address on its default route, when it has one that is not loopback (nothing
/// is sent: a UDP socket's connect only picks the source address).
fn own_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A plain TCP forwarder on `ip` to `upstream`: its port.
async fn forwarder(ip: std::net::IpAddr, upstream: String) -> u16 {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_opt_in_a_run_over_plain_http_to_another_address_goes_ahead() {
    let Some(ip) = own_address() else {
        eprintln!("no address but loopback on this machine: skipped");
        return;
    };
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            pending_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let port = forwarder(ip, fake.addr().to_string()).await;
    let domain = std::net::SocketAddr::new(ip, port).to_string();
    // Without the opt-in: refused before anything is sent.
    let e = OpenSandboxProvider::new(settings(&[(ENV_DOMAIN, &domain)]).unwrap()).unwrap_err();
    assert!(e.message().contains(ENV_ALLOW_PLAIN_HTTP), "{e}");
    assert_eq!(fake.stats().created, 0);
    // With it: the run goes ahead, over plain http.
    let s = settings(&[(ENV_DOMAIN, &domain), (ENV_ALLOW_PLAIN_HTTP, "true")]).unwrap();
    assert!(s.plain_http_in_use());
    let p = OpenSandboxProvider::new(s).unwrap();
    assert!(p.client().base_url().starts_with("http://"));
    assert_eq!(run_once(&p, "print('in clear')\n").await, "in clear\n");
    fake.shutdown().await;
}

#[test]
fn plain_http_to_another_host_needs_the_opt_in() {
    let domain = "sandbox-server.internal:8080";
    let s = settings(&[(ENV_DOMAIN, domain)]).unwrap();
    let e = s.client().unwrap_err();
    eprintln!("refused as: {e}");
    for name in [ENV_DOMAIN, ENV_CA_FILE, ENV_ALLOW_PLAIN_HTTP] {
        assert!(e.message().contains(name), "{name}: {e}");
    }
    assert!(!e.message().contains("ClientBuilder"), "{e}");
    assert!(!s.plain_http_in_use());

    let s = settings(&[(ENV_DOMAIN, domain), (ENV_ALLOW_PLAIN_HTTP, "true")]).unwrap();
    assert!(s.plain_http_in_use());
    assert_eq!(
        s.client().unwrap().base_url(),
        "http://sandbox-server.internal:8080/v1"
    );
    // Loopback needs no opt-in, and the opt-in is not "in use" there.
    let s = settings(&[
        (ENV_DOMAIN, "localhost:8080"),
        (ENV_ALLOW_PLAIN_HTTP, "true"),
    ])
    .unwrap();
    assert!(!s.plain_http_in_use());
    s.client().unwrap();
    let e = settings(&[(ENV_ALLOW_PLAIN_HTTP, "perhaps")]).unwrap_err();
    assert!(e.message().contains(ENV_ALLOW_PLAIN_HTTP), "{e}");
}
