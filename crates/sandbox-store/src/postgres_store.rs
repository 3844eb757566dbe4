//! The PostgreSQL store: leases as rows of one table, taken by one server-side function.
//!
//! Connections are opened here (hosts, `hostaddr`, ports, DNS, `target_session_attrs` as
//! tokio-postgres reads them) and handed to tokio-postgres's `connect_raw`, so the socket can be
//! watched: outside TLS, a server that asks for the password in cleartext (`password`) or as an
//! MD5 hash (`md5`) is refused before anything is sent (libpq 16's `require_auth` can refuse
//! them the same way); SCRAM, which never sends the password, goes on. Over a Unix socket
//! (local, where PostgreSQL offers no TLS) every method is allowed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};

use sandbox_core::LOG_TARGET;
use sandbox_core::error::Redactor;
use sandbox_core::lease::tls::Transport;
use sandbox_core::lease::{
    Acquired, Ask, LeaseStore, Leases, PG_LINE, PG_TABLE, STORE_CALL_TIMEOUT, StoreConfig,
    StoreError, StoreFuture, WAIT_TICKET,
};

use crate::ms;

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
    tls: Option<Arc<rustls::ClientConfig>>,
    conn: AsyncMutex<Option<Arc<PgConn>>>,
    /// What the last connection negotiated.
    transport: Mutex<Option<Transport>>,
    /// The URL's secrets, masked in every error.
    secrets: Redactor,
    /// The variable the URL came from (named in a refusal of the server's authentication).
    source: &'static str,
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

/// A failed call's text: the server's message (with its detail), or the I/O or TLS failure
/// with its causes (tokio-postgres names neither the URL nor the password).
fn pg_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return match db.detail() {
            Some(detail) => format!("{}: {} ({detail})", db.code().code(), db.message()),
            None => format!("{}: {}", db.code().code(), db.message()),
        };
    }
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
}

