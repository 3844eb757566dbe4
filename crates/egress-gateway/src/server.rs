//! The proxy itself: accept, admit, then tunnel (`CONNECT`) or forward (plain HTTP).
//!
//! Each accepted connection carries one request: `CONNECT host:port`, after which it is a
//! tunnel, or one absolute-form `http://` request, after which it is closed (no keep-alive, so
//! every request is admitted on its own and every connection gets one log record). A request is
//! admitted in this order: a target the gateway can read, a valid credential
//! (`Proxy-Authorization`), a host and port its allowlist names, room under the credential's
//! limits, a name that resolves to at least one public address, and a connection to one. A
//! `CONNECT` tunnel must then start with a TLS `ClientHello` whose `server_name` is the
//! `CONNECT` host and that does not offer Encrypted Client Hello; should the server answer it
//! with a `HelloRetryRequest`, the client's second hello is held to the same checks before it is
//! passed on. After that the bytes are copied untouched, metered against the credential's
//! byte budget as they pass, until either side closes, the connection is idle too long, or it
//! reaches its maximum lifetime.
//!
//! When every connection slot is taken and another connection arrives, the one that has waited
//! longest without sending a complete request head is closed to make room (reason `evicted`):
//! a connection that has not yet shown a credential cannot hold a slot against the guests that
//! have, so a flood of idle or slow connections does not lock the others out. A connection is
//! evictable from the moment it is accepted (not when its task first runs), so a burst accepted
//! back to back makes room as well. Connections past their request head are bounded per
//! credential instead, and are never evicted.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::addr::{forbidden_reason, is_own_address};
use crate::allowlist::{Decision, HostError, normalize_host};
use crate::config::{GatewayConfig, Resolver};
use crate::tls::{
    AfterRetry, ClientHello, HelloError, MAX_HELLO_BYTES, RetryWatch, after_retry,
    parse_client_hello,
};
use crate::token::{Credential, TokenError, verify};

/// The realm of the `Proxy-Authenticate` challenge.
const REALM: &str = "Basic realm=\"createos-egress-gateway\"";
/// The response header naming why a request was refused (the log record's `reason`).
pub const REASON_HEADER: &str = "x-egress-gateway-reason";
/// A fatal TLS `access_denied` alert, sent on a tunnel whose `ClientHello` is refused.
const TLS_ACCESS_DENIED: [u8; 7] = [21, 3, 3, 0, 2, 2, 49];
/// Copy buffer of a tunnel, client to upstream (uploads are small: requests, hellos).
const UP_BUFFER: usize = 16 * 1024;
/// Copy buffer of a tunnel, upstream to client (downloads: wheels, archives).
const DOWN_BUFFER: usize = 64 * 1024;
/// The most addresses of one name tried in turn.
const MAX_ADDRESSES_TRIED: usize = 4;
/// The longest requested host the log record shows (escaped), in bytes of the request.
const MAX_LOGGED_HOST: usize = 255;

type Body = BoxBody<Bytes, hyper::Error>;

/// Serves `listener` with `config` until the returned future is dropped.
pub async fn serve(listener: TcpListener, config: GatewayConfig) {
    serve_until(listener, config, std::future::pending()).await;
}

/// Serves `listener` with `config` until `shutdown` completes; then stops accepting (open
/// connections keep running on the runtime until they end or the runtime stops).
pub async fn serve_until<F>(listener: TcpListener, config: GatewayConfig, shutdown: F)
where
    F: Future<Output = ()>,
{
    let slots = Arc::new(Semaphore::new(connection_slots(config.max_connections)));
    let shared = Arc::new(Shared::new(config));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors, or a connection reset before it was accepted: wait a
                // little rather than spin.
                tracing::warn!(target: "egress_gateway", error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let permit = if let Ok(permit) = Arc::clone(&slots).try_acquire_owned() {
            permit
        } else {
            // Full: close the connection that has waited longest without a request head and
            // take the slot it frees. Every connection holding a slot is evictable from its
            // accept until its head is in (a burst accepted back to back too, before any of its
            // tasks has run), and an evicted one always ends promptly, so this wait is short.
            // With none to evict, every slot is past its head (no new one joins while this
            // loop waits), and this connection waits for one to end.
            shared.evict_oldest_pending();
            tokio::select! {
                () = &mut shutdown => return,
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return, // the semaphore is never closed
                },
            }
        };
        let pending = shared.add_pending();
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(
            Arc::clone(&shared),
            stream,
            peer,
            permit,
            pending,
        ));
    }
}

/// Descriptors kept for everything but connections (the listener, stdio, the runtime, ...).
const RESERVED_FILES: u64 = 64;
/// Descriptors one connection may hold at once: the client's, the upstream's, and the socket
/// of the own-address check while it connects.
const FILES_PER_CONNECTION: u64 = 3;

/// How many connections to serve at once: `wanted`, or fewer when this process may not open
/// the files they need (its soft `RLIMIT_NOFILE`, read from `/proc/self/limits`), with a
/// warning. Past the descriptor limit `accept` fails and no connection can be evicted to make
/// room, so the cap must be reached first.
fn connection_slots(wanted: usize) -> usize {
    let wanted = wanted.max(1);
    let Some(limit) = open_files_limit() else {
        return wanted;
    };
    let fit = usize::try_from(limit.saturating_sub(RESERVED_FILES) / FILES_PER_CONNECTION)
        .unwrap_or(usize::MAX)
        .max(1);
    if fit < wanted {
        tracing::warn!(
            target: "egress_gateway",
            max_connections = wanted,
            open_files_limit = limit,
            serving_at_most = fit,
            "--max-connections needs more open files than this process may have: serving fewer at once (raise the limit, e.g. `ulimit -n`, to serve more)"
        );
        fit
    } else {
        wanted
    }
}

