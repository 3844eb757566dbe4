//! The admission store's wire clients: Redis and PostgreSQL, over TCP or TLS (libpq-style TLS
//! through rustls with the aws-lc-rs provider the HTTP client already uses), implementing
//! sandbox-core's [`LeaseStore`] trait. sandbox-core holds the deployment-wide caps themselves
//! (the settings, the leases a process holds, their renewer, the waiting line, `doctor`'s lines;
//! see `sandbox_core::lease`) and never names this crate: the one place that assembles a process
//! (py-bindings, a test, a bench) calls [`install`] once, and a build without it refuses every run
//! while `CREATEOS_ADMISSION_STORE` is set.
//!
//! - [`read_url`]: a store URL (`redis://`, `rediss://`, `postgres://`, `postgresql://`, with
//!   `SQLAlchemy`'s `+driver` suffix) read as its usual clients read it: kind, TLS ([`tls`]),
//!   the text it may be shown as ([`describe_store_value`]) and the secrets it holds.
//! - [`RedisStore`] and [`PostgresStore`]: one atomic step per acquire (a Lua script; a
//!   transaction under an advisory lock), renewals and releases in one round trip each.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::SandboxError;
use sandbox_core::lease::{
    ENV_ADMISSION_STORE, LeaseStore, StoreConfig, StoreDriver, StoreError, StoreKind, StoreUrl,
};
use secrecy::SecretString;

mod postgres_store;
mod redis_store;
mod shown;
pub mod tls;

pub use postgres_store::PostgresStore;
pub use redis_store::RedisStore;
pub use shown::describe_store_value;

/// The store of `config`: a [`RedisStore`] or a [`PostgresStore`] (connects on first use).
pub fn open_store(config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    Ok(match config.kind {
        StoreKind::Redis => Arc::new(RedisStore::new(config)?),
        StoreKind::Postgres => Arc::new(PostgresStore::new(config)?),
    })
}

/// Reads `url`, the value of `source` (a refusal naming [`ENV_ADMISSION_STORE`] and the fix,
/// never the password, when it cannot be used): the [`StoreUrl`] sandbox-core keeps.
pub fn read_url(source: &'static str, url: &str) -> Result<StoreUrl, SandboxError> {
    let shape = shown::shape(url);
    let (kind, split) = parse_store_url(source, url, &shape)?;
    Ok(StoreUrl {
        kind,
        connect_url: SecretString::from(split.url),
        tls: split.tls,
        shown: shape.text(),
        secrets: shown::secrets(url),
    })
}

/// The driver [`install`] installs.
struct Driver;

impl StoreDriver for Driver {
    fn read_url(&self, source: &'static str, url: &str) -> Result<StoreUrl, SandboxError> {
        read_url(source, url)
    }

    fn open(&self, config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
        open_store(config)
    }
}

/// Installs this crate as the process's admission store driver
/// (`sandbox_core::lease::install_driver`; calling it again is harmless).
pub fn install() {
    static DRIVER: Driver = Driver;
    sandbox_core::lease::install_driver(&DRIVER);
}

