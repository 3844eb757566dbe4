//! The PostgreSQL store: leases as rows of one table, taken by one server-side function.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;

use super::{
    Acquired, Ask, LeaseStore, Leases, PG_LINE, PG_TABLE, STORE_CALL_TIMEOUT, StoreConfig,
    StoreError, StoreFuture, WAIT_TICKET, ms,
};
use crate::LOG_TARGET;

/// The PostgreSQL store: one table ([`PG_TABLE`], created if missing) of `(key, lease_id,
/// holder, expires_at)`, one of the runs waiting in line ([`PG_LINE`]: `(key, ticket,
/// arrived_at, expires_at)`) and one function, `createos_admission_acquire` (its 9-argument
/// form), created or replaced at connect. An acquire is one call of it, one statement and so
/// one transaction: it deletes the leases given back since the last acquire (two arrays, keys
/// and ids), then `pg_advisory_xact_lock(hashtext(key))` serialises the acquires of one key
/// across every connection, then it deletes the key's expired leases and tickets, counts the
/// rest and inserts ours if the count is under the cap and fewer tickets are ahead of ours
/// than places free; refused, a run that will ask again keeps (or takes) its ticket. It is `VOLATILE`, so each of its statements sees what the
/// previous lock holder committed (read committed). Times are the server's
/// `clock_timestamp()`. Calls are prepared statements, so the server plans them once per
/// connection.
pub struct PostgresStore {
    config: tokio_postgres::Config,
    /// TLS (`None`: plain TCP, `sslmode=disable`).
    tls: Option<super::tls::PgTls>,
    conn: AsyncMutex<Option<Arc<PgConn>>>,
}

/// A connection's driving future (it runs on its own task), plain or TLS.
type Driving = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// One connection and its prepared statements.
struct PgConn {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    count: tokio_postgres::Statement,
}

fn pg_err(e: &tokio_postgres::Error) -> StoreError {
    // tokio-postgres errors name the server's message or the I/O failure, never the URL.
    let text = e.as_db_error().map_or_else(
        || {
            // The cause (an I/O or TLS error) is only in the source chain.
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let c_text = c.to_string();
                if !text.contains(&c_text) {
                    text = format!("{text}: {c_text}");
                }
                cause = c.source();
            }
            text
        },
        |db| format!("{}: {}", db.code().code(), db.message()),
    );
    StoreError(super::tls::explain(
        super::StoreKind::Postgres,
        format!("postgres: {text}"),
    ))
}

/// A literal for the renewal's list. Keys and ids are made here (a namespace of
/// `[A-Za-z0-9._-]`, hex digests, host names and pids); quotes are doubled all the same.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''").replace('\0', ""))
}

/// The keys and the ids of `leases`, as two arrays for `unnest`.
fn columns(leases: &Leases) -> (Vec<&str>, Vec<&str>) {
    leases.iter().map(|(k, i)| (k.as_str(), i.as_str())).unzip()
}