/// This process's soft limit on open files (`Max open files` in `/proc/self/limits`); `None`
/// when unknown or unlimited.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().find_map(|w| w.parse::<u64>().ok())
}

/// Process-wide state: the settings, the per-credential counters and the connections that have
/// not sent a request head yet.
struct Shared {
    config: GatewayConfig,
    creds: Mutex<HashMap<[u8; 32], Arc<CredState>>>,
    last_sweep: Mutex<Instant>,
    /// Connections still reading their request head, oldest first: what makes room when every
    /// slot is taken (a notified connection closes).
    pending: Mutex<BTreeMap<u64, Arc<Notify>>>,
    next_seq: AtomicU64,
    /// Answer a request whose client has already shut down its sending side (hyper's
    /// `half_close`): off for real connections (hyper's default), on in the fuzzing harness,
    /// which sends its input and closes.
    half_close: bool,
}

/// A connection's entry in [`Shared::pending`]: its number, and what tells it to close.
struct Pending {
    seq: u64,
    evicted: Arc<Notify>,
}

/// The counters of one credential (one token), kept while it is valid or in use.
struct CredState {
    active: AtomicU32,
    bytes: AtomicU64,
    expires_at: SystemTime,
}

/// One open connection counted against a credential; released when dropped.
struct CredSlot(Arc<CredState>);

impl Drop for CredSlot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn new(config: GatewayConfig) -> Self {
        Self {
            config,
            creds: Mutex::new(HashMap::new()),
            last_sweep: Mutex::new(Instant::now()),
            pending: Mutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(0),
            half_close: false,
        }
    }

    /// Registers a connection just accepted as waiting for its request head (evictable from
    /// now on); returns its number and what tells it to close.
    fn add_pending(&self) -> Pending {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let evicted = Arc::new(Notify::new());
        lock(&self.pending).insert(seq, Arc::clone(&evicted));
        Pending { seq, evicted }
    }

    /// The connection `seq` has its request head (or has ended): it is no longer evictable.
    /// Whether it still was, i.e. was not evicted meanwhile.
    fn pending_done(&self, seq: u64) -> bool {
        lock(&self.pending).remove(&seq).is_some()
    }

    /// Tells the oldest connection still waiting for its request head to close; whether there
    /// was one.
    fn evict_oldest_pending(&self) -> bool {
        let oldest = lock(&self.pending).pop_first();
        oldest.is_some_and(|(_, evicted)| {
            evicted.notify_one();
            true
        })
    }

    /// The counters of `cred`, created on first use; expired, unused entries are dropped from
    /// time to time so the table holds only live credentials.
    fn cred_state(&self, cred: &Credential) -> Arc<CredState> {
        let mut creds = lock(&self.creds);
        let mut last = lock(&self.last_sweep);
        if last.elapsed() > Duration::from_secs(30) {
            let now = SystemTime::now();
            creds.retain(|_, st| st.expires_at > now || st.active.load(Ordering::Acquire) > 0);
            *last = Instant::now();
        }
        drop(last);
        Arc::clone(creds.entry(cred.id()).or_insert_with(|| {
            Arc::new(CredState {
                active: AtomicU32::new(0),
                bytes: AtomicU64::new(0),
                expires_at: cred.expires_at,
            })
        }))
    }
}

/// The log record of one connection, filled in as it goes and emitted when the last holder
/// (the connection, its tunnel or its upstream half) drops it.
struct ConnCtx {
    started: Instant,
    peer: SocketAddr,
    /// Milliseconds since `started` of the last byte moved to or from the upstream.
    last_active_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    /// A request was read (a connection that never sends one is logged at debug level).
    had_request: AtomicBool,
    /// Its number in [`Shared::pending`] while it waits for its request head.
    seq: u64,
    record: Mutex<Record>,
    /// The gateway-wide connection slot, held for the connection's whole life.
    _permit: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Record {
    kind: &'static str,
    guest: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    upstream: Option<SocketAddr>,
    admitted: bool,
    refused: Option<&'static str>,
    ended: Option<&'static str>,
    slot: Option<CredSlot>,
}

impl ConnCtx {
    fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.record)
    }

    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active_ms.store(ms, Ordering::Release);
    }

    /// Marks the connection refused (the first reason wins).
    fn refuse(&self, reason: &'static str) {
        let mut r = self.record();
        if r.refused.is_none() {
            r.refused = Some(reason);
        }
    }

    /// Notes how an admitted connection ended (the first reason wins).
    fn end(&self, reason: &'static str) {
        let mut r = self.record();
        if r.ended.is_none() {
            r.ended = Some(reason);
        }
    }
}

