//! The proxy itself: accept, admit, then tunnel (`CONNECT`) or forward (plain HTTP).
//!
//! Each accepted connection carries one request: `CONNECT host:port`, after which it is a
//! tunnel, or one absolute-form `http://` request, after which it is closed (no keep-alive, so
//! every request is admitted on its own and every connection gets one log record). A request is
//! admitted in this order: a target the gateway can read, a valid credential
//! (`Proxy-Authorization`), a host and port its allowlist names, room under the credential's
//! limits, a name that resolves to at least one public address, and a connection to one. A
//! `CONNECT` tunnel must then start with a TLS `ClientHello` whose `server_name` is the
//! `CONNECT` host; after that the bytes are copied untouched, metered against the credential's
//! byte budget as they pass, until either side closes, the connection is idle too long, or it
//! reaches its maximum lifetime.

use std::collections::HashMap;
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::addr::forbidden_reason;
use crate::allowlist::{Decision, HostError, normalize_host};
use crate::config::{GatewayConfig, Resolver};
use crate::tls::{HelloError, MAX_HELLO_BYTES, parse_client_hello};
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
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let shared = Arc::new(Shared {
        config,
        creds: Mutex::new(HashMap::new()),
        last_sweep: Mutex::new(Instant::now()),
    });
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return, // the semaphore is never closed
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(connection(Arc::clone(&shared), stream, peer, permit));
            }
            Err(err) => {
                // Out of descriptors, or a connection reset before it was accepted: wait a
                // little rather than spin.
                tracing::warn!(target: "egress_gateway", error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Process-wide state: the settings and the per-credential counters.
struct Shared {
    config: GatewayConfig,
    creds: Mutex<HashMap<[u8; 32], Arc<CredState>>>,
    last_sweep: Mutex<Instant>,
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
        Arc::clone(creds.entry(cred.id).or_insert_with(|| {
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

/// Serves one accepted connection.
async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let cfg = &shared.config;
    let ctx = Arc::new(ConnCtx {
        started: Instant::now(),
        peer,
        last_active_ms: AtomicU64::new(0),
        up: AtomicU64::new(0),
        down: AtomicU64::new(0),
        had_request: AtomicBool::new(false),
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
    }
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
    let connect = req.method() == Method::CONNECT;
    ctx.record().kind = if connect { "connect" } else { "http" };
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

/// The host and port a request asks for, with the host normalised.
fn target(req: &Request<Incoming>) -> Result<(String, u16), Refusal> {
    let bad = |msg: &str| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", msg);
    let uri = req.uri();
    let (host, port) = if req.method() == Method::CONNECT {
        let authority = uri
            .authority()
            .ok_or_else(|| bad("CONNECT needs host:port"))?;
        let port = authority
            .port_u16()
            .ok_or_else(|| bad("CONNECT needs host:port"))?;
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
        (authority.host(), authority.port_u16().unwrap_or(80))
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
fn credential(shared: &Shared, req: &Request<Incoming>) -> Result<Credential, Refusal> {
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
    if let Ok((host, port)) = &target {
        let mut r = ctx.record();
        r.host = Some(host.clone());
        r.port = Some(*port);
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
            None if !public.contains(&ip) => public.push(ip),
            None => {}
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

/// Reads the client's first bytes until they hold a complete `ClientHello`.
async fn read_hello<R: AsyncRead + Unpin>(
    client: &mut R,
) -> Result<(Vec<u8>, Option<String>), &'static str> {
    use bytes::BufMut as _;
    let mut buf = Vec::with_capacity(2048);
    loop {
        match parse_client_hello(&buf) {
            Ok(Some(hello)) => return Ok((buf, hello.server_name)),
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

/// A `CONNECT` tunnel after its `200`: check the `ClientHello`, then copy both ways.
async fn tunnel(shared: Arc<Shared>, ctx: Arc<ConnCtx>, req: Request<Incoming>, adm: Admitted) {
    let cfg = &shared.config;
    let Ok(upgraded) = hyper::upgrade::on(req).await else {
        ctx.end("client_gone");
        return;
    };
    let mut client = TokioIo::new(upgraded);
    let hello = tokio::time::timeout(cfg.handshake_timeout, read_hello(&mut client)).await;
    let (hello, server_name) = match hello {
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
    match server_name {
        Some(name) if name == adm.host => {}
        other => {
            ctx.refuse(if other.is_some() {
                "sni_mismatch"
            } else {
                "no_sni"
            });
            let _ = client.write_all(&TLS_ACCESS_DENIED).await;
            let _ = client.shutdown().await;
            return;
        }
    }
    let mut upstream = Metered {
        inner: adm.upstream,
        ctx: Arc::clone(&ctx),
        cred: adm.cred,
        limit: cfg.max_bytes_per_credential,
    };
    let copied = async {
        let result = async {
            upstream.write_all(&hello).await?;
            drop(hello);
            tokio::io::copy_bidirectional_with_sizes(
                &mut client,
                &mut upstream,
                UP_BUFFER,
                DOWN_BUFFER,
            )
            .await
        }
        .await;
        if result.is_ok() {
            "closed"
        } else {
            "stream_error"
        }
    };
    bounded(&ctx, cfg, adm.expires_at, copied).await;
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
