//! The Redis store: leases as members of one sorted set per key, scored by their expiry.

use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;

use super::{
    Acquired, Ask, LeaseStore, Leases, STORE_CALL_TIMEOUT, StoreConfig, StoreError, StoreFuture,
    WAIT_TICKET, ms,
};

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
/// expiry is only ever pushed later (a worker with a shorter lease never cuts another's). Keys are not spread over a Redis Cluster (a renewal names several).
pub struct RedisStore {
    client: redis::Client,
    conn: AsyncMutex<Option<redis::aio::ConnectionManager>>,
    acquire: redis::Script,
    renew: redis::Script,
    count: redis::Script,
}

fn redis_err(e: &redis::RedisError) -> StoreError {
    // A RedisError's text names the command and the server's reply, never the URL.
    StoreError(super::tls::explain(
        super::StoreKind::Redis,
        format!("redis: {e}"),
    ))
}

impl RedisStore {
    /// A store on `config`'s URL; connects on first use (and again after a failure).
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let url = config.connect_url();
        let client = match &config.tls.roots {
            // The certificate is checked against these roots (redis-py's ssl_ca_certs).
            super::tls::Roots::File { pem, .. }
                if config.tls.mode != super::tls::TlsMode::Require =>
            {
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem.clone()),
                    },
                )
            }
            // redis:// (plain), rediss:// checked against the system's roots, or #insecure.
            _ => redis::Client::open(url),
        }
        .map_err(|e| StoreError(format!("redis: not a usable Redis URL ({})", e.category())))?;
        Ok(Self {
            client,
            conn: AsyncMutex::new(None),
            acquire: redis::Script::new(REDIS_ACQUIRE),
            renew: redis::Script::new(REDIS_RENEW),
            count: redis::Script::new(REDIS_COUNT),
        })
    }

    async fn conn(&self) -> Result<redis::aio::ConnectionManager, StoreError> {
        let mut held = self.conn.lock().await;
        if let Some(c) = held.as_ref() {
            return Ok(c.clone());
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(STORE_CALL_TIMEOUT))
            .set_response_timeout(Some(STORE_CALL_TIMEOUT))
            .set_number_of_retries(1);
        let c = redis::aio::ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|e| redis_err(&e))?;
        *held = Some(c.clone());
        Ok(c)
    }
}

impl LeaseStore for RedisStore {
    fn try_acquire<'a>(&'a self, ask: Ask<'a>, release: &'a Leases) -> StoreFuture<'a, Acquired> {
        Box::pin(async move {
            let mut c = self.conn().await?;
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
            let (granted, live, waiting): (i64, u64, u64) =
                inv.invoke_async(&mut c).await.map_err(|e| redis_err(&e))?;
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
            let mut c = self.conn().await?;
            let mut inv = self.renew.prepare_invoke();
            inv.arg(ms(ttl));
            for (key, id) in leases {
                inv.key(key).arg(id);
            }
            inv.invoke_async(&mut c).await.map_err(|e| redis_err(&e))
        })
    }

    fn release<'a>(&'a self, leases: &'a Leases) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if leases.is_empty() {
                return Ok(());
            }
            let mut c = self.conn().await?;
            let mut pipe = redis::pipe();
            for (key, id) in leases {
                pipe.cmd("ZREM").arg(key).arg(id).ignore();
            }
            pipe.query_async::<()>(&mut c)
                .await
                .map_err(|e| redis_err(&e))
        })
    }

    fn leave_line<'a>(&'a self, key: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            let line = format!("{key}:line");
            redis::pipe()
                .cmd("ZREM")
                .arg(&line)
                .arg(id)
                .ignore()
                .cmd("ZREM")
                .arg(format!("{line}:exp"))
                .arg(id)
                .ignore()
                .query_async::<()>(&mut c)
                .await
                .map_err(|e| redis_err(&e))
        })
    }

    fn count<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            self.count
                .key(key)
                .invoke_async(&mut c)
                .await
                .map_err(|e| redis_err(&e))
        })
    }
}