impl Drop for ConnCtx {
    fn drop(&mut self) {
        let r = self
            .record
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let verdict = if r.admitted && r.refused.is_none() {
            "allowed"
        } else {
            "refused"
        };
        let reason =
            r.refused
                .or(r.ended)
                .unwrap_or(if r.admitted { "closed" } else { "no_request" });
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let guest = r.guest.as_deref().unwrap_or("-");
        let host = r.host.as_deref().unwrap_or("-");
        let port = r.port.map_or_else(|| "-".to_owned(), |p| p.to_string());
        let upstream = r.upstream.map_or_else(|| "-".to_owned(), |a| a.to_string());
        let kind = if r.kind.is_empty() { "-" } else { r.kind };
        let (up, down) = (*self.up.get_mut(), *self.down.get_mut());
        macro_rules! record {
            ($level:expr) => {
                tracing::event!(
                    target: "egress_gateway::connection",
                    $level,
                    peer = %self.peer,
                    guest = %guest,
                    kind = %kind,
                    host = %host,
                    port = %port,
                    upstream = %upstream,
                    bytes_up = up,
                    bytes_down = down,
                    duration_ms,
                    verdict = %verdict,
                    reason = %reason,
                    "connection"
                )
            };
        }
        if *self.had_request.get_mut() {
            record!(tracing::Level::INFO);
        } else {
            record!(tracing::Level::DEBUG);
        }
    }
}

/// Serves one accepted connection (a TCP stream, or any byte stream in the fuzzing harness),
/// registered as [`Pending`] when it was accepted.
async fn connection<S>(
    shared: Arc<Shared>,
    stream: S,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    Pending { seq, evicted }: Pending,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &shared.config;
    let ctx = Arc::new(ConnCtx {
        started: Instant::now(),
        peer,
        last_active_ms: AtomicU64::new(0),
        up: AtomicU64::new(0),
        down: AtomicU64::new(0),
        had_request: AtomicBool::new(false),
        seq,
        record: Mutex::new(Record::default()),
        _permit: permit,
    });
    let service = {
        let (shared, ctx) = (Arc::clone(&shared), Arc::clone(&ctx));
        hyper::service::service_fn(move |req| handle(Arc::clone(&shared), Arc::clone(&ctx), req))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.handshake_timeout)
        .keep_alive(false)
        .half_close(shared.half_close)
        .max_buf_size(cfg.max_request_head_bytes.max(8192));
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let deadline = tokio::time::Instant::from_std(ctx.started + cfg.max_connection_lifetime);
    tokio::select! {
        result = conn => {
            if let Err(err) = result {
                if ctx.had_request.load(Ordering::Acquire) {
                    ctx.end("client_error");
                } else if err.is_timeout() {
                    ctx.refuse("head_timeout");
                } else if err.is_parse() || err.is_parse_too_large() {
                    ctx.had_request.store(true, Ordering::Release);
                    ctx.refuse("bad_request");
                }
            }
        }
        () = idle(&ctx, cfg.idle_timeout) => ctx.end("idle_timeout"),
        () = tokio::time::sleep_until(deadline) => ctx.end("lifetime"),
        () = evicted.notified() => ctx.refuse("evicted"),
    }
    shared.pending_done(seq);
}

/// Completes once nothing moved to or from the upstream for `limit`.
async fn idle(ctx: &ConnCtx, limit: Duration) {
    loop {
        let last = Duration::from_millis(ctx.last_active_ms.load(Ordering::Acquire));
        let due = ctx.started + last + limit;
        if Instant::now() >= due {
            return;
        }
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
    }
}

/// Why a request was not admitted: its status, the `reason` code of the log record, a reason
/// phrase and a message for the client.
struct Refusal {
    status: StatusCode,
    code: &'static str,
    phrase: &'static [u8],
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let phrase: &'static [u8] = match code {
            "no_credentials" | "bad_credentials" => {
                b"Proxy Authentication Required (egress gateway: no valid credential)"
            }
            "token_expired" => {
                b"Proxy Authentication Required (egress gateway: credential expired)"
            }
            "host_not_allowed" => b"Forbidden (egress gateway: host not in this run's allowlist)",
            "port_not_allowed" => b"Forbidden (egress gateway: port not allowed for this host)",
            "ip_literal" => b"Forbidden (egress gateway: connect by host name, not by address)",
            "forbidden_address" => {
                b"Forbidden (egress gateway: host resolves to a non-public address)"
            }
            "byte_limit" => b"Forbidden (egress gateway: byte limit of this run reached)",
            "connection_limit" => {
                b"Too Many Requests (egress gateway: connection limit of this run reached)"
            }
            "resolve_failed" => b"Bad Gateway (egress gateway: host name does not resolve)",
            "connect_failed" => b"Bad Gateway (egress gateway: cannot connect to the host)",
            "upstream_error" => b"Bad Gateway (egress gateway: upstream failed)",
            "connect_timeout" => b"Gateway Timeout (egress gateway: host did not answer in time)",
            "evicted" => b"Service Unavailable (egress gateway: connection evicted)",
            _ => b"Bad Request (egress gateway: not a proxy request it serves)",
        };
        Self {
            status,
            code,
            phrase,
            message: message.into(),
        }
    }

    fn response(&self) -> Response<Body> {
        let mut resp = Response::new(full(format!("egress-gateway: {}\n", self.message)));
        *resp.status_mut() = self.status;
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(REASON_HEADER, HeaderValue::from_static(self.code));
        if self.status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            headers.insert(header::PROXY_AUTHENTICATE, HeaderValue::from_static(REALM));
        }
        resp.extensions_mut()
            .insert(ReasonPhrase::from_static(self.phrase));
        resp
    }
}

