//! TLS to the admission store, against real servers that `scripts/stores` starts with a
//! throwaway CA: Redis at `CREATEOS_TEST_REDISS_URL`, PostgreSQL at `CREATEOS_TEST_POSTGRES_URL`
//! with `ssl=on` (`CREATEOS_TEST_POSTGRES_TLS=1`), the CA at `CREATEOS_TEST_STORE_CA`. A test
//! whose server is not given says so and passes.
//!
//! What an operator relies on: the URL their Langflow already connects with (libpq's `sslmode`
//! and `sslrootcert`, redis-py's `rediss://` parameters) works; a certificate that does not
//! check out refuses the run, naming what to set; and "encrypted" really is (the server says
//! so).

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::lease::tls::Transport;
use sandbox_core::lease::{
    Deployment, ENV_ADMISSION_NAMESPACE, ENV_ADMISSION_STORE, StoreCheck, StoreConfig, check_store,
    doctor_lines,
};
use tokio::time::Instant;

fn var(name: &str) -> Option<String> {
    let v = std::env::var(name).ok().filter(|v| !v.is_empty());
    if v.is_none() {
        eprintln!("{name} is unset: this test needs the stores' TLS (scripts/stores); skipped");
    }
    v
}

/// The PostgreSQL server's URL and the CA, when it listens with TLS.
fn postgres() -> Option<(url::Url, String)> {
    let url = var("CREATEOS_TEST_POSTGRES_URL")?;
    var("CREATEOS_TEST_POSTGRES_TLS")?;
    Some((
        url::Url::parse(&url).unwrap(),
        var("CREATEOS_TEST_STORE_CA")?,
    ))
}

fn config(url: &str) -> &'static StoreConfig {
    let ns = format!("tls{}-{:08x}", std::process::id(), rand::random::<u32>());
    let pairs = [
        (ENV_ADMISSION_STORE.to_owned(), url.to_owned()),
        (ENV_ADMISSION_NAMESPACE.to_owned(), ns),
    ];
    StoreConfig::from_lookup(&move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        .unwrap()
        .unwrap()
}

/// Takes a lease, counts it, gives it back: the store works over `url`, or the error.
async fn round_trip(url: &str) -> Result<(), String> {
    let store = config(url);
    let dep = Deployment::new(store).map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs(5);
    let (lease, live) = dep
        .try_lease(&store.guests_key(), Some(4), until)
        .await
        .map_err(|e| e.to_string())?;
    assert!(lease.is_some(), "{url}: granted");
    assert_eq!(live, 1);
    assert_eq!(dep.count(&store.guests_key()).await.unwrap(), 1);
    drop(lease);
    dep.flush().await;
    assert_eq!(dep.count(&store.guests_key()).await.unwrap(), 0);
    Ok(())
}

/// `url` with `user` as its user and `query` as its query.
fn with(base: &url::Url, user: &str, query: &str) -> String {
    let mut u = base.clone();
    u.set_username(user).unwrap();
    u.set_query(Some(query));
    u.to_string()
}

/// A plain connection as `postgres`, the test's own (not the store's).
async fn admin(base: &url::Url) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(
        &with(base, "postgres", "sslmode=disable"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    client
}

/// Whether the store's connection, made as `user` (a role of the test's own, so no other
/// test's connection is counted), is encrypted, as the server sees it.
async fn server_says_encrypted(base: &url::Url, user: &str) -> bool {
    let client = admin(base).await;
    let rows = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.usename = $1",
            &[&user],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty(), "{user} has a connection");
    rows.iter().all(|r| r.get::<_, bool>(0))
}

