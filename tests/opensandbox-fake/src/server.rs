//! Connections, request ids, auth, routing, faults, the server proxy and the control routes.

use std::convert::Infallible;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::execd::command::StreamFault;
use crate::execd::{Guest, Host};
use crate::faults::{Action, Faults};
use crate::http::{ApiError, Res, json_response};
use crate::lifecycle;
use crate::state::{App, State};
use crate::util::{hex_id, parse_query, percent_decode};

/// The API key header.
const KEY_HEADER: &str = "open-sandbox-api-key";
/// Largest JSON body read.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Largest request body copied into the request log.
const MAX_LOGGED_BODY: usize = 64 * 1024;

/// Serves `listener` with `serve` for every request until `stop` is cancelled. A request whose
/// handler cancels the connection token gets no answer (the connection is closed).
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, stop: CancellationToken, serve: F)
where
    F: Fn(CancellationToken, Request<Body>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let serve = serve.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let kill = CancellationToken::new();
            let svc_kill = kill.clone();
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let serve = serve.clone();
                let kill = svc_kill.clone();
                async move { Ok::<_, Infallible>(serve(kill, req.map(Body::new)).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {},
                () = kill.cancelled() => {},
                () = stop.cancelled() => {},
            }
        });
    }
}

/// Entry point of the fake server for one request.
pub(crate) async fn handle(app: Arc<App>, kill: CancellationToken, req: Request<Body>) -> Response {
    let rid = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map_or_else(|| hex_id(32), str::to_owned);
    app.request_seq.fetch_add(1, Ordering::Relaxed);
    let mut resp = route(&app, &kill, req).await;
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The shape `/sandboxes/{id}/proxy/{port}` (with or without `/v1`), as the auth middleware
/// recognises it: such requests need no key.
fn is_proxy_path(path: &str) -> bool {
    if path.contains("..") {
        return false;
    }
    let rest = path.strip_prefix("/v1").unwrap_or(path);
    let segs: Vec<&str> = rest.split('/').collect();
    segs.len() >= 5
        && segs[0].is_empty()
        && segs[1] == "sandboxes"
        && !segs[2].is_empty()
        && segs[3] == "proxy"
        && !segs[4].is_empty()
        && segs[4].bytes().all(|b| b.is_ascii_digit())
}

/// A classified lifecycle request.
#[derive(Debug, Clone)]
enum Route {
    Health,
    Version,
    MetricsEvent,
    Create,
    List,
    Get(String),
    Delete(String),
    PatchMetadata(String),
    Renew(String),
    Pause(String),
    Resume(String),
    Endpoint(String, String),
    SnapshotCreate(String),
    SnapshotList,
    SnapshotGet(String),
    SnapshotDelete(String),
    NetworkPolicy(String),
    Diagnostics(String, String),
    Proxy(String, String, String),
}

impl Route {
    fn name(&self, method: &Method) -> &'static str {
        match self {
            Self::Health => "health",
            Self::Version => "version",
            Self::MetricsEvent => "metrics_event",
            Self::Create => "create",
            Self::List => "list",
            Self::Get(_) => "get",
            Self::Delete(_) => "delete",
            Self::PatchMetadata(_) => "patch_metadata",
            Self::Renew(_) => "renew",
            Self::Pause(_) => "pause",
            Self::Resume(_) => "resume",
            Self::Endpoint(..) => "endpoint",
            Self::SnapshotCreate(_) => "snapshot_create",
            Self::SnapshotList => "snapshot_list",
            Self::SnapshotGet(_) => "snapshot_get",
            Self::SnapshotDelete(_) => "snapshot_delete",
            Self::NetworkPolicy(_) => match method.as_str() {
                "GET" => "networkpolicy_get",
                "PUT" => "networkpolicy_put",
                "PATCH" => "networkpolicy_patch",
                _ => "networkpolicy_delete",
            },
            Self::Diagnostics(..) => "diagnostics",
            Self::Proxy(..) => "proxy",
        }
    }
}