/// Milliseconds, at least 1 (a store's expiries and tickets).
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Reads a store URL, `source`'s value: its kind and TLS, checked the way its client reads it.
fn parse_store_url(
    source: &str,
    url: &str,
    shape: &shown::Shape,
) -> Result<(StoreKind, tls::Split), SandboxError> {
    let shown = shape.text();
    let bad = |why: &str| {
        SandboxError::refused(format!(
            "{source}={shown} is not a usable admission store ({why}); set \
             {ENV_ADMISSION_STORE} to a redis://host:6379/0, rediss:// or \
             postgres://user@host/db URL, or unset it for per-process caps"
        ))
    };
    if let Some(why) = shape.refusal() {
        return Err(bad(&why));
    }
    let url = url.trim();
    let scheme = url.split("://").next().unwrap_or("").to_ascii_lowercase();
    // SQLAlchemy's driver suffix (`postgresql+psycopg://`, as in LANGFLOW_DATABASE_URL) names
    // Python's driver, not the server: the same database.
    let base = scheme.split('+').next().unwrap_or("");
    let kind = match base {
        "redis" | "rediss" if !scheme.contains('+') => StoreKind::Redis,
        "postgres" | "postgresql" => StoreKind::Postgres,
        s if s.starts_with("sqlite") => {
            return Err(bad(
                "SQLite is one file per host and cannot hold a cap for several hosts; point \
                 LANGFLOW_DATABASE_URL at PostgreSQL, or use langflow-redis or a redis:// URL",
            ));
        }
        _ => {
            return Err(bad(
                "the scheme must be redis, rediss, postgres or postgresql",
            ));
        }
    };
    let plain_scheme = format!("{base}{}", &url[scheme.len()..]);
    let url = if scheme.contains('+') {
        plain_scheme.as_str()
    } else {
        url
    };
    let split = tls::split(kind, url).map_err(|why| bad(&why))?;
    match kind {
        StoreKind::Redis => {
            redis::Client::open(split.url.as_str()).map_err(|_| bad("not a Redis URL"))?;
        }
        StoreKind::Postgres => {
            split
                .url
                .parse::<tokio_postgres::Config>()
                .map_err(|_| bad("not a PostgreSQL connection URL"))?;
        }
    }
    Ok((kind, split))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sandbox_core::ErrorKind;
    use sandbox_core::lease::tls::TlsMode;
    use sandbox_core::lease::{
        DEFAULT_LEASE, Deployment, ENV_ADMISSION_LEASE, ENV_ADMISSION_NAMESPACE,
        ENV_ADMISSION_STORE, ENV_ADMISSION_STORE_ON_FAILURE, ENV_LANGFLOW_DATABASE_URL,
        ENV_LANGFLOW_REDIS_URL, OnFailure, StoreConfig, StoreError, StoreKind, doctor_lines,
    };
    use tokio::time::Instant;

    /// The lookup of `pairs`, with this crate installed as the driver.
    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        super::install();
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn urls_are_parsed_and_shown_without_their_password() {
        let c = StoreConfig::from_lookup(&env(&[(
            ENV_ADMISSION_STORE,
            "postgres://lf:hunter2-secret@127.0.0.1:5432/langflow",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(c.kind, StoreKind::Postgres);
        assert_eq!(c.on_failure, OnFailure::Refuse);
        assert_eq!(c.lease, DEFAULT_LEASE);
        for text in [format!("{c:?}"), c.describe()] {
            assert!(!text.contains("hunter2"), "{text}");
        }
        // SQLAlchemy's spelling in LANGFLOW_DATABASE_URL: the same database, libpq's TLS.
        let sa = StoreConfig::from_lookup(&env(&[
            (ENV_ADMISSION_STORE, "langflow-database"),
            (
                ENV_LANGFLOW_DATABASE_URL,
                "postgresql+psycopg://lf:hunter2-secret@db:5432/langflow?sslmode=require",
            ),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(sa.kind, StoreKind::Postgres);
        assert_eq!(sa.tls.mode, TlsMode::Require);
        assert_eq!(
            sa.connect_url(),
            "postgresql://lf:hunter2-secret@db:5432/langflow?sslmode=require"
        );
        assert!(!format!("{sa:?}").contains("hunter2"));
        let r = StoreConfig::from_lookup(&env(&[
            (ENV_ADMISSION_STORE, "langflow-redis"),
            (
                ENV_LANGFLOW_REDIS_URL,
                "redis://:pw-secret@127.0.0.1:6379/0",
            ),
            (ENV_ADMISSION_STORE_ON_FAILURE, "LOCAL"),
            (ENV_ADMISSION_LEASE, "9"),
            (ENV_ADMISSION_NAMESPACE, "prod"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.kind, r.source, r.on_failure, r.lease),
            (
                StoreKind::Redis,
                ENV_LANGFLOW_REDIS_URL,
                OnFailure::Local,
                Duration::from_secs(9)
            )
        );
        assert_eq!(r.guests_key(), "prod:guests");
        assert!(!r.describe().contains("pw-secret"));
        // Interned: the same setting is the same config.
        let again = StoreConfig::from_lookup(&env(&[(
            ENV_ADMISSION_STORE,
            "postgres://lf:hunter2-secret@127.0.0.1:5432/langflow",
        )]))
        .unwrap()
        .unwrap();
        assert!(std::ptr::eq(c, again));
    }

    #[test]
    fn bad_values_are_refused_naming_the_setting_never_the_password() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(ENV_ADMISSION_STORE, "mysql://u:pw-secret@h/db")],
                ENV_ADMISSION_STORE,
            ),
            (
                &[(
                    ENV_ADMISSION_STORE,
                    "rediss://u:pw-secret@h:6380?ssl_ca_certs=/no/such/ca.pem",
                )],
                "ssl_ca_certs=/no/such/ca.pem: cannot be read",
            ),
            (
                &[(
                    ENV_ADMISSION_STORE,
                    "redis://u:pw-secret@h:6380?ssl_cert_reqs=required",
                )],
                "use rediss://",
            ),
            (
                &[(
                    ENV_ADMISSION_STORE,
                    "postgres://u:pw-secret@h/db?sslmode=verify-everything",
                )],
                "sslmode=\"verify-everything\"",
            ),
            (
                &[(
                    ENV_ADMISSION_STORE,
                    "postgres://u:pw-secret@h/db?sslmode=require&sslcert=/c.pem&sslkey=/k.pem",
                )],
                "sslcert: client certificates are not supported",
            ),
            (
                &[
                    (ENV_ADMISSION_STORE, "langflow-database"),
                    (ENV_LANGFLOW_DATABASE_URL, "sqlite:///./langflow.db"),
                ],
                "SQLite",
            ),
            (
                &[(ENV_ADMISSION_STORE, "langflow-redis")],
                ENV_LANGFLOW_REDIS_URL,
            ),
            (
                &[
                    (ENV_ADMISSION_STORE, "redis://h"),
                    (ENV_ADMISSION_STORE_ON_FAILURE, "maybe"),
                ],
                ENV_ADMISSION_STORE_ON_FAILURE,
            ),
            (
                &[
                    (ENV_ADMISSION_STORE, "redis://h"),
                    (ENV_ADMISSION_LEASE, "1"),
                ],
                ENV_ADMISSION_LEASE,
            ),
            (
                &[
                    (ENV_ADMISSION_STORE, "redis://h"),
                    (ENV_ADMISSION_NAMESPACE, "a b"),
                ],
                ENV_ADMISSION_NAMESPACE,
            ),
        ];
        for (pairs, want) in cases {
            let e = StoreConfig::from_lookup(&env(pairs)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Refused);
            assert!(e.message().contains(want), "{want}: {e}");
            assert!(!e.message().contains("pw-secret"), "{e}");
        }
    }

    #[tokio::test]
    async fn store_errors_and_fallbacks_are_counted_for_the_exporters() {
        let c = StoreConfig::from_lookup(&env(&[(ENV_ADMISSION_STORE, "redis://127.0.0.1:1/0")]))
            .unwrap()
            .unwrap();
        let obs = sandbox_core::observe::Observation::new();
        let dep = Deployment::observed(c, Some(obs.clone())).unwrap();
        let until = Instant::now() + Duration::from_millis(500);
        let e = dep
            .try_lease(&c.guests_key(), Some(1), until)
            .await
            .unwrap_err();
        dep.note_fallback(&e);
        let value = |name: &str| obs.counters().value(name, &[]).unwrap_or(-1.0);
        // The failed acquire, and the release of its maybe-added lease (spawned) may add one.
        assert!(value("createos_admission_store_errors_total") >= 1.0);
        assert!((value("createos_admission_store_fallbacks_total") - 1.0).abs() < f64::EPSILON);
        assert!(value("createos_admission_store_leases_lost_total").abs() < f64::EPSILON);
        assert_eq!(dep.stats().fallbacks, 1);
    }

    #[test]
    fn a_store_error_never_shows_the_password() {
        let c = StoreConfig::from_lookup(&env(&[(
            ENV_ADMISSION_STORE,
            "redis://u:p%40ss-secret-1@127.0.0.1:6379/0",
        )]))
        .unwrap()
        .unwrap();
        let e = c.scrub(StoreError(
            "auth p%40ss-secret-1 or p@ss-secret-1 failed".into(),
        ));
        assert!(!e.0.contains("secret-1"), "{e}");
    }

    /// Each form a password can take in the setting: never in the refusal, the config's
    /// `Debug`, `doctor`'s lines, or the refusal every run gets while the store is away.
    #[tokio::test]
    async fn no_form_of_the_store_value_ever_shows_its_password() {
        let refused = [
            "host=db user=lf password=pw-secret-9 dbname=lf",
            "user=lf password='pw-secret-9' host=db",
            "db.internal:5432/lf?password=pw-secret-9",
            "postgres://lf:pw#secret-9@db:5432/lf",
            "postgres://lf:pw?secret-9@db:5432/lf",
            "redis://:pw#secret-9@cache:6379/0",
            "redis://u:9999?secret-9@cache:6379/0",
            "rediss://:pw-secret-9@ca che:6380/0",
        ];
        for raw in refused {
            let e = StoreConfig::from_lookup(&env(&[(ENV_ADMISSION_STORE, raw)])).unwrap_err();
            let text = e.message();
            assert!(text.contains(ENV_ADMISSION_STORE), "{raw}: {text}");
            assert!(
                text.contains("postgres://user@host/db URL")
                    && (text.contains("percent-encod") || text.contains("no scheme://")),
                "{raw}: the fix: {text}"
            );
            assert!(
                !text.contains("secret-9") && !text.contains("pw"),
                "{raw}: {text}"
            );
            for line in doctor_lines(&env(&[(ENV_ADMISSION_STORE, raw)])).await {
                let line = line.unwrap_or_else(|e| e);
                assert!(!line.contains("secret-9"), "{raw}: {line}");
            }
        }
        // Accepted (nothing listens there): the password sits in the userinfo (with an
        // encoded '#') or in a query parameter.
        for raw in [
            "postgres://127.0.0.1:1/lf?password=pw-secret-9&sslmode=disable",
            "postgres://lf:pw%23secret-9@127.0.0.1:1/lf?sslmode=disable",
            "redis://:pw%3Fsecret-9@127.0.0.1:1/0",
            "postgres://lf:pw-secret-9@127.0.0.1:1,127.0.0.1:2/lf",
        ] {
            let lookup = env(&[(ENV_ADMISSION_STORE, raw)]);
            let c = StoreConfig::from_lookup(&lookup).unwrap().unwrap();
            let lines = doctor_lines(&lookup).await;
            assert!(
                lines.iter().any(Result::is_err),
                "{raw}: unreachable: {lines:?}"
            );
            let a = sandbox_core::admission::Admission::new();
            let caps = sandbox_core::admission::Caps {
                max_live: Some(1),
                store: Some(c),
                ..Default::default()
            };
            let e = a
                .guest_slot(caps, Instant::now() + Duration::from_millis(300))
                .await
                .unwrap_err();
            assert!(e.message().contains(ENV_ADMISSION_STORE_ON_FAILURE), "{e}");
            for text in lines.into_iter().map(|l| l.unwrap_or_else(|e| e)).chain([
                format!("{c:?}"),
                c.describe(),
                e.to_string(),
            ]) {
                assert!(!text.contains("secret-9"), "{raw}: {text}");
            }
        }
    }

    #[test]
    fn keys_hash_what_they_are_given() {
        let c = StoreConfig::from_lookup(&env(&[(ENV_ADMISSION_STORE, "redis://127.0.0.1")]))
            .unwrap()
            .unwrap();
        let k = c.flow_key("a flow'; DROP TABLE x; --");
        assert!(k.starts_with("createos:flow:"));
        assert!(k.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == ':'));
        assert_ne!(c.flow_key("a"), c.flow_key("b"));
    }
}