fn full(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

/// One request: admitted or refused; a `CONNECT` then becomes a tunnel, anything else is
/// forwarded.
async fn handle(
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    ctx.had_request.store(true, Ordering::Release);
    if !shared.pending_done(ctx.seq) {
        // Evicted as its head came in: it ends here (its slot is already promised to a
        // newcomer), whatever it asks for.
        ctx.refuse("evicted");
        let refusal = Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "evicted",
            "the gateway needed this connection's place: it had waited longest without a request",
        );
        return Ok(refusal.response());
    }
    let connect = req.method() == Method::CONNECT;
    ctx.record().kind = if connect { "connect" } else { "http" };
    if let Err(refusal) = framing(&req) {
        ctx.record().host = raw_host(&req);
        ctx.refuse(refusal.code);
        return Ok(refusal.response());
    }
    let admitted = match admit(&shared, &ctx, &req).await {
        Ok(admitted) => admitted,
        Err(refusal) => {
            ctx.refuse(refusal.code);
            return Ok(refusal.response());
        }
    };
    if connect {
        tokio::spawn(tunnel(shared, ctx, req, admitted));
        let mut ok = Response::new(Empty::new().map_err(|never| match never {}).boxed());
        *ok.status_mut() = StatusCode::OK;
        return Ok(ok);
    }
    Ok(match forward(&shared, &ctx, req, admitted).await {
        Ok(resp) => resp,
        Err(refusal) => {
            ctx.refuse(refusal.code);
            refusal.response()
        }
    })
}

/// An admitted request: the upstream connection and what it is metered against.
struct Admitted {
    upstream: TcpStream,
    host: String,
    port: u16,
    cred: Arc<CredState>,
    /// The credential's expiry: an open connection ends with it.
    expires_at: SystemTime,
}

/// Refuses a request whose message framing two parsers could read differently (the ground of
/// request smuggling): `Content-Length` beside `Transfer-Encoding`, a transfer coding other than
/// one `chunked`, more than one length, and any content on a `CONNECT`, which has none.
fn framing<B>(req: &Request<B>) -> Result<(), Refusal> {
    let bad = |msg: &str| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", msg);
    let headers = req.headers();
    let lengths: Vec<&HeaderValue> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
    let codings: Vec<&HeaderValue> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
    if !lengths.is_empty() && !codings.is_empty() {
        return Err(bad("Content-Length and Transfer-Encoding together"));
    }
    if lengths.len() > 1
        || lengths
            .first()
            .is_some_and(|v| !v.as_bytes().iter().all(u8::is_ascii_digit) || v.is_empty())
    {
        return Err(bad("one Content-Length, a number"));
    }
    if codings.len() > 1
        || codings
            .first()
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"chunked"))
    {
        return Err(bad("the only transfer coding accepted is one `chunked`"));
    }
    if req.method() == Method::CONNECT
        && (!codings.is_empty() || lengths.first().is_some_and(|v| v.as_bytes() != b"0"))
    {
        return Err(bad("a CONNECT request has no content"));
    }
    Ok(())
}

/// The port of an authority, strictly: one to five digits, not zero (no sign, no spaces).
/// `None` when the authority names no port (or an empty one).
fn strict_port(authority: &hyper::http::uri::Authority) -> Result<Option<u16>, ()> {
    let Some(port) = authority.port() else {
        return Ok(None);
    };
    let text = port.as_str();
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(()),
        Ok(port) => Ok(Some(port)),
    }
}

/// The host a request names, as it was sent, escaped for the log record (for refusals of a
/// host that is not a name): every byte outside `A-Z a-z 0-9 . - _ : [ ]` as `\xNN`, cut at
/// [`MAX_LOGGED_HOST`] bytes (`...` then).
fn raw_host<B>(req: &Request<B>) -> Option<String> {
    let host = req.uri().authority()?.host();
    let mut out = String::with_capacity(host.len().min(MAX_LOGGED_HOST));
    for &b in host.as_bytes().iter().take(MAX_LOGGED_HOST) {
        if b.is_ascii_alphanumeric() || b".-_:[]".contains(&b) {
            out.push(char::from(b));
        } else {
            use std::fmt::Write as _;
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if host.len() > MAX_LOGGED_HOST {
        out.push_str("...");
    }
    Some(out)
}

/// The host and port a request asks for, with the host normalised.
fn target<B>(req: &Request<B>) -> Result<(String, u16), Refusal> {
    let bad = |msg: &str| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", msg);
    let uri = req.uri();
    let (host, port) = if req.method() == Method::CONNECT {
        // Authority form only (RFC 9110 §9.3.6): no scheme, no path, no user information.
        if uri.scheme().is_some() || uri.path_and_query().is_some() {
            return Err(bad("CONNECT takes host:port, not a URL"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| bad("CONNECT needs host:port"))?;
        if authority.as_str().contains('@') {
            return Err(bad("user information in a CONNECT target is not a host"));
        }
        let port = strict_port(authority)
            .ok()
            .flatten()
            .ok_or_else(|| bad("CONNECT needs host:port, the port a number from 1 to 65535"))?;
        (authority.host(), port)
    } else {
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "send https:// requests through a CONNECT tunnel (HTTPS_PROXY), not to the proxy",
                ));
            }
            _ => {
                return Err(bad(
                    "this is an egress proxy: it serves CONNECT host:port and absolute http:// requests",
                ));
            }
        }
        let authority = uri.authority().ok_or_else(|| bad("the URL has no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("user information in the URL is not forwarded"));
        }
        let port = strict_port(authority)
            .map_err(|()| bad("the port must be a number from 1 to 65535"))?
            .unwrap_or(80);
        (authority.host(), port)
    };
    if port == 0 {
        return Err(bad("port 0"));
    }
    match normalize_host(host) {
        Ok(host) => Ok((host, port)),
        Err(HostError::IpLiteral) => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "ip_literal",
            "the allowlist names hosts: connect by host name, not by address",
        )),
        Err(_) => Err(bad("the host is not a valid DNS name")),
    }
}