/// Maps a method and path (after `/v1`) to a route.
fn classify(m: &Method, path: &str, v1: bool) -> Result<Route, ApiError> {
    let segs: Vec<String> = path
        .split('/')
        .skip(1)
        .map(|s| percent_decode(s, false))
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let is = |want: &str| m.as_str() == want;
    let only = |want: &str, r: Route| {
        if is(want) {
            Ok(r)
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    let own = |x: &str| x.to_owned();
    match s.as_slice() {
        ["health"] if !v1 => only("GET", Route::Health),
        ["version"] if !v1 => only("GET", Route::Version),
        ["metrics", "events"] if v1 => only("POST", Route::MetricsEvent),
        ["sandboxes"] => match m.as_str() {
            "GET" => Ok(Route::List),
            "POST" => Ok(Route::Create),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["sandboxes", id] => match m.as_str() {
            "GET" => Ok(Route::Get(own(id))),
            "DELETE" => Ok(Route::Delete(own(id))),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["sandboxes", id, "metadata"] => only("PATCH", Route::PatchMetadata(own(id))),
        ["sandboxes", id, "renew-expiration"] => only("POST", Route::Renew(own(id))),
        ["sandboxes", id, "pause"] => only("POST", Route::Pause(own(id))),
        ["sandboxes", id, "resume"] => only("POST", Route::Resume(own(id))),
        ["sandboxes", id, "endpoints", port] => only("GET", Route::Endpoint(own(id), own(port))),
        ["sandboxes", id, "snapshots"] => only("POST", Route::SnapshotCreate(own(id))),
        ["sandboxes", id, "networkpolicy"] => match m.as_str() {
            "GET" | "PUT" | "PATCH" | "DELETE" => Ok(Route::NetworkPolicy(own(id))),
            _ => Err(ApiError::method_not_allowed()),
        },
        [
            "sandboxes",
            id,
            "diagnostics",
            kind @ ("logs" | "inspect" | "events" | "summary"),
        ] => only("GET", Route::Diagnostics(own(id), own(kind))),
        ["sandboxes", id, "proxy", port, rest @ ..] if port.bytes().all(|b| b.is_ascii_digit()) => {
            match m.as_str() {
                "GET" | "POST" | "PUT" | "DELETE" | "PATCH" => Ok(Route::Proxy(
                    own(id),
                    own(port),
                    format!("/{}", rest.join("/")),
                )),
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        ["snapshots"] => only("GET", Route::SnapshotList),
        ["snapshots", id] => match m.as_str() {
            "GET" => Ok(Route::SnapshotGet(own(id))),
            "DELETE" => Ok(Route::SnapshotDelete(own(id))),
            _ => Err(ApiError::method_not_allowed()),
        },
        _ => Err(ApiError::no_route()),
    }
}

/// An injected status fault's body: the code a real answer with that status would carry.
fn fault_body(route: &str, status: u16, ns: &str) -> Response {
    let code = match (route, status) {
        ("delete", 500) => format!("{ns}::SANDBOX_DELETE_FAILED"),
        (_, 502) => "BACKEND_CONNECTION_FAILED".to_owned(),
        (_, 504) => "BACKEND_TIMEOUT".to_owned(),
        (r, 500)
            if r.starts_with("command")
                || r.starts_with("files")
                || r.starts_with("directories") =>
        {
            "RUNTIME_ERROR".to_owned()
        }
        (_, 500) => "SANDBOX::INTERNAL_ERROR".to_owned(),
        _ => "SANDBOX::INJECTED_FAULT".to_owned(),
    };
    ApiError::new(
        status,
        &code,
        format!("injected fault: HTTP {status} on {route}"),
    )
    .into_response()
}

async fn route(app: &Arc<App>, kill: &CancellationToken, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parse_query(parts.uri.query());
    if let Some(ctl) = path.strip_prefix("/_fake/") {
        return control(app, &parts.method, ctl, body).await;
    }
    // Auth runs before routing, as the server's middleware does (so an unknown path without a
    // key is a 401, not a 404).
    let exempt = ["/health", "/version", "/docs", "/redoc", "/openapi.json"]
        .iter()
        .any(|p| path.starts_with(p));
    if !exempt && !is_proxy_path(&path) {
        let key = parts
            .headers
            .get(KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if key.is_empty() {
            return ApiError::new(
                401,
                "MISSING_API_KEY",
                "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header.",
            )
            .into_response();
        }
        if key != app.api_key {
            return ApiError::new(
                401,
                "INVALID_API_KEY",
                "Authentication credentials are invalid. Check your API key and try again.",
            )
            .into_response();
        }
    }
    let (v1, unversioned) = match path.strip_prefix("/v1") {
        Some(r) if r.is_empty() || r.starts_with('/') => (true, r.to_owned()),
        _ => (false, path.clone()),
    };
    let route = match classify(&parts.method, &unversioned, v1) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let name = route.name(&parts.method);
    let inner_name = match &route {
        Route::Proxy(_, port, sub) => Some(match port.as_str() {
            "44772" => crate::execd::route_name(&parts.method, sub),
            "18080" => "sidecar_policy",
            _ => "execd_other",
        }),
        Route::NetworkPolicy(_) => Some("sidecar_policy"),
        _ => None,
    };
    {
        let mut inner = app.lock();
        *inner.counters.requests.entry(name.to_owned()).or_default() += 1;
        if let Some(n) = inner_name {
            *inner.counters.requests.entry(n.to_owned()).or_default() += 1;
        }
        if inner_name == Some("command") {
            inner.counters.commands += 1;
        }
    }
    // Bodies are read here, except a proxied upload, which streams through.
    let streamed = inner_name == Some("files_upload");
    let mut body = Some(body);
    let mut bytes = Bytes::new();
    if !streamed {
        match axum::body::to_bytes(body.take().unwrap_or_else(Body::empty), MAX_BODY).await {
            Ok(b) => bytes = b,
            Err(_) => {
                return ApiError::new(
                    413,
                    "SANDBOX::INVALID_PARAMETER",
                    "request body too large or unreadable",
                )
                .into_response();
            }
        }
    }
    if let Some(log) = &app.request_log {
        let shown = &bytes[..bytes.len().min(MAX_LOGGED_BODY)];
        let line = json!({
            "route": inner_name.map_or_else(|| name.to_owned(), |n| format!("{name}:{n}")),
            "method": parts.method.as_str(),
            "path": path,
            "query": query,
            "body": if streamed { Value::Null } else { json!(String::from_utf8_lossy(shown)) },
        });
        let mut f = log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(f, "{line}");
    }
    let ns = app.config().ns();
    let fault = {
        let mut f = app.faults();
        f.pick(name).or_else(|| inner_name.and_then(|n| f.pick(n)))
    };
    let mut reset_after = false;
    let mut stream_fault = StreamFault::None;
    match fault {
        None => {}
        Some(Action::Status(code)) => return fault_body(inner_name.unwrap_or(name), code, ns),
        Some(Action::Reset) => {
            kill.cancel();
            return std::future::pending().await;
        }
        Some(Action::Stall) => {
            app.shutdown.cancelled().await;
            return ApiError::new(503, "SANDBOX::INTERNAL_ERROR", "server shutting down")
                .into_response();
        }
        Some(Action::ResetAfter) => reset_after = true,
        Some(Action::StallMid) => stream_fault = StreamFault::StallAfterInit,
    }
    let mount = if v1 { "/v1" } else { "" };
    let result: Res = match route {
        Route::Health => crate::http::ok(&json!({"status": "healthy"})),
        Route::Version => crate::http::ok(&json!({"version": crate::SERVER_VERSION})),
        Route::MetricsEvent => crate::http::empty(204),
        Route::Create => lifecycle::create(app, &bytes),
        Route::List => lifecycle::list(app, &query),
        Route::Get(id) => lifecycle::get(app, &id),
        Route::Delete(id) => lifecycle::delete(app, &id),
        Route::PatchMetadata(id) => lifecycle::patch_metadata(app, &id, &bytes),
        Route::Renew(id) => lifecycle::renew(app, &id, &bytes),
        Route::Pause(id) => lifecycle::pause(app, &id),
        Route::Resume(id) => lifecycle::resume(app, &id),
        Route::Endpoint(id, port) => lifecycle::endpoint(app, &id, &port, &query, mount),
        Route::SnapshotCreate(id) => lifecycle::snapshot_create(app, &id, &bytes),
        Route::SnapshotList => lifecycle::snapshot_list(app, &query),
        Route::SnapshotGet(id) => lifecycle::snapshot_get(app, &id),
        Route::SnapshotDelete(id) => lifecycle::snapshot_delete(app, &id),
        Route::NetworkPolicy(id) => {
            sidecar(app, &id, parts.method.as_str(), "/policy", &bytes).await
        }
        Route::Diagnostics(id, kind) => lifecycle::diagnostics(app, &id, &kind),
        Route::Proxy(id, port, sub) => {
            let body = body.take().unwrap_or_else(|| Body::from(bytes.clone()));
            proxy(
                app,
                &id,
                &port,
                &sub,
                &parts.method,
                &query,
                &parts.headers,
                body,
                stream_fault,
            )
            .await
        }
    };
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    if reset_after {
        // The work is done (a create made its sandbox); the answer is lost.
        let _ = axum::body::to_bytes(resp.into_body(), usize::MAX).await;
        kill.cancel();
        return std::future::pending().await;
    }
    resp
}

fn backend_failed(port: &str) -> ApiError {
    ApiError::new(
        502,
        "BACKEND_CONNECTION_FAILED",
        format!(
            "Could not connect to the backend sandbox 127.0.0.1:{port}: All connection attempts failed"
        ),
    )
}

/// Waits while `guest` is frozen; `Err` (504) when the proxy's read timeout passes first.
async fn wait_unfrozen(app: &App, guest: &Guest, port: &str) -> Result<(), ApiError> {
    if !guest.is_frozen() {
        return Ok(());
    }
    let limit = Duration::from_millis(app.config().proxy_timeout_ms);
    tokio::select! {
        () = guest.wait_thawed() => Ok(()),
        () = guest.gone.cancelled() => Err(backend_failed(port)),
        () = app.shutdown.cancelled() => Err(backend_failed(port)),
        () = tokio::time::sleep(limit) => Err(ApiError::new(
            504,
            "BACKEND_TIMEOUT",
            format!("The backend sandbox 127.0.0.1:{port} did not respond in time: ReadTimeout"),
        )),
    }
}

/// The server's `/networkpolicy` route and the proxy to port 18080: the sandbox's sidecar.
async fn sidecar(app: &Arc<App>, id: &str, method: &str, path: &str, body: &[u8]) -> Res {
    let guest = {
        let inner = app.lock();
        let sb = inner.find(id).ok_or_else(|| not_found(app, id))?;
        if sb.sidecar.is_none() || matches!(sb.state, State::Pending | State::Failed) {
            return Err(backend_failed("18080"));
        }
        sb.guest.clone()
    };
    // A paused sandbox's sidecar is paused with it.
    wait_unfrozen(app, &guest, "18080").await?;
    let cfg = app.config();
    let mut inner = app.lock();
    let sb = inner.find_mut(id).ok_or_else(|| not_found(app, id))?;
    let Some(sc) = sb.sidecar.as_mut() else {
        return Err(backend_failed("18080"));
    };
    Ok(crate::egress::handle(sc, &cfg, method, path, body))
}

fn not_found(app: &App, id: &str) -> ApiError {
    let ns = app.config().ns();
    ApiError::new(
        404,
        &format!("{ns}::SANDBOX_NOT_FOUND"),
        format!("Sandbox {id} not found."),
    )
}

/// `ANY /sandboxes/{id}/proxy/{port}/{path}`: execd (44772), the sidecar (18080), or nothing.
#[allow(clippy::too_many_arguments)]
async fn proxy(
    app: &Arc<App>,
    id: &str,
    port: &str,
    sub: &str,
    method: &Method,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: Body,
    fault: StreamFault,
) -> Res {
    match port {
        "44772" => {
            let guest = {
                let inner = app.lock();
                let sb = inner.find(id).ok_or_else(|| not_found(app, id))?;
                if matches!(sb.state, State::Pending | State::Failed) {
                    return Err(backend_failed(port));
                }
                app.execd_target(&inner, id)
                    .ok_or_else(|| backend_failed(port))?
            };
            if !guest.is_ready() {
                return Err(backend_failed(port));
            }
            // A frozen (paused) sandbox accepts the connection and never answers.
            wait_unfrozen(app, &guest, port).await?;
            Ok(crate::execd::handle(guest, method, sub, query, headers, body, fault).await)
        }
        "18080" => {
            let bytes = axum::body::to_bytes(body, MAX_BODY)
                .await
                .map_err(|_| ApiError::new(400, "SANDBOX::INVALID_PARAMETER", "unreadable body"))?;
            sidecar(app, id, method.as_str(), sub, &bytes).await
        }
        _ => {
            let inner = app.lock();
            inner.find(id).ok_or_else(|| not_found(app, id))?;
            Err(backend_failed(port))
        }
    }
}

/// `/_fake/...`: stats, reset, faults, config. No auth, no faults.
async fn control(app: &Arc<App>, method: &Method, path: &str, body: Body) -> Response {
    let bytes = axum::body::to_bytes(body, 1024 * 1024)
        .await
        .unwrap_or_default();
    let result: Res = match (method.as_str(), path.trim_end_matches('/')) {
        ("GET", "stats") => {
            crate::http::ok(&serde_json::to_value(crate::stats_of(app)).unwrap_or(Value::Null))
        }
        ("POST", "reset") => {
            crate::reset(app);
            crate::http::ok(&json!({"reset": true}))
        }
        ("PUT" | "POST", "faults") => {
            let spec = String::from_utf8_lossy(&bytes);
            match Faults::parse(&spec) {
                Ok(f) => {
                    *app.faults() = f;
                    crate::http::ok(&json!({"faults": spec}))
                }
                Err(e) => Err(ApiError::new(400, "FAKE::BAD_FAULTS", e)),
            }
        }
        ("GET", "config") => {
            crate::http::ok(&serde_json::to_value(app.config()).unwrap_or(Value::Null))
        }
        ("POST" | "PUT" | "PATCH", "config") => match serde_json::from_slice::<Value>(&bytes) {
            Ok(fields) => {
                let merged = app.config().merged(&fields);
                match merged {
                    Ok(c) => {
                        *app.host.config() = c.clone();
                        crate::http::ok(&serde_json::to_value(c).unwrap_or(Value::Null))
                    }
                    Err(e) => Err(ApiError::new(400, "FAKE::BAD_CONFIG", e)),
                }
            }
            Err(e) => Err(ApiError::new(400, "FAKE::BAD_CONFIG", e.to_string())),
        },
        _ => Err(ApiError::new(
            404,
            "FAKE::NO_ROUTE",
            "no such control route",
        )),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Entry point of the stand-alone execd for one request: execd at `/`, and at `/proxy/44772/`
/// (the path a bridge-mode server puts in front of it); other proxied ports answer 502.
pub(crate) async fn handle_execd(guest: Arc<Guest>, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let query = parse_query(parts.uri.query());
    let mut path = parts.uri.path().to_owned();
    if let Some(rest) = path.strip_prefix("/proxy/") {
        let (port, sub) = rest.split_once('/').unwrap_or((rest, ""));
        if port != "44772" {
            return json_response(
                502,
                &json!({"code": "RUNTIME_ERROR", "message": format!("nothing listens on port {port}")}),
            );
        }
        path = format!("/{sub}");
    }
    crate::execd::handle(
        guest,
        &parts.method,
        &path,
        &query,
        &parts.headers,
        body,
        StreamFault::None,
    )
    .await
}

/// A host for the stand-alone execd (no shims, the configuration's defaults).
pub(crate) fn standalone_host(ping: Duration, framing: crate::config::OutputFraming) -> Arc<Host> {
    let cfg = crate::config::Config {
        ping_ms: u64::try_from(ping.as_millis()).unwrap_or(3000).max(1),
        output_framing: framing,
        ..crate::config::Config::default()
    };
    Arc::new(Host {
        config: std::sync::Mutex::new(cfg),
        guest_path: Vec::new(),
        shim_root: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_are_recognised_like_the_auth_middleware() {
        assert!(is_proxy_path("/v1/sandboxes/abc/proxy/44772/command"));
        assert!(is_proxy_path("/sandboxes/abc/proxy/44772"));
        assert!(!is_proxy_path("/v1/sandboxes/abc/proxy/x/command"));
        assert!(!is_proxy_path("/v1/sandboxes/abc/proxy/44772/../../x"));
        assert!(!is_proxy_path("/v1/sandboxes/abc"));
    }

    #[test]
    fn routes_classify_with_methods() {
        let get = Method::GET;
        assert!(matches!(
            classify(&get, "/sandboxes/x", true),
            Ok(Route::Get(_))
        ));
        assert!(matches!(
            classify(&Method::PUT, "/sandboxes/x", true),
            Err(ApiError { status: 405, .. })
        ));
        assert!(matches!(
            classify(&get, "/nothing", true),
            Err(ApiError { status: 404, .. })
        ));
        assert!(matches!(
            classify(&get, "/health", true),
            Err(ApiError { status: 404, .. })
        ));
        match classify(&Method::POST, "/sandboxes/x/proxy/44772/command", true) {
            Ok(Route::Proxy(id, port, sub)) => {
                assert_eq!(
                    (id.as_str(), port.as_str(), sub.as_str()),
                    ("x", "44772", "/command")
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