/// The authentication method the guard refused, when `e` is that refusal.
fn refused_auth(e: &tokio_postgres::Error) -> Option<AuthMethod> {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(AuthRefused(method)) = c
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<AuthRefused>())
        {
            return Some(*method);
        }
        cause = c.source();
    }
    None
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
        let tls = crate::tls::client_config(&config.tls)
            .map_err(|e| StoreError(format!("postgres: {e}")))?;
        Ok(Self {
            config: cfg,
            tls,
            conn: AsyncMutex::new(None),
            transport: Mutex::new(None),
            secrets: config.secrets().clone(),
            source: config.source,
        })
    }

    /// `e` as a store error: a refused authentication method with its fix; anything else with
    /// what the server said masked, cut and escaped, and the certificate hint.
    fn err(&self, e: &tokio_postgres::Error) -> StoreError {
        if let Some(method) = refused_auth(e) {
            return StoreError(method.refusal(self.source));
        }
        let text = sandbox_core::error::outside_text(&pg_text(e), &self.secrets);
        StoreError(crate::tls::explain(
            sandbox_core::lease::StoreKind::Postgres,
            format!("postgres: {text}"),
        ))
    }

    /// What the last connection negotiated (`None` before the first).
    pub fn transport(&self) -> Option<Transport> {
        self.transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A connection to the first host of the URL that takes one (in the URL's order, or
    /// shuffled with `load_balance_hosts=random`), as tokio-postgres would choose it.
    async fn open(&self) -> Result<tokio_postgres::Client, StoreError> {
        let cfg = &self.config;
        let (hosts, addrs, ports) = (cfg.get_hosts(), cfg.get_hostaddrs(), cfg.get_ports());
        let n = hosts.len().max(addrs.len());
        if n == 0 {
            return Err(StoreError("postgres: the URL names no host".into()));
        }
        if (!hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len())
            || (ports.len() > 1 && ports.len() != n)
        {
            return Err(StoreError(
                "postgres: the URL's hosts, hostaddrs and ports do not pair up".into(),
            ));
        }
        let mut order: Vec<usize> = (0..n).collect();
        if cfg.get_load_balance_hosts() == LoadBalanceHosts::Random {
            use rand::seq::SliceRandom as _;
            order.shuffle(&mut rand::rng());
        }
        let mut last = StoreError("postgres: no host answered".into());
        for i in order {
            let port = ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(5432);
            let name = match hosts.get(i) {
                Some(Host::Tcp(h)) => Some(h.clone()),
                _ => None,
            };
            let tried = match (addrs.get(i), hosts.get(i)) {
                (Some(ip), _) => {
                    let name = name.unwrap_or_else(|| ip.to_string());
                    self.over_tcp(vec![SocketAddr::new(*ip, port)], &name).await
                }
                (None, Some(Host::Tcp(h))) => {
                    match tokio::net::lookup_host((h.as_str(), port)).await {
                        Ok(found) => self.over_tcp(found.collect(), h).await,
                        Err(e) => Err(StoreError(format!(
                            "postgres: {h}: the name does not resolve ({})",
                            outside_text::line(&e.to_string())
                        ))),
                    }
                }
                #[cfg(unix)]
                (None, Some(Host::Unix(dir))) => {
                    self.over_unix(&dir.join(format!(".s.PGSQL.{port}"))).await
                }
                (None, None) => continue,
            };
            match tried {
                Ok(client) => return Ok(client),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The first of `addrs` that connects, TLS or not as the URL asks, checked as
    /// `target_session_attrs` asks.
    async fn over_tcp(
        &self,
        addrs: Vec<SocketAddr>,
        name: &str,
    ) -> Result<tokio_postgres::Client, StoreError> {
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(STORE_CALL_TIMEOUT);
        let mut last = StoreError(format!("postgres: {name} resolves to no address"));
        for addr in addrs {
            let tcp = match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
                Ok(Ok(tcp)) => tcp,
                Ok(Err(e)) => {
                    last = StoreError(format!("postgres: cannot connect to {addr} ({e})"));
                    continue;
                }
                Err(_) => {
                    last = StoreError(format!(
                        "postgres: {addr} did not take the connection within {} ms",
                        limit.as_millis()
                    ));
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            match self.handshake(Socket::Tcp(tcp), name).await {
                Ok(client) => return Ok(client),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    #[cfg(unix)]
    async fn over_unix(
        &self,
        path: &std::path::Path,
    ) -> Result<tokio_postgres::Client, StoreError> {
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(STORE_CALL_TIMEOUT);
        let unix = match tokio::time::timeout(limit, tokio::net::UnixStream::connect(path)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(StoreError(format!(
                    "postgres: cannot connect to {} ({e})",
                    path.display()
                )));
            }
            Err(_) => {
                return Err(StoreError(format!(
                    "postgres: {} did not take the connection in time",
                    path.display()
                )));
            }
        };
        self.handshake(Socket::Unix(unix), "localhost").await
    }

    /// Startup and authentication over `socket` (TLS first when the URL asks and the server
    /// offers it), the connection's task spawned, `target_session_attrs` checked.
    async fn handshake(
        &self,
        socket: Socket,
        name: &str,
    ) -> Result<tokio_postgres::Client, StoreError> {
        let local = socket.is_local();
        let guarded = Guarded::new(socket);
        let negotiated = Arc::clone(&guarded.negotiated);
        let (client, connection): (tokio_postgres::Client, Driving) = if let Some(tls) = &self.tls {
            let hook = PgTlsConnect {
                config: Arc::clone(tls),
                name: name.to_owned(),
            };
            let (c, conn) = self
                .config
                .connect_raw(guarded, hook)
                .await
                .map_err(|e| self.err(&e))?;
            (c, Box::pin(conn))
        } else {
            let (c, conn) = self
                .config
                .connect_raw(guarded, tokio_postgres::NoTls)
                .await
                .map_err(|e| self.err(&e))?;
            (c, Box::pin(conn))
        };
        let secrets = self.secrets.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                let text = sandbox_core::error::outside_text(&pg_text(&e), &secrets);
                tracing::debug!(target: LOG_TARGET, error = %text, "admission store: connection ended");
            }
        });
        let transport = negotiated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or(if local {
                Transport::UnixSocket
            } else {
                Transport::PlainTcp
            });
        let wanted = self.config.get_target_session_attrs();
        if wanted != TargetSessionAttrs::Any {
            let rows = client
                .simple_query("SHOW transaction_read_only")
                .await
                .map_err(|e| self.err(&e))?;
            let read_only = rows.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "on"),
                _ => None,
            });
            let fits = match wanted {
                TargetSessionAttrs::ReadWrite => read_only == Some(false),
                TargetSessionAttrs::ReadOnly => read_only == Some(true),
                _ => true,
            };
            if !fits {
                return Err(StoreError(format!(
                    "postgres: {name} is not the session target_session_attrs asks for"
                )));
            }
        }
        *self
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(transport);
        Ok(client)
    }

    async fn conn(&self) -> Result<Arc<PgConn>, StoreError> {
        let mut held = self.conn.lock().await;
        if let Some(c) = held.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Arc::clone(c));
        }
        let client = self.open().await?;
        client
            .batch_execute(&pg_schema())
            .await
            .map_err(|e| self.err(&e))?;
        let prepare = |sql: String| {
            let client = &client;
            async move { client.prepare(&sql).await.map_err(|e| self.err(&e)) }
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

// ---------------------------------------------------------------------------------------------
// The socket, watched until the server says how it authenticates.

/// A password authentication that sends what an eavesdropper can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AuthMethod {
    /// `password`: the password itself.
    Cleartext,
    /// `md5`: a hash an eavesdropper can crack offline (and a server that chose the salt, too).
    Md5,
}

impl AuthMethod {
    /// The refusal, naming the setting (`source`) and the fixes.
    fn refusal(self, source: &str) -> String {
        let what = match self {
            AuthMethod::Cleartext => "the password in cleartext (`password` authentication)",
            AuthMethod::Md5 => "an MD5 hash of the password (`md5` authentication)",
        };
        format!(
            "postgres: the server asked for {what} over plain TCP; it was refused and nothing \
             was sent, since whoever listens on the way or answers at that address would get \
             it. Encrypt the connection: sslmode=require (or verify-full with \
             sslrootcert=/path/to/ca.pem) in {source}, with ssl = on in the server; or have the \
             server authenticate this role with scram-sha-256 (its pg_hba.conf line, and the \
             password set again under password_encryption = scram-sha-256)"
        )
    }
}

/// The error the watched socket reads when the server asks for a refused method.
#[derive(Debug)]
struct AuthRefused(AuthMethod);

impl std::fmt::Display for AuthRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} password authentication refused outside TLS",
            self.0
        )
    }
}