/// The schema, run once per connection under a lock of its own (so concurrent first
/// connections of several workers do not race `CREATE`).
fn pg_schema() -> String {
    format!(
        "SELECT pg_advisory_xact_lock(hashtext({table})); \
         CREATE TABLE IF NOT EXISTS {PG_TABLE} (key text NOT NULL, lease_id text NOT NULL, \
           holder text NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (key, lease_id)); \
         CREATE INDEX IF NOT EXISTS {PG_TABLE}_key ON {PG_TABLE} (key, expires_at); \
         CREATE TABLE IF NOT EXISTS {PG_LINE} (key text NOT NULL, ticket text NOT NULL, \
           arrived_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, \
           PRIMARY KEY (key, ticket)); \
         CREATE OR REPLACE FUNCTION createos_admission_acquire(p_key text, p_id text, \
           p_holder text, p_cap bigint, p_ttl_ms bigint, p_release_keys text[], \
           p_release_ids text[], p_ticket_ms bigint, p_queue boolean) \
           RETURNS TABLE (granted boolean, live bigint, waiting bigint) LANGUAGE plpgsql \
           VOLATILE AS $fn$ \
         DECLARE n bigint; queued bigint; ahead bigint; mine timestamptz; \
         BEGIN \
           FOR i IN 1 .. coalesce(cardinality(p_release_keys), 0) LOOP \
             DELETE FROM {PG_TABLE} WHERE key = p_release_keys[i] AND lease_id = p_release_ids[i]; \
           END LOOP; \
           PERFORM pg_advisory_xact_lock(hashtext(p_key)); \
           DELETE FROM {PG_LINE} WHERE key = p_key AND expires_at <= clock_timestamp(); \
           DELETE FROM {PG_TABLE} WHERE key = p_key AND expires_at <= clock_timestamp(); \
           SELECT count(*) INTO queued FROM {PG_LINE} WHERE key = p_key; \
           UPDATE {PG_TABLE} SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond' \
             WHERE key = p_key AND lease_id = p_id; \
           IF FOUND THEN \
             SELECT count(*) INTO n FROM {PG_TABLE} WHERE key = p_key; \
             RETURN QUERY SELECT true, n, queued; RETURN; \
           END IF; \
           SELECT count(*) INTO n FROM {PG_TABLE} WHERE key = p_key; \
           SELECT arrived_at INTO mine FROM {PG_LINE} WHERE key = p_key AND ticket = p_id; \
           IF mine IS NULL THEN \
             ahead := queued; \
           ELSE \
             SELECT count(*) INTO ahead FROM {PG_LINE} WHERE key = p_key \
               AND (arrived_at, ticket) < (mine, p_id); \
           END IF; \
           IF p_cap IS NULL OR (n < p_cap AND ahead < p_cap - n) THEN \
             INSERT INTO {PG_TABLE} (key, lease_id, holder, expires_at) VALUES (p_key, p_id, \
               p_holder, clock_timestamp() + p_ttl_ms * interval '1 millisecond'); \
             IF mine IS NOT NULL THEN \
               DELETE FROM {PG_LINE} WHERE key = p_key AND ticket = p_id; \
               queued := queued - 1; \
             END IF; \
             RETURN QUERY SELECT true, n + 1, queued; RETURN; \
           END IF; \
           IF p_queue THEN \
             INSERT INTO {PG_LINE} (key, ticket, arrived_at, expires_at) VALUES (p_key, p_id, \
               clock_timestamp(), clock_timestamp() + p_ticket_ms * interval '1 millisecond') \
               ON CONFLICT (key, ticket) DO UPDATE SET expires_at = EXCLUDED.expires_at; \
             IF mine IS NULL THEN queued := queued + 1; END IF; \
           END IF; \
           RETURN QUERY SELECT false, n, queued; \
         END $fn$",
        table = lit(PG_TABLE)
    )
}

impl PostgresStore {
    /// A store on `config`'s URL; connects on first use (and again after a failure).
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let mut cfg: tokio_postgres::Config = config
            .connect_url()
            .parse()
            .map_err(|_| StoreError("postgres: not a PostgreSQL connection URL".into()))?;
        cfg.connect_timeout(STORE_CALL_TIMEOUT);
        cfg.application_name("langflow-sandbox-createos");
        let tls = config
            .tls
            .client_config()
            .map_err(|e| StoreError(format!("postgres: {e}")))?
            .map(super::tls::PgTls);
        Ok(Self {
            config: cfg,
            tls,
            conn: AsyncMutex::new(None),
        })
    }

    async fn conn(&self) -> Result<Arc<PgConn>, StoreError> {
        let mut held = self.conn.lock().await;
        if let Some(c) = held.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Arc::clone(c));
        }
        let (client, connection): (tokio_postgres::Client, Driving) = if let Some(tls) = &self.tls {
            let (c, conn) = self
                .config
                .connect(tls.clone())
                .await
                .map_err(|e| pg_err(&e))?;
            (c, Box::pin(conn))
        } else {
            let (c, conn) = self
                .config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| pg_err(&e))?;
            (c, Box::pin(conn))
        };
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(target: LOG_TARGET, error = %pg_err(&e), "admission store: connection ended");
            }
        });
        client
            .batch_execute(&pg_schema())
            .await
            .map_err(|e| pg_err(&e))?;
        let prepare = |sql: String| {
            let client = &client;
            async move { client.prepare(&sql).await.map_err(|e| pg_err(&e)) }
        };
        let acquire = prepare(
            "SELECT granted, live, waiting FROM createos_admission_acquire($1::text, \
             $2::text, $3::text, $4::bigint, $5::bigint, $6::text[], $7::text[], $8::bigint, \
             $9::boolean)"
                .to_owned(),
        )
        .await?;
        let release = prepare(format!(
            "DELETE FROM {PG_TABLE} WHERE (key, lease_id) IN \
             (SELECT * FROM unnest($1::text[], $2::text[]))"
        ))
        .await?;
        let count = prepare(format!(
            "SELECT count(*) FROM {PG_TABLE} WHERE key = $1::text AND expires_at > \
             clock_timestamp()"
        ))
        .await?;
        let conn = Arc::new(PgConn {
            client,
            acquire,
            release,
            count,
        });
        *held = Some(Arc::clone(&conn));
        Ok(conn)
    }
}