/// The credential of a request, from `Proxy-Authorization: Basic base64(user:token)` (the
/// token is the password, or the user name when the password is empty).
fn credential<B>(shared: &Shared, req: &Request<B>) -> Result<Credential, Refusal> {
    let auth = |code: &'static str, msg: &str| {
        Refusal::new(StatusCode::PROXY_AUTHENTICATION_REQUIRED, code, msg)
    };
    let mut values = req.headers().get_all(header::PROXY_AUTHORIZATION).iter();
    let value = values.next().ok_or_else(|| {
        auth(
            "no_credentials",
            "proxy credentials required (HTTPS_PROXY=http://run:TOKEN@gateway:port)",
        )
    })?;
    let malformed = || auth("bad_credentials", "malformed Proxy-Authorization");
    if values.next().is_some() {
        return Err(malformed());
    }
    let text = value.to_str().map_err(|_| malformed())?;
    let (scheme, encoded) = text.trim().split_once(' ').ok_or_else(malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(malformed());
    }
    let decoded = STANDARD.decode(encoded.trim()).map_err(|_| malformed())?;
    let pair = std::str::from_utf8(&decoded).map_err(|_| malformed())?;
    let (user, password) = pair.split_once(':').unwrap_or((pair, ""));
    let token = if password.is_empty() { user } else { password };
    verify(&shared.config.secret, token, SystemTime::now()).map_err(|err| match err {
        TokenError::Expired => auth("token_expired", "the credential has expired"),
        _ => auth("bad_credentials", "the credential is not valid"),
    })
}

/// Runs every admission check and connects; `Err` is the answer to send instead.
async fn admit(
    shared: &Shared,
    ctx: &ConnCtx,
    req: &Request<Incoming>,
) -> Result<Admitted, Refusal> {
    let target = target(req);
    {
        let mut r = ctx.record();
        match &target {
            Ok((host, port)) => {
                r.host = Some(host.clone());
                r.port = Some(*port);
            }
            // What was asked for, escaped: an address, or something that is not a name.
            Err(_) => r.host = raw_host(req),
        }
    }
    let cred = credential(shared, req)?;
    ctx.record().guest = Some(cred.guest.clone());
    let (host, port) = target?;
    match cred.allowlist.decide(&host, port) {
        Decision::Allowed => {}
        Decision::HostNotAllowed => {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!("{host} is not in this run's allowlist"),
            ));
        }
        Decision::PortNotAllowed => {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "port_not_allowed",
                format!("port {port} is not allowed for {host}"),
            ));
        }
    }
    let cfg = &shared.config;
    let state = shared.cred_state(&cred);
    if state.bytes.load(Ordering::Acquire) >= cfg.max_bytes_per_credential {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "byte_limit",
            "this run has used its byte budget",
        ));
    }
    let limit = cfg.max_connections_per_credential;
    let took = state
        .active
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .is_ok();
    if !took {
        return Err(Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            "connection_limit",
            format!("this run already has {limit} connections open"),
        ));
    }
    ctx.record().slot = Some(CredSlot(Arc::clone(&state)));
    let (upstream, addr) = tokio::time::timeout(cfg.connect_timeout, connect(cfg, &host, port))
        .await
        .map_err(|_| {
            Refusal::new(
                StatusCode::GATEWAY_TIMEOUT,
                "connect_timeout",
                format!("{host} did not answer in time"),
            )
        })??;
    let mut r = ctx.record();
    r.upstream = Some(addr);
    r.admitted = true;
    drop(r);
    Ok(Admitted {
        upstream,
        host,
        port,
        cred: state,
        expires_at: cred.expires_at,
    })
}

/// Resolves `host`, keeps only public addresses and connects to the first that answers.
async fn connect(
    cfg: &GatewayConfig,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr), Refusal> {
    let unresolved = || {
        Refusal::new(
            StatusCode::BAD_GATEWAY,
            "resolve_failed",
            format!("{host} does not resolve"),
        )
    };
    let resolved: Vec<IpAddr> = match &cfg.resolver {
        Resolver::TestOnly(map) => map.get(host).cloned().unwrap_or_default(),
        // The trailing dot makes the name absolute: no search domain is ever appended.
        Resolver::System => tokio::net::lookup_host((format!("{host}."), port))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .unwrap_or_default(),
    };
    if resolved.is_empty() {
        return Err(unresolved());
    }
    let mut public = Vec::new();
    let mut refused = None;
    for ip in resolved {
        match forbidden_reason(ip) {
            None if public.contains(&ip) => {}
            // A public address of the gateway's own host: its own services, itself included.
            None if is_own_address(ip) => {
                refused = refused.or(Some("host-local (one of the gateway's own)"));
            }
            None => public.push(ip),
            Some(why) => refused = refused.or(Some(why)),
        }
    }
    if public.is_empty() {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "forbidden_address",
            format!(
                "{host} resolves to a {} address, which the gateway never connects to",
                refused.unwrap_or("non-public")
            ),
        ));
    }
    let mut last_err = None;
    for ip in public.into_iter().take(MAX_ADDRESSES_TRIED) {
        let addr = SocketAddr::new(ip, port);
        match TcpStream::connect(addr).await {
            // The kernel reached this host itself after all (a route changed since the
            // check): the connection is dropped before a byte is sent.
            Ok(stream) if stream.local_addr().is_ok_and(|local| local.ip() == ip) => {
                return Err(Refusal::new(
                    StatusCode::FORBIDDEN,
                    "forbidden_address",
                    format!("{host} resolves to an address of the gateway's own host"),
                ));
            }
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, addr));
            }
            Err(err) => last_err = Some(err),
        }
    }
    Err(Refusal::new(
        StatusCode::BAD_GATEWAY,
        "connect_failed",
        format!(
            "cannot connect to {host}:{port}: {}",
            last_err.map_or_else(String::new, |e| e.to_string())
        ),
    ))
}