impl std::error::Error for AuthRefused {}

/// `SSLRequest`: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 4, 210, 22, 47];

/// What the watch waits for on a plain connection.
#[derive(Debug, Clone, Copy)]
enum Watch {
    /// Nothing written yet.
    Start,
    /// `SSLRequest` sent: the server's one-byte answer (`S`: TLS follows).
    SslAnswer,
    /// The first message of the server's authentication: `R`, its length, its code.
    Auth { head: [u8; 9], len: usize },
    /// TLS is on, or the method is known and allowed: nothing more is looked at.
    Done,
}

/// A TCP or Unix socket.
enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Socket {
    /// Whether it is a Unix socket: a connection on this machine (none exists on Windows).
    fn is_local(&self) -> bool {
        #[cfg(unix)]
        return matches!(self, Socket::Unix(_));
        #[cfg(not(unix))]
        return false;
    }
}

/// The socket tokio-postgres is given: it reads the server's first authentication request on a
/// plain TCP connection and fails the read when it asks for a refused method (the request is
/// never delivered, so the password is never sent).
struct Guarded {
    socket: Socket,
    watch: Watch,
    /// Set by the TLS hook once TLS is up (what it negotiated).
    negotiated: Arc<Mutex<Option<Transport>>>,
}

impl Guarded {
    fn new(socket: Socket) -> Self {
        let watch = if socket.is_local() {
            Watch::Done
        } else {
            Watch::Start
        };
        Self {
            socket,
            watch,
            negotiated: Arc::new(Mutex::new(None)),
        }
    }