impl LeaseStore for PostgresStore {
    fn try_acquire<'a>(&'a self, ask: Ask<'a>, release: &'a Leases) -> StoreFuture<'a, Acquired> {
        Box::pin(async move {
            let c = self.conn().await?;
            let cap: Option<i64> = ask.cap.map(|c| i64::try_from(c).unwrap_or(i64::MAX));
            let ttl = i64::try_from(ms(ask.ttl)).unwrap_or(i64::MAX);
            let ticket = i64::try_from(ms(WAIT_TICKET)).unwrap_or(i64::MAX);
            let (key, id, holder, queue) = (ask.key, ask.id, ask.holder, ask.queue);
            let (keys, ids) = columns(release);
            let row = c
                .client
                .query_one(
                    &c.acquire,
                    &[&key, &id, &holder, &cap, &ttl, &keys, &ids, &ticket, &queue],
                )
                .await
                .map_err(|e| pg_err(&e))?;
            let granted: bool = row.try_get(0).map_err(|e| pg_err(&e))?;
            let live: i64 = row.try_get(1).map_err(|e| pg_err(&e))?;
            let waiting: i64 = row.try_get(2).map_err(|e| pg_err(&e))?;
            Ok(Acquired {
                granted,
                live: u64::try_from(live).unwrap_or(0),
                waiting: u64::try_from(waiting).unwrap_or(0),
            })
        })
    }

    fn renew<'a>(&'a self, leases: &'a Leases, ttl: Duration) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            if leases.is_empty() {
                return Ok(Vec::new());
            }
            let c = self.conn().await?;
            let ids: Vec<String> = leases
                .iter()
                .map(|(key, id)| format!("({}, {})", lit(key), lit(id)))
                .collect();
            let sql = format!(
                "UPDATE {PG_TABLE} SET expires_at = clock_timestamp() + {} * interval '1 \
                 millisecond' WHERE (key, lease_id) IN ({}) AND expires_at > \
                 clock_timestamp() RETURNING lease_id",
                ms(ttl),
                ids.join(",")
            );
            let msgs = c.client.simple_query(&sql).await.map_err(|e| pg_err(&e))?;
            let kept: std::collections::HashSet<&str> = msgs
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
                    _ => None,
                })
                .collect();
            Ok(leases
                .iter()
                .filter(|(_, id)| !kept.contains(id.as_str()))
                .map(|(_, id)| id.clone())
                .collect())
        })
    }

    fn release<'a>(&'a self, leases: &'a Leases) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if leases.is_empty() {
                return Ok(());
            }
            let c = self.conn().await?;
            let (keys, ids) = columns(leases);
            c.client
                .execute(&c.release, &[&keys, &ids])
                .await
                .map_err(|e| pg_err(&e))?;
            Ok(())
        })
    }

    fn leave_line<'a>(&'a self, key: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let c = self.conn().await?;
            c.client
                .execute(
                    &format!("DELETE FROM {PG_LINE} WHERE key = $1::text AND ticket = $2::text"),
                    &[&key, &id],
                )
                .await
                .map(|_| ())
                .map_err(|e| pg_err(&e))
        })
    }

    fn count<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let c = self.conn().await?;
            let row = c
                .client
                .query_one(&c.count, &[&key])
                .await
                .map_err(|e| pg_err(&e))?;
            let n: i64 = row.try_get(0).map_err(|e| pg_err(&e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }
}