/// A login role of this test's own (trust authentication on loopback).
async fn role(base: &url::Url) -> String {
    let name = format!("tls_probe_{:08x}", rand::random::<u32>());
    let client = admin(base).await;
    client
        .batch_execute(&format!("CREATE ROLE {name} LOGIN SUPERUSER"))
        .await
        .unwrap();
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_each_sslmode_does_what_libpq_does() {
    sandbox_store::install();
    let Some((base, ca)) = postgres() else { return };
    // verify-full with the CA: encrypted, and the server agrees.
    let user = role(&base).await;
    let store = config(&with(
        &base,
        &user,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    let dep = Deployment::new(store).unwrap();
    let (lease, _) = dep
        .try_lease(
            &store.guests_key(),
            Some(4),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(lease.is_some());
    assert!(
        server_says_encrypted(&base, &user).await,
        "verify-full is encrypted"
    );
    drop(lease);
    dep.flush().await;

    // No sslmode (libpq's prefer) against a server with TLS on: encrypted too, unchecked.
    let user = role(&base).await;
    let store = config(&with(&base, &user, ""));
    let dep = Deployment::new(store).unwrap();
    dep.count(&store.guests_key()).await.unwrap();
    assert!(
        server_says_encrypted(&base, &user).await,
        "prefer uses TLS when offered"
    );

    // sslmode=disable: plain, as asked.
    let user = role(&base).await;
    let store = config(&with(&base, &user, "sslmode=disable"));
    let dep = Deployment::new(store).unwrap();
    dep.count(&store.guests_key()).await.unwrap();
    assert!(
        !server_says_encrypted(&base, &user).await,
        "disable is plain"
    );

    for q in [
        "sslmode=require".to_owned(),
        format!("sslmode=require&sslrootcert={ca}"),
        format!("sslmode=verify-ca&sslrootcert={ca}"),
    ] {
        round_trip(&with(&base, "postgres", &q)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_certificate_that_does_not_check_out_refuses_naming_the_fix() {
    sandbox_store::install();
    let Some((base, ca)) = postgres() else { return };
    // The test CA is in no system store: verify-full against the system's roots fails.
    let e = round_trip(&with(
        &base,
        "postgres",
        "sslmode=verify-full&sslrootcert=system",
    ))
    .await
    .unwrap_err();
    eprintln!("refused as: {e}");
    assert!(
        e.contains("certificate") && e.contains("sslrootcert"),
        "{e}"
    );
    // A host the certificate does not name (reached by its address): verify-full refuses,
    // verify-ca (the chain alone) accepts.
    let mut other = base.clone();
    other
        .set_host(Some("db.not-in-the-certificate.test"))
        .unwrap();
    let e = round_trip(&with(
        &other,
        "postgres",
        &format!("hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    round_trip(&with(
        &other,
        "postgres",
        &format!("hostaddr=127.0.0.1&sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_checks_the_certificate_against_the_given_ca_or_is_told_not_to() {
    sandbox_store::install();
    let Some(url) = var("CREATEOS_TEST_REDISS_URL") else {
        return;
    };
    let Some(ca) = var("CREATEOS_TEST_STORE_CA") else {
        return;
    };
    round_trip(&format!("{url}?ssl_ca_certs={ca}"))
        .await
        .unwrap();
    round_trip(&format!("{url}?ssl_cert_reqs=none"))
        .await
        .unwrap();
    round_trip(&format!("{url}#insecure")).await.unwrap();
    // The system's roots do not hold the test CA: refused, naming the fix.
    let e = round_trip(&url).await.unwrap_err();
    eprintln!("refused as: {e}");
    assert!(
        e.contains("certificate") && e.contains("ssl_ca_certs"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Password authentication outside TLS, and what each connection negotiated.

/// The test's own login roles, one per `pg_hba` method, each with its `pg_hba.conf` line (put first,
/// once, for these role names only, so no other test's connection is touched): `password`
/// (cleartext), `md5` (its password stored as MD5, so the server really asks for MD5) and
/// `scram-sha-256`.
const AUTH_ROLES: [(&str, &str, &str); 3] = [
    ("createos_auth_cleartext", "password", "scram-sha-256"),
    ("createos_auth_md5", "md5", "md5"),
    ("createos_auth_scram", "scram-sha-256", "scram-sha-256"),
];
const AUTH_PASSWORD: &str = "auth-pw-secret-1";

async fn auth_roles(base: &url::Url) {
    let client = admin(base).await;
    for (role, _, stored) in AUTH_ROLES {
        client
            .batch_execute(&format!(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') \
                 THEN CREATE ROLE {role} LOGIN SUPERUSER; END IF; END $$; \
                 SET password_encryption = '{stored}'; \
                 ALTER ROLE {role} PASSWORD '{AUTH_PASSWORD}'"
            ))
            .await
            .unwrap();
    }
    let hba: String = client
        .query_one("SELECT pg_read_file(current_setting('hba_file'))", &[])
        .await
        .unwrap()
        .get(0);
    let lines: Vec<String> = AUTH_ROLES
        .iter()
        .map(|(role, method, _)| format!("host all {role} 127.0.0.1/32 {method}"))
        .collect();
    if lines.iter().all(|l| hba.lines().any(|h| h == l)) {
        return;
    }
    let mut all: Vec<String> = lines.clone();
    all.extend(hba.lines().map(str::to_owned));
    // Written back with COPY, one line per row (the lines hold no tab or backslash).
    let path: String = client
        .query_one("SELECT current_setting('hba_file')", &[])
        .await
        .unwrap()
        .get(0);
    let quote = |t: &str| format!("'{}'", t.replace('\'', "''"));
    let rows: Vec<String> = all.iter().map(|l| quote(l)).collect();
    client
        .batch_execute(&format!(
            "COPY (SELECT unnest(ARRAY[{}]::text[])) TO {}",
            rows.join(","),
            quote(&path)
        ))
        .await
        .unwrap();
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // The reload is asynchronous: wait until a wrong password is refused for the first role.
    let mut probe = base.clone();
    probe.set_username(AUTH_ROLES[2].0).unwrap();
    probe.set_password(Some("wrong")).unwrap();
    probe.set_query(Some("sslmode=disable"));
    for _ in 0..100 {
        if tokio_postgres::connect(probe.as_str(), tokio_postgres::NoTls)
            .await
            .is_err()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("pg_hba.conf was not reloaded");
}

/// The store's URL as `role` with the test password and `query`.
fn as_role(base: &url::Url, role: &str, query: &str) -> String {
    let mut u = base.clone();
    u.set_username(role).unwrap();
    u.set_password(Some(AUTH_PASSWORD)).unwrap();
    u.set_query(Some(query));
    u.to_string()
}

/// Connects through a deployment (one count): what it negotiated, or the refusal.
async fn transport_of(url: &str) -> Result<Transport, String> {
    let store = config(url);
    let dep = Deployment::new(store).map_err(|e| e.to_string())?;
    dep.count(&store.guests_key())
        .await
        .map_err(|e| e.to_string())?;
    Ok(dep.transport().expect("connected"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_password_and_md5_are_refused_outside_tls_and_scram_is_not() {
    sandbox_store::install();
    let Some((base, _)) = postgres() else { return };
    auth_roles(&base).await;
    for (role, what) in [
        ("createos_auth_cleartext", "in cleartext"),
        ("createos_auth_md5", "MD5"),
    ] {
        let e = transport_of(&as_role(&base, role, "sslmode=disable"))
            .await
            .unwrap_err();
        eprintln!("refused as: {e}");
        for want in [
            what,
            "over plain TCP",
            "sslmode=require",
            "scram-sha-256",
            ENV_ADMISSION_STORE,
        ] {
            assert!(e.contains(want), "{role}: {want}: {e}");
        }
        assert!(!e.contains(AUTH_PASSWORD), "{e}");
        // doctor: every run is refused, and why.
        let url = as_role(&base, role, "sslmode=disable");
        let check = check_store(&|k| (k == ENV_ADMISSION_STORE).then(|| url.clone())).await;
        assert!(check.refuses_runs(), "{check:?}");
        let lines = check.lines();
        assert!(
            lines
                .iter()
                .any(|l| l.as_ref().is_err_and(|t| t.contains(what))),
            "{lines:?}"
        );
        // Over TLS (asked for, or offered by the server under the default prefer) the same
        // method is fine: nobody on the way reads it.
        for query in ["sslmode=require", ""] {
            let t = transport_of(&as_role(&base, role, query)).await.unwrap();
            assert!(t.is_tls(), "{role} {query:?}: {t}");
        }
    }
    let t = transport_of(&as_role(&base, "createos_auth_scram", "sslmode=disable"))
        .await
        .unwrap();
    assert_eq!(
        t,
        Transport::PlainTcp,
        "SCRAM never sends the password: allowed"
    );
    let url = as_role(&base, "createos_auth_scram", "sslmode=disable");
    let check = check_store(&|k| (k == ENV_ADMISSION_STORE).then(|| url.clone())).await;
    let StoreCheck::Asked { answer: Ok(a), .. } = &check else {
        panic!("{check:?}")
    };
    assert_eq!(a.transport, Some(Transport::PlainTcp));
    assert_eq!(t.to_string(), "plain TCP (not encrypted)");
    let t = transport_of(
        &as_role(
            &base,
            "createos_auth_scram",
            "sslmode=verify-full&sslrootcert=",
        )
        .replace(
            "sslrootcert=",
            &format!("sslrootcert={}", postgres().unwrap().1),
        ),
    )
    .await
    .unwrap();
    assert!(t.to_string().starts_with("TLS 1.3 (TLS13_"), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_says_what_it_negotiated() {
    sandbox_store::install();
    let (Some(plain), Some(tls), Some(ca)) = (
        var("CREATEOS_TEST_REDIS_URL"),
        var("CREATEOS_TEST_REDISS_URL"),
        var("CREATEOS_TEST_STORE_CA"),
    ) else {
        return;
    };
    assert_eq!(transport_of(&plain).await.unwrap(), Transport::PlainTcp);
    let t = transport_of(&format!("{tls}?ssl_ca_certs={ca}"))
        .await
        .unwrap();
    assert!(t.to_string().starts_with("TLS 1.3 (TLS13_"), "{t}");
    // doctor says it.
    for (url, want) in [
        (plain, "reachable over plain TCP (not encrypted)"),
        (format!("{tls}?ssl_ca_certs={ca}"), "reachable over TLS 1.3"),
    ] {
        let lines = doctor_lines(&|k| (k == ENV_ADMISSION_STORE).then(|| url.clone())).await;
        assert!(
            lines
                .iter()
                .any(|l| l.as_ref().is_ok_and(|t| t.contains(want))),
            "{want}: {lines:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A self-signed certificate given as its own root.

/// A self-signed certificate for `localhost` (a CA certificate, as `openssl req -x509` makes
/// by default, when `ca`), valid until `until_year`: its PEM file and the server's TLS setup.
fn self_signed(ca: bool, until_year: i32) -> (tempfile::NamedTempFile, Arc<rustls::ServerConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "store self-signed");
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
    if ca {
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    }
    let cert = params.self_signed(&key).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), cert.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    (file, Arc::new(server))
}

/// A TLS front for the plain server at `upstream` (host:port) with `tls`'s certificate: for
/// PostgreSQL it first answers the client's `SSLRequest` with `S`. Returns its port.
async fn tls_front(upstream: String, tls: Arc<rustls::ServerConfig>, postgres: bool) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                if postgres {
                    let mut req = [0u8; 8];
                    if inbound.read_exact(&mut req).await.is_err() {
                        return;
                    }
                    if inbound.write_all(b"S").await.is_err() {
                        return;
                    }
                }
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
    port
}

fn host_port(url: &str) -> String {
    let u = url::Url::parse(url).unwrap();
    format!("{}:{}", u.host_str().unwrap(), u.port().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_certificate_given_as_its_own_root_is_accepted_by_both_stores() {
    sandbox_store::install();
    let servers = [
        ("redis", var("CREATEOS_TEST_REDIS_URL")),
        ("postgres", var("CREATEOS_TEST_POSTGRES_URL")),
    ];
    for (name, url) in servers {
        let Some(url) = url else { continue };
        let postgres = name == "postgres";
        // URLs through a front with `tls` whose certificate is at `pem`, reached by `host`.
        let url_of = |port: u16, host: &str, pem: &std::path::Path, mode: &str| {
            if postgres {
                format!(
                    "postgres://postgres@{host}:{port}/postgres?sslmode={mode}&sslrootcert={}",
                    pem.display()
                )
            } else {
                format!("rediss://{host}:{port}/0?ssl_ca_certs={}", pem.display())
            }
        };
        let full = if postgres { "verify-full" } else { "" };
        // A CA certificate (openssl's default) and a plain one, each its own root.
        for ca in [true, false] {
            let (pem, tls) = self_signed(ca, 2090);
            let port = tls_front(host_port(&url), tls, postgres).await;
            round_trip(&url_of(port, "localhost", pem.path(), full))
                .await
                .unwrap_or_else(|e| panic!("{name}, CA {ca}: {e}"));
            // The name is still checked ...
            let e = round_trip(&url_of(port, "127.0.0.1", pem.path(), full))
                .await
                .unwrap_err();
            eprintln!("refused as: {e}");
            assert!(e.contains("does not name the host"), "{name}: {e}");
            // ... except where the URL asks for the chain alone.
            if postgres {
                round_trip(&url_of(port, "127.0.0.1", pem.path(), "verify-ca"))
                    .await
                    .unwrap();
            }
        }
        // The same certificate not given as a root: refused, and the hint names the root to
        // give, never turning the check off.
        let (_, tls) = self_signed(true, 2090);
        let port = tls_front(host_port(&url), tls, postgres).await;
        let other = var("CREATEOS_TEST_STORE_CA").unwrap();
        let e = round_trip(&url_of(
            port,
            "localhost",
            std::path::Path::new(&other),
            full,
        ))
        .await
        .unwrap_err();
        eprintln!("refused as: {e}");
        let param = if postgres {
            "sslrootcert="
        } else {
            "ssl_ca_certs="
        };
        assert!(
            e.contains(&format!(
                "give that certificate itself in the URL as {param}"
            )),
            "{e}"
        );
        for off in [
            "sslmode=require",
            "ssl_cert_reqs=none",
            "without checking",
            "#insecure",
        ] {
            assert!(!e.contains(off), "{name}: suggests {off}: {e}");
        }
        // Its validity period is still checked.
        let (pem, tls) = self_signed(true, 2021);
        let port = tls_front(host_port(&url), tls, postgres).await;
        let e = round_trip(&url_of(port, "localhost", pem.path(), full))
            .await
            .unwrap_err();
        eprintln!("refused as: {e}");
        assert!(e.contains("expired"), "{name}: {e}");
    }
}
