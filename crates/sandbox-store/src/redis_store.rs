//! The Redis store: leases as members of one sorted set per key, scored by their expiry.
//!
//! The connection is made here (TCP, then TLS through the store's one TLS stack,
//! [`crate::tls::handshake`], as the URL asks) and handed to the redis crate's multiplexed
//! connection, so both stores check certificates the same way and `doctor` can say what was
//! negotiated. A call that finds its connection gone reconnects and asks once more (every call
//! is idempotent: an acquire of the same id is the same lease).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex as AsyncMutex;

use sandbox_core::lease::tls::Transport;
use sandbox_core::lease::{
    Acquired, Ask, LeaseStore, Leases, STORE_CALL_TIMEOUT, StoreConfig, StoreError, StoreFuture,
    WAIT_TICKET,
};

use crate::ms;
use sandbox_core::error::Redactor;

// KEYS[1] the cap's leases, KEYS[2] its line of waiting runs (scored by arrival, ms), KEYS[3]
// the line's expiries (ms); ARGV cap, id, ttl, ticket (ms), queue (1: a refused run joins or
// stays in the line); then KEYS[i] / ARGV[i + 2] (i >= 4) the leases given back since the last
// acquire, removed first. A place is granted under the cap only to a run with fewer runs ahead
// of it in the line than places free (first come, first served across the deployment). Returns
// {granted, live, whether anyone waits in the line after the step}.
const REDIS_ACQUIRE: &str = r"
for i = 4, #KEYS do redis.call('ZREM', KEYS[i], ARGV[i + 2]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
local queued = redis.call('ZCARD', KEYS[2])
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl * 2 then redis.call('PEXPIRE', KEYS[1], ttl * 2) end
  return {1, n, queued}
end
local cap = tonumber(ARGV[1])
local rank = redis.call('ZRANK', KEYS[2], ARGV[2])
local ahead = rank or queued
if cap < 0 or (n < cap and ahead < cap - n) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl * 2 then redis.call('PEXPIRE', KEYS[1], ttl * 2) end
  if rank then
    redis.call('ZREM', KEYS[2], ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
    queued = queued - 1
  end
  return {1, n + 1, queued}
end
if ARGV[5] == '1' then
  local ticket = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[2], 'NX', now, ARGV[2])
  redis.call('ZADD', KEYS[3], now + ticket, ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ticket * 2)
  redis.call('PEXPIRE', KEYS[3], ticket * 2)
  if not rank then queued = queued + 1 end
end
return {0, n, queued}
";

const REDIS_RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local lost = {}
for i, key in ipairs(KEYS) do
  local id = ARGV[i + 1]
  local score = redis.call('ZSCORE', key, id)
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', now + ttl, id)
    if redis.call('PTTL', key) < ttl * 2 then redis.call('PEXPIRE', key, ttl * 2) end
  else
    if score then redis.call('ZREM', key, id) end
    table.insert(lost, id)
  end
end
return lost
";

const REDIS_COUNT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
";

/// The Redis store: one sorted set per key, members the lease ids scored by their expiry (ms,
/// the server's `TIME`). The key itself expires twice a lease after its last write, and its
/// expiry is only ever pushed later (a worker with a shorter lease never cuts another's). Keys
/// are not spread over a Redis Cluster (a renewal names several).
pub struct RedisStore {
    host: String,
    port: u16,
    /// The database, user and password (the redis crate's reading of the URL).
    settings: redis::RedisConnectionInfo,
    /// TLS (`None`: plain TCP, `redis://`).
    tls: Option<Arc<rustls::ClientConfig>>,
    conn: AsyncMutex<Option<redis::aio::MultiplexedConnection>>,
    /// What the last connection negotiated.
    transport: Mutex<Option<Transport>>,
    /// The URL's secrets, masked in every error.
    secrets: Redactor,
    acquire: redis::Script,
    renew: redis::Script,
    count: redis::Script,
}

/// A connection's stream, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

/// A call on a connection (a clone of the multiplexed handle).
type Call<'a, T> = Pin<Box<dyn Future<Output = redis::RedisResult<T>> + Send + 'a>>;