/// An upstream connection that counts, meters and timestamps every byte it moves.
///
/// Each read and write first reserves room in the credential's byte budget and returns what it
/// did not use, so the budget holds across all the credential's connections at once, while
/// the bytes are copied; a read or write with no room left fails, which ends the connection.
struct Metered {
    inner: TcpStream,
    ctx: Arc<ConnCtx>,
    cred: Arc<CredState>,
    limit: u64,
}

impl Metered {
    fn reserve(&self, want: usize) -> usize {
        let want = u64::try_from(want).unwrap_or(u64::MAX);
        let taken = self
            .cred
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.limit).then(|| used + want.min(self.limit - used))
            });
        match taken {
            Ok(used) => usize::try_from(want.min(self.limit - used)).unwrap_or(usize::MAX),
            Err(_) => 0,
        }
    }

    fn refund(&self, unused: usize) {
        if unused > 0 {
            let unused = u64::try_from(unused).unwrap_or(0);
            self.cred.bytes.fetch_sub(unused, Ordering::AcqRel);
        }
    }

    fn over_budget(&self) -> io::Error {
        self.ctx.end("byte_limit");
        io::Error::other("the credential's byte budget is used up")
    }
}

impl AsyncRead for Metered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let room = this.reserve(buf.remaining());
        if room == 0 {
            return Poll::Ready(Err(this.over_budget()));
        }
        let (poll, n) = {
            let mut limited = ReadBuf::new(buf.initialize_unfilled_to(room));
            let poll = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
            (poll, limited.filled().len())
        };
        let n = if matches!(poll, Poll::Ready(Ok(()))) {
            n
        } else {
            0
        };
        this.refund(room - n);
        if n > 0 {
            buf.advance(n);
            this.ctx
                .down
                .fetch_add(u64::try_from(n).unwrap_or(0), Ordering::AcqRel);
            this.ctx.touch();
        }
        poll
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let room = this.reserve(buf.len());
        if room == 0 {
            return Poll::Ready(Err(this.over_budget()));
        }
        let poll = Pin::new(&mut this.inner).poll_write(cx, &buf[..room]);
        let n = match &poll {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        this.refund(room - n);
        if n > 0 {
            this.ctx
                .up
                .fetch_add(u64::try_from(n).unwrap_or(0), Ordering::AcqRel);
            this.ctx.touch();
        }
        poll
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Reads the client's first bytes until they hold a complete `ClientHello`: the bytes read
/// (the hello's [`consumed`](ClientHello::consumed) first) and the hello.
async fn read_hello<R: AsyncRead + Unpin>(
    client: &mut R,
) -> Result<(Vec<u8>, ClientHello), &'static str> {
    use bytes::BufMut as _;
    let mut buf = Vec::with_capacity(2048);
    loop {
        match parse_client_hello(&buf) {
            Ok(Some(hello)) => return Ok((buf, hello)),
            Ok(None) => {}
            Err(HelloError::NotTls) => return Err("not_tls"),
            Err(HelloError::TooLarge) => return Err("hello_too_large"),
            Err(HelloError::NotClientHello | HelloError::Malformed(_)) => {
                return Err("bad_client_hello");
            }
        }
        // Never more than the bound in total (the parser refuses at the bound).
        let room = MAX_HELLO_BYTES - buf.len();
        match client.read_buf(&mut (&mut buf).limit(room)).await {
            Ok(0) | Err(_) => return Err("client_gone"),
            Ok(_) => {}
        }
    }
}

/// Why a `ClientHello` for `host` is refused, if it is: it seals the name it asks for
/// (Encrypted Client Hello, whose clear `server_name` names only a front), or its
/// `server_name` is missing or another name.
fn hello_refusal(hello: &ClientHello, host: &str) -> Option<&'static str> {
    if hello.encrypted_client_hello {
        return Some("ech");
    }
    match &hello.server_name {
        Some(name) if name == host => None,
        Some(_) => Some("sni_mismatch"),
        None => Some("no_sni"),
    }
}

