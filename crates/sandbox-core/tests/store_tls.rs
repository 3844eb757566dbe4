//! TLS to the admission store, against real servers that `scripts/stores` starts with a
//! throwaway CA: Redis at `CREATEOS_TEST_REDISS_URL`, PostgreSQL at `CREATEOS_TEST_POSTGRES_URL`
//! with `ssl=on` (`CREATEOS_TEST_POSTGRES_TLS=1`), the CA at `CREATEOS_TEST_STORE_CA`. A test
//! whose server is not given says so and passes.
//!
//! What an operator relies on: the URL their Langflow already connects with (libpq's `sslmode`
//! and `sslrootcert`, redis-py's `rediss://` parameters) works; a certificate that does not
//! check out refuses the run, naming what to set; and "encrypted" really is (the server says
//! so).

use std::time::Duration;

use sandbox_core::lease::{Deployment, ENV_ADMISSION_NAMESPACE, ENV_ADMISSION_STORE, StoreConfig};
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