impl RedisStore {
    /// A store on `config`'s URL; connects on first use (and again after a failure).
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let client = redis::Client::open(config.connect_url())
            .map_err(|e| StoreError(format!("redis: not a usable Redis URL ({})", e.category())))?;
        let info = client.get_connection_info();
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
            _ => {
                return Err(StoreError(
                    "redis: only TCP (redis://, rediss://) is supported".into(),
                ));
            }
        };
        let tls = crate::tls::client_config(&config.tls)
            .map_err(|e| StoreError(format!("redis: {e}")))?;
        Ok(Self {
            host,
            port,
            settings: info.redis_settings().clone(),
            tls,
            conn: AsyncMutex::new(None),
            transport: Mutex::new(None),
            secrets: config.secrets().clone(),
            acquire: redis::Script::new(REDIS_ACQUIRE),
            renew: redis::Script::new(REDIS_RENEW),
            count: redis::Script::new(REDIS_COUNT),
        })
    }

    /// `e` as a store error: what the server or the connection said masked, cut and escaped,
    /// and the certificate hint.
    fn err(&self, e: &redis::RedisError) -> StoreError {
        // A RedisError's text names the command and the server's reply, never the URL.
        let text = sandbox_core::error::outside_text(&e.to_string(), &self.secrets);
        StoreError(crate::tls::explain(
            sandbox_core::lease::StoreKind::Redis,
            format!("redis: {text}"),
        ))
    }

    /// What the last connection negotiated (`None` before the first).
    pub fn transport(&self) -> Option<Transport> {
        self.transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn connect(&self) -> Result<redis::aio::MultiplexedConnection, StoreError> {
        let (host, port) = (self.host.as_str(), self.port);
        let tcp = match tokio::time::timeout(
            STORE_CALL_TIMEOUT,
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
        {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => {
                return Err(StoreError(format!(
                    "redis: cannot connect to {host}:{port} ({})",
                    outside_text::line(&e.to_string())
                )));
            }
            Err(_) => {
                return Err(StoreError(format!(
                    "redis: {host}:{port} did not take the connection within {} ms",
                    STORE_CALL_TIMEOUT.as_millis()
                )));
            }
        };
        let _ = tcp.set_nodelay(true);
        let (stream, transport): (Box<dyn Stream>, Transport) = match &self.tls {
            None => (Box::new(tcp), Transport::PlainTcp),
            Some(config) => {
                let (tls, transport) = crate::tls::handshake(Arc::clone(config), host, tcp)
                    .await
                    .map_err(|e| {
                    let text = sandbox_core::error::outside_text(&e.to_string(), &self.secrets);
                    StoreError(crate::tls::explain(
                        sandbox_core::lease::StoreKind::Redis,
                        format!("redis: TLS with {host}:{port} failed: {text}"),
                    ))
                })?;
                (Box::new(tls), transport)
            }
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(STORE_CALL_TIMEOUT))
            .set_response_timeout(Some(STORE_CALL_TIMEOUT));
        let (conn, driver) =
            redis::aio::MultiplexedConnection::new_with_config(&self.settings, stream, config)
                .await
                .map_err(|e| self.err(&e))?;
        tokio::spawn(driver);
        *self
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(transport);
        Ok(conn)
    }

    /// The connection held (or a new one), and whether it is new.
    async fn conn(&self) -> Result<(redis::aio::MultiplexedConnection, bool), StoreError> {
        let mut held = self.conn.lock().await;
        if let Some(c) = held.as_ref() {
            return Ok((c.clone(), false));
        }
        let c = self.connect().await?;
        *held = Some(c.clone());
        Ok((c, true))
    }

    /// `call` on the connection; when the connection failed it is dropped, and when it was not
    /// a new one, a new one is made and `call` made once more.
    async fn run<'a, T>(
        &'a self,
        call: impl Fn(redis::aio::MultiplexedConnection) -> Call<'a, T>,
    ) -> Result<T, StoreError> {
        let (c, fresh) = self.conn().await?;
        match call(c).await {
            Ok(v) => Ok(v),
            Err(e) if broken(&e) => {
                *self.conn.lock().await = None;
                if fresh {
                    return Err(self.err(&e));
                }
                let (c, _) = self.conn().await?;
                let again = call(c).await;
                if again.as_ref().is_err_and(broken) {
                    *self.conn.lock().await = None;
                }
                again.map_err(|e| self.err(&e))
            }
            Err(e) => Err(self.err(&e)),
        }
    }
}

/// Whether `e` says the connection is gone (not a reply from the server).
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout()
}

impl LeaseStore for RedisStore {
    fn try_acquire<'a>(&'a self, ask: Ask<'a>, release: &'a Leases) -> StoreFuture<'a, Acquired> {
        Box::pin(async move {
            let cap = ask.cap.map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX));
            let queue_key = format!("{}:line", ask.key);
            let mut inv = self.acquire.prepare_invoke();
            inv.key(ask.key)
                .key(&queue_key)
                .key(format!("{queue_key}:exp"))
                .arg(cap)
                .arg(ask.id)
                .arg(ms(ask.ttl))
                .arg(ms(WAIT_TICKET))
                .arg(u8::from(ask.queue));
            for (key, id) in release {
                inv.key(key).arg(id);
            }
            let inv = &inv;
            let (granted, live, waiting): (i64, u64, u64) = self
                .run(|mut c| Box::pin(async move { inv.invoke_async(&mut c).await }))
                .await?;
            Ok(Acquired {
                granted: granted == 1,
                live,
                waiting,
            })
        })
    }

    fn renew<'a>(&'a self, leases: &'a Leases, ttl: Duration) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            if leases.is_empty() {
                return Ok(Vec::new());
            }
            let mut inv = self.renew.prepare_invoke();
            inv.arg(ms(ttl));
            for (key, id) in leases {
                inv.key(key).arg(id);
            }
            let inv = &inv;
            self.run(|mut c| Box::pin(async move { inv.invoke_async(&mut c).await }))
                .await
        })
    }

    fn release<'a>(&'a self, leases: &'a Leases) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if leases.is_empty() {
                return Ok(());
            }
            let mut pipe = redis::pipe();
            for (key, id) in leases {
                pipe.cmd("ZREM").arg(key).arg(id).ignore();
            }
            let pipe = &pipe;
            self.run(|mut c| Box::pin(async move { pipe.query_async::<()>(&mut c).await }))
                .await
        })
    }

    fn leave_line<'a>(&'a self, key: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let line = format!("{key}:line");
            let mut pipe = redis::pipe();
            pipe.cmd("ZREM")
                .arg(&line)
                .arg(id)
                .ignore()
                .cmd("ZREM")
                .arg(format!("{line}:exp"))
                .arg(id)
                .ignore();
            let pipe = &pipe;
            self.run(|mut c| Box::pin(async move { pipe.query_async::<()>(&mut c).await }))
                .await
        })
    }

    fn count<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let mut inv = self.count.prepare_invoke();
            inv.key(key);
            let inv = &inv;
            self.run(|mut c| Box::pin(async move { inv.invoke_async(&mut c).await }))
                .await
        })
    }

    fn transport(&self) -> Option<Transport> {
        RedisStore::transport(self)
    }
}