/// How the handshake phase of a tunnel stopped short of copying.
enum Stop {
    /// A second hello was refused (the log record's `reason`): the client gets an alert.
    Refused(&'static str),
    /// The connection ended (the record's `reason`).
    Ended(&'static str),
}

/// A `CONNECT` tunnel after its `200`: check the `ClientHello` (and any second one a
/// `HelloRetryRequest` calls for), then copy both ways.
async fn tunnel(shared: Arc<Shared>, ctx: Arc<ConnCtx>, req: Request<Incoming>, adm: Admitted) {
    let cfg = &shared.config;
    let Ok(upgraded) = hyper::upgrade::on(req).await else {
        ctx.end("client_gone");
        return;
    };
    let mut client = TokioIo::new(upgraded);
    let hello = tokio::time::timeout(cfg.handshake_timeout, read_hello(&mut client)).await;
    let (mut first, hello) = match hello {
        Ok(Ok(got)) => got,
        Ok(Err(reason)) => {
            ctx.refuse(reason);
            if reason != "not_tls" && reason != "client_gone" {
                let _ = client.write_all(&TLS_ACCESS_DENIED).await;
            }
            return;
        }
        Err(_) => {
            ctx.refuse("hello_timeout");
            return;
        }
    };
    if let Some(reason) = hello_refusal(&hello, &adm.host) {
        ctx.refuse(reason);
        let _ = client.write_all(&TLS_ACCESS_DENIED).await;
        let _ = client.shutdown().await;
        return;
    }
    // What the client sent after its hello waits until the server has answered it.
    let held = first.split_off(hello.consumed);
    let mut upstream = Metered {
        inner: adm.upstream,
        ctx: Arc::clone(&ctx),
        cred: adm.cred,
        limit: cfg.max_bytes_per_credential,
    };
    let copied = async {
        if upstream.write_all(&first).await.is_err() {
            return "stream_error";
        }
        drop(first);
        let after = until_settled(
            &mut client,
            &mut upstream,
            &adm.host,
            held,
            cfg.handshake_timeout,
        );
        let held = match after.await {
            Ok(held) => held,
            Err(Stop::Refused(reason)) => {
                ctx.refuse(reason);
                let _ = client.write_all(&TLS_ACCESS_DENIED).await;
                let _ = client.shutdown().await;
                return reason;
            }
            Err(Stop::Ended(reason)) => return reason,
        };
        if upstream.write_all(&held).await.is_err() {
            return "stream_error";
        }
        drop(held);
        let copied = tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            UP_BUFFER,
            DOWN_BUFFER,
        );
        if copied.await.is_ok() {
            "closed"
        } else {
            "stream_error"
        }
    };
    bounded(&ctx, cfg, adm.expires_at, copied).await;
}

/// The most client bytes held back while the server has not answered a hello, or while a
/// second hello is read: one whole record of any kind (a hello is bounded by
/// [`MAX_HELLO_BYTES`] within it).
const MOST_HELD: usize = 5 + 16 * 1024 + 256;

/// The handshake phase of a tunnel whose first hello has been forwarded: copies the server's
/// bytes to the client while holding back the client's (`held`, then what it sends, up to
/// [`MOST_HELD`]) until the server has answered the hello. A `HelloRetryRequest` makes the
/// client's next handshake message a second hello in the clear: the records before it that
/// cannot carry one (`ChangeCipherSpec`, alerts, early data) are passed on, and the hello is
/// checked like the first (within `hello_timeout`) and forwarded once it passes. Any other
/// answer ends the phase. Returns the client's bytes held back, which go to the server before
/// the tunnel turns into a plain copy.
async fn until_settled<C>(
    client: &mut C,
    upstream: &mut Metered,
    host: &str,
    mut held: Vec<u8>,
    hello_timeout: Duration,
) -> Result<Vec<u8>, Stop>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    use bytes::BufMut as _;
    let mut watch = RetryWatch::default();
    let mut hellos_checked = 0;
    let mut hello_due = None;
    loop {
        let want_hello = watch.retries() > hellos_checked;
        if !want_hello && watch.settled() {
            return Ok(held);
        }
        if want_hello {
            match after_retry(&held) {
                Ok(AfterRetry::Hello(hello)) => {
                    if let Some(reason) = hello_refusal(&hello, host) {
                        return Err(Stop::Refused(reason));
                    }
                    let rest = held.split_off(hello.consumed);
                    upstream
                        .write_all(&held)
                        .await
                        .map_err(|_| Stop::Ended("stream_error"))?;
                    held = rest;
                    hellos_checked += 1;
                    hello_due = None;
                    continue;
                }
                Ok(AfterRetry::Pass(n)) => {
                    upstream
                        .write_all(&held[..n])
                        .await
                        .map_err(|_| Stop::Ended("stream_error"))?;
                    held.drain(..n);
                    continue;
                }
                Ok(AfterRetry::NeedMore) => {}
                Err(HelloError::TooLarge) => return Err(Stop::Refused("hello_too_large")),
                Err(_) => return Err(Stop::Refused("bad_client_hello")),
            }
        }
        let room = MOST_HELD.saturating_sub(held.len());
        if want_hello && room == 0 {
            return Err(Stop::Refused("hello_too_large"));
        }
        // The second hello's time runs from the first wait for it.
        let due = if want_hello {
            *hello_due.get_or_insert_with(|| tokio::time::Instant::now() + hello_timeout)
        } else {
            hello_due = None;
            tokio::time::Instant::now() + hello_timeout // unused: its branch is off
        };
        let mut limited = (&mut held).limit(room);
        tokio::select! {
            ready = upstream.inner.readable() => {
                ready.map_err(|_| Stop::Ended("stream_error"))?;
                // The buffer exists only while bytes are there to read, so a tunnel waiting
                // for its server holds none.
                let mut chunk = Vec::with_capacity(8 * 1024);
                match upstream.read_buf(&mut chunk).await {
                    Ok(0) => return Err(Stop::Ended("closed")),
                    Ok(_) => {}
                    Err(_) => return Err(Stop::Ended("stream_error")),
                }
                watch.feed(&chunk);
                client
                    .write_all(&chunk)
                    .await
                    .map_err(|_| Stop::Ended("client_gone"))?;
            }
            read = client.read_buf(&mut limited), if room > 0 => {
                if !matches!(read, Ok(n) if n > 0) {
                    return Err(Stop::Ended("client_gone"));
                }
            }
            () = tokio::time::sleep_until(due), if want_hello => {
                return Err(Stop::Refused("hello_timeout"));
            }
        }
    }
}