    /// Reads `bytes`, the next the server sent; `Err` when they ask for a refused method.
    fn see(&mut self, bytes: &[u8]) -> Result<(), AuthRefused> {
        for &b in bytes {
            match self.watch {
                Watch::Done => return Ok(()),
                // The answer to `SSLRequest`: TLS follows (the hook ends the watch), or not.
                Watch::SslAnswer => {
                    self.watch = if b == b'S' {
                        Watch::Done
                    } else {
                        Watch::Auth {
                            head: [0; 9],
                            len: 0,
                        }
                    };
                }
                Watch::Start => {
                    self.watch = Watch::Auth {
                        head: [0; 9],
                        len: 0,
                    };
                    self.record(b)?;
                }
                Watch::Auth { .. } => self.record(b)?,
            }
        }
        Ok(())
    }

    /// One byte of the server's first message after the TLS negotiation.
    fn record(&mut self, b: u8) -> Result<(), AuthRefused> {
        let Watch::Auth { head, len } = &mut self.watch else {
            return Ok(());
        };
        head[*len] = b;
        *len += 1;
        if *len == 1 && b != b'R' {
            // Not an authentication request (an error): nothing to refuse.
            self.watch = Watch::Done;
        } else if *len == head.len() {
            let code = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            self.watch = Watch::Done;
            match code {
                3 => return Err(AuthRefused(AuthMethod::Cleartext)),
                5 => return Err(AuthRefused(AuthMethod::Md5)),
                _ => {}
            }
        }
        Ok(())
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = match &mut this.socket {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        };
        if let Poll::Ready(Ok(())) = polled
            && !matches!(this.watch, Watch::Done)
            && let Err(refused) = this.see(&buf.filled()[before..])
        {
            // Not delivered: tokio-postgres never reads the request, so it answers nothing.
            buf.set_filled(before);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                refused,
            )));
        }
        polled
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if matches!(this.watch, Watch::Start) {
            this.watch = if buf.starts_with(&SSL_REQUEST) {
                Watch::SslAnswer
            } else {
                Watch::Auth {
                    head: [0; 9],
                    len: 0,
                }
            };
        }
        match &mut this.socket {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.socket {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.socket {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// tokio-postgres over rustls.

/// tokio-postgres's TLS hook: one handshake with one host, through the store's one TLS stack
/// ([`crate::tls::handshake`]); what it negotiated is noted on the socket.
struct PgTlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: String,
}

impl tokio_postgres::tls::TlsConnect<Guarded> for PgTlsConnect {
    type Stream = PgTlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream>> + Send>>;

    fn connect(self, mut stream: Guarded) -> Self::Future {
        Box::pin(async move {
            stream.watch = Watch::Done;
            let negotiated = Arc::clone(&stream.negotiated);
            let (tls, transport) = crate::tls::handshake(self.config, &self.name, stream).await?;
            *negotiated.lock().unwrap_or_else(PoisonError::into_inner) = Some(transport);
            Ok(PgTlsStream(tls))
        })
    }
}

/// A PostgreSQL connection's TLS stream.
struct PgTlsStream(tokio_rustls::client::TlsStream<Guarded>);

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tokio_postgres::tls::TlsStream for PgTlsStream {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        // No tls-server-end-point binding: SCRAM authenticates as over plain TCP (libpq's
        // `channel_binding=prefer` falls back the same way).
        tokio_postgres::tls::ChannelBinding::none()
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
                .map_err(|e| self.err(&e))?;
            let granted: bool = row.try_get(0).map_err(|e| self.err(&e))?;
            let live: i64 = row.try_get(1).map_err(|e| self.err(&e))?;
            let waiting: i64 = row.try_get(2).map_err(|e| self.err(&e))?;
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
            let msgs = c
                .client
                .simple_query(&sql)
                .await
                .map_err(|e| self.err(&e))?;
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
                .map_err(|e| self.err(&e))?;
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
                .map_err(|e| self.err(&e))
        })
    }

    fn count<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let c = self.conn().await?;
            let row = c
                .client
                .query_one(&c.count, &[&key])
                .await
                .map_err(|e| self.err(&e))?;
            let n: i64 = row.try_get(0).map_err(|e| self.err(&e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn transport(&self) -> Option<Transport> {
        PostgresStore::transport(self)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that speaks just enough PostgreSQL to ask for `auth` (the `R` message's code
    /// and body) and reports every byte the client sent after its startup message.
    async fn asks_for(auth: Vec<u8>, answer_ssl: bool) -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut len = [0u8; 4];
            s.read_exact(&mut len).await.unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut body).await.unwrap();
            if body == SSL_REQUEST[4..] {
                assert!(answer_ssl, "no SSLRequest expected");
                s.write_all(b"N").await.unwrap();
                s.read_exact(&mut len).await.unwrap();
                let mut startup = vec![0u8; u32::from_be_bytes(len) as usize - 4];
                s.read_exact(&mut startup).await.unwrap();
            }
            let mut msg = vec![b'R'];
            msg.extend_from_slice(&u32::try_from(auth.len() + 4).unwrap().to_be_bytes());
            msg.extend_from_slice(&auth);
            s.write_all(&msg).await.unwrap();
            let mut after = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_millis(500), s.read_to_end(&mut after)).await;
            after
        });
        (port, task)
    }

    fn store(url: &str) -> PostgresStore {
        crate::install();
        let pairs = [(
            sandbox_core::lease::ENV_ADMISSION_STORE.to_owned(),
            url.to_owned(),
        )];
        let config = StoreConfig::from_lookup(&move |k| {
            pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
        .unwrap()
        .unwrap();
        PostgresStore::new(config).unwrap()
    }

    #[tokio::test]
    async fn cleartext_and_md5_are_refused_outside_tls_before_the_password_is_sent() {
        let cleartext = 3u32.to_be_bytes().to_vec();
        let mut md5 = 5u32.to_be_bytes().to_vec();
        md5.extend_from_slice(b"salt");
        for (auth, ssl, query, want) in [
            (cleartext.clone(), false, "sslmode=disable", "in cleartext"),
            (md5.clone(), false, "sslmode=disable", "MD5"),
            // The default (prefer) with a server that offers no TLS.
            (cleartext, true, "", "in cleartext"),
            (md5, true, "sslmode=prefer", "MD5"),
        ] {
            let (port, server) = asks_for(auth, ssl).await;
            let s = store(&format!(
                "postgres://lf:pw-never-sent@127.0.0.1:{port}/lf?{query}"
            ));
            let e = s.conn().await.map(|_| ()).unwrap_err();
            for part in [
                want,
                "sslmode=require",
                "scram-sha-256",
                "CREATEOS_ADMISSION_STORE",
            ] {
                assert!(e.0.contains(part), "{query}: {part}: {e}");
            }
            assert!(!e.0.contains("pw-never-sent"), "{e}");
            let after = server.await.unwrap();
            assert!(
                after.is_empty(),
                "{query}: the client answered the request: {:?}",
                String::from_utf8_lossy(&after)
            );
        }
    }

    #[tokio::test]
    async fn scram_goes_on_over_plain_tcp() {
        let mut sasl = 10u32.to_be_bytes().to_vec();
        sasl.extend_from_slice(b"SCRAM-SHA-256\0\0");
        let (port, server) = asks_for(sasl, false).await;
        let s = store(&format!(
            "postgres://lf:pw-secret@127.0.0.1:{port}/lf?sslmode=disable"
        ));
        // The fake stops after the request, so the connection fails, but only after the client
        // answered it with its SCRAM first message (which carries no password).
        let _ = s.conn().await;
        let after = server.await.unwrap();
        assert_eq!(after.first(), Some(&b'p'), "{after:?}");
        assert!(
            String::from_utf8_lossy(&after).contains("SCRAM-SHA-256"),
            "{after:?}"
        );
        assert!(!String::from_utf8_lossy(&after).contains("pw-secret"));
    }
}