/// Runs `work` (which says how it ended) until it ends, nothing moves for the idle timeout,
/// the connection reaches its maximum lifetime, or its credential expires; notes which.
async fn bounded<F>(ctx: &ConnCtx, cfg: &GatewayConfig, expires_at: SystemTime, work: F)
where
    F: Future<Output = &'static str>,
{
    let lifetime = tokio::time::Instant::from_std(ctx.started + cfg.max_connection_lifetime);
    let left = expires_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let expiry = tokio::time::Instant::now() + left;
    let reason = tokio::select! {
        reason = work => reason,
        () = idle(ctx, cfg.idle_timeout) => "idle_timeout",
        () = tokio::time::sleep_until(lifetime) => "lifetime",
        () = tokio::time::sleep_until(expiry) => "token_expired",
    };
    ctx.end(reason);
}

/// Headers that belong to one hop and are never passed on, `Proxy-Authorization` (the token)
/// among them.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Removes the hop-by-hop headers, and those a `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    // Framing is re-done by each hop (hyper sets it from the body).
    headers.remove(header::TRANSFER_ENCODING);
}

/// Forwards one plain-HTTP request over the admitted connection and streams the answer back.
async fn forward(
    shared: &Arc<Shared>,
    ctx: &Arc<ConnCtx>,
    req: Request<Incoming>,
    adm: Admitted,
) -> Result<Response<Body>, Refusal> {
    let cfg = &shared.config;
    let upstream_error = |msg: String| Refusal::new(StatusCode::BAD_GATEWAY, "upstream_error", msg);
    let io = Metered {
        inner: adm.upstream,
        ctx: Arc::clone(ctx),
        cred: adm.cred,
        limit: cfg.max_bytes_per_credential,
    };
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Incoming>(TokioIo::new(io))
        .await
        .map_err(|e| upstream_error(format!("upstream handshake failed: {e}")))?;
    {
        let (shared, ctx, expires_at) = (Arc::clone(shared), Arc::clone(ctx), adm.expires_at);
        tokio::spawn(async move {
            let ended = async {
                if conn.await.is_ok() {
                    "closed"
                } else {
                    "upstream_error"
                }
            };
            bounded(&ctx, &shared.config, expires_at, ended).await;
        });
    }
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = path
        .parse::<Uri>()
        .map_err(|_| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", "bad request path"))?;
    parts.version = Version::HTTP_11;
    let host_header = if adm.port == 80 {
        adm.host.clone()
    } else {
        format!("{}:{}", adm.host, adm.port)
    };
    let host_value = HeaderValue::from_str(&host_header)
        .map_err(|_| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", "bad host"))?;
    parts.headers.insert(header::HOST, host_value);
    let resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| upstream_error(format!("{}: {e}", adm.host)))?;
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, body.boxed()))
}

/// Fuzzing support ([`crate::fuzzing`]): one gateway, served connections held in memory.
pub(crate) struct Harness {
    shared: Arc<Shared>,
}

impl Harness {
    /// A gateway with `config` (whose resolver must never answer a public address: the harness
    /// connects to nothing).
    pub(crate) fn new(config: GatewayConfig) -> Self {
        let mut shared = Shared::new(config);
        shared.half_close = true;
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Serves one connection that sends `input` and then closes its side, through the same
    /// handler as a TCP connection; returns everything the gateway answered.
    pub(crate) async fn serve(&self, input: &[u8]) -> Vec<u8> {
        let (client, gateway_side) = tokio::io::duplex(64 * 1024);
        let Ok(permit) = Arc::new(Semaphore::new(1)).try_acquire_owned() else {
            return Vec::new();
        };
        let peer = SocketAddr::from(([192, 0, 2, 1], 1));
        let pending = self.shared.add_pending();
        let served = connection(
            Arc::clone(&self.shared),
            gateway_side,
            peer,
            permit,
            pending,
        );
        let talk = async move {
            let (mut read, mut write) = tokio::io::split(client);
            let send = async move {
                let _ = write.write_all(input).await;
                let _ = write.shutdown().await;
            };
            let mut out = Vec::new();
            let receive = read.read_to_end(&mut out);
            let ((), _) = tokio::join!(send, receive);
            out
        };
        let ((), out) = tokio::join!(served, talk);
        out
    }

    /// The request-target check of `method` and `target`: the host and port, or the reason
    /// code of the refusal.
    pub(crate) fn target(
        method: &[u8],
        request_target: &[u8],
    ) -> Result<(String, u16), &'static str> {
        let method = Method::from_bytes(method).map_err(|_| "bad_method")?;
        let uri = Uri::try_from(request_target).map_err(|_| "bad_uri")?;
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .map_err(|_| "bad_request")?;
        framing(&req).map_err(|r| r.code)?;
        target(&req).map_err(|r| r.code)
    }

    /// The credential check of one `Proxy-Authorization` value: the guest, or the reason
    /// code of the refusal.
    pub(crate) fn credential(&self, value: &[u8]) -> Result<String, &'static str> {
        let value = HeaderValue::from_bytes(value).map_err(|_| "bad_header")?;
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri("pkg.test:443")
            .header(header::PROXY_AUTHORIZATION, value)
            .body(())
            .map_err(|_| "bad_request")?;
        credential(&self.shared, &req)
            .map(|c| c.guest)
            .map_err(|r| r.code)
    }
}
