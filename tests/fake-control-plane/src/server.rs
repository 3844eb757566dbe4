//! The accept loop, request classification, auth, latency, faults and control routes.

use std::convert::Infallible;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::faults::{Action, Fault, Faults, RetryAfter};
use crate::jsend::{ApiError, ApiResult, ok};
use crate::request::{MAX_JSON, Req};
use crate::state::App;
use crate::util::{parse_query, percent_decode};
use crate::{computer, handlers};

/// Serves connections until `app.shutdown` is cancelled.
pub(crate) async fn accept_loop(app: Arc<App>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = app.shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let kill = CancellationToken::new();
            let svc_app = app.clone();
            let svc_kill = kill.clone();
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let app = svc_app.clone();
                let kill = svc_kill.clone();
                async move { Ok::<_, Infallible>(handle(app, kill, req.map(Body::new)).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {},
                () = kill.cancelled() => {},
                () = app.shutdown.cancelled() => {},
            }
        });
    }
}

async fn handle(app: Arc<App>, kill: CancellationToken, req: Request<Body>) -> Response {
    let n = app.request_seq.fetch_add(1, Ordering::SeqCst);
    let rid = format!("req_fake_{n:08x}");
    let mut resp = route(&app, &kill, req).await;
    if let Ok(v) = header::HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// Routes that never need a key.
const PUBLIC: &[&str] = &["healthz", "readyz", "shapes", "rootfs"];

/// Routes a delegated token may call on its own sandbox.
fn delegated_allowed(name: &str) -> bool {
    matches!(
        name,
        "get"
            | "delete"
            | "pause"
            | "resume"
            | "exec"
            | "exec_stream"
            | "upload"
            | "download"
            | "computer"
    ) || name.starts_with("process_")
}

async fn route(app: &Arc<App>, kill: &CancellationToken, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    // Used as a proxy: record what arrived (and whether a key came with it), serve nothing.
    if parts.method == Method::CONNECT || parts.uri.authority().is_some() {
        let mut inner = app.lock();
        if parts.method == Method::CONNECT {
            inner.connect_requests += 1;
        } else {
            inner.proxied_requests += 1;
        }
        if parts.headers.contains_key("x-api-key") {
            inner.proxied_with_api_key += 1;
        }
        return ApiError::error(502, "createos-fake is not a proxy").into_response();
    }
    let raw_path = parts.uri.path().to_owned();
    let query = parse_query(parts.uri.query());
    let Some(path) = strip_base(&app.base_path, &raw_path) else {
        return ApiError::not_found(format!("no route for {raw_path}")).into_response();
    };
    if let Some(ctl) = path.strip_prefix("/_fake/") {
        return control(app, &parts.method, ctl, &query, body)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs_ref: Vec<&str> = segs.iter().map(String::as_str).collect();
    let stream_q = query.iter().any(|(k, v)| k == "stream" && v == "true");
    let follow_q = query.iter().any(|(k, v)| k == "follow" && v == "true");
    let (mut name, sid, sub) = match classify(&parts.method, &segs_ref, stream_q, follow_q) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    // A body `"stream": true` also selects the streaming exec.
    let mut pre_body = None;
    let mut body = Some(body);
    if name == "exec" {
        let Ok(bytes) =
            axum::body::to_bytes(body.take().unwrap_or_else(Body::empty), MAX_JSON).await
        else {
            return ApiError::bad_request("body", "could not read the request body")
                .into_response();
        };
        if serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("stream").and_then(Value::as_bool))
            == Some(true)
        {
            name = "exec_stream";
        }
        pre_body = Some(bytes);
    }
    {
        let mut inner = app.lock();
        *inner.requests.entry(name.to_owned()).or_default() += 1;
    }
    if let Some(log) = &app.request_log {
        if pre_body.is_none() {
            let Ok(bytes) =
                axum::body::to_bytes(body.take().unwrap_or_else(Body::empty), usize::MAX).await
            else {
                return ApiError::bad_request("body", "could not read the request body")
                    .into_response();
            };
            pre_body = Some(bytes);
        }
        let line = json!({
            "route": name,
            "method": parts.method.as_str(),
            "path": raw_path,
            "query": query,
            "body": String::from_utf8_lossy(pre_body.as_deref().unwrap_or_default()),
        });
        let mut file = log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(file, "{line}");
    }
    if !app.latency.is_zero() {
        tokio::time::sleep(app.latency).await;
    }
    let fault = app.faults().pick(name);
    let mut reset_after = false;
    let mut stall_mid = false;
    let mut drop_key: Option<String> = None;
    let retry_after = fault
        .as_ref()
        .map_or(RetryAfter::Default, |f| f.retry_after.clone());
    match fault.map(|Fault { action, .. }| action) {
        None => {}
        Some(Action::Status(code)) => {
            let mut resp =
                ApiError::error(code, format!("injected fault: HTTP {code}")).into_response();
            match retry_after {
                RetryAfter::Default => {}
                RetryAfter::Omit => {
                    resp.headers_mut().remove(header::RETRY_AFTER);
                }
                RetryAfter::Value(v) => {
                    if let Ok(v) = header::HeaderValue::from_str(&v) {
                        resp.headers_mut().insert(header::RETRY_AFTER, v);
                    }
                }
            }
            return resp;
        }
        Some(Action::Reset) => {
            kill.cancel();
            return std::future::pending().await;
        }
        Some(Action::Stall) => {
            app.shutdown.cancelled().await;
            return ApiError::error(503, "server shutting down").into_response();
        }
        Some(Action::ResetAfter) => reset_after = true,
        Some(Action::Drop(key)) => drop_key = Some(key),
        Some(Action::StallMid) => stall_mid = true,
        Some(Action::EchoHeaders) => {
            let mut lines: Vec<String> = parts
                .headers
                .iter()
                .map(|(k, v)| format!("{}: {}", k, String::from_utf8_lossy(v.as_bytes())))
                .collect();
            lines.sort();
            return ApiError::error(500, format!("request headers were: {}", lines.join("; ")))
                .into_response();
        }
        Some(Action::Redirect) => {
            return Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header(header::LOCATION, "http://127.0.0.1:1/elsewhere")
                .body(Body::empty())
                .unwrap_or_default();
        }
        Some(Action::Text) => {
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from("internal oops"))
                .unwrap_or_default();
        }
        Some(Action::Huge) => {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(huge_body()))
                .unwrap_or_default();
        }
        Some(Action::Malformed) => {
            return Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{\"status\": \"success\", \"data\": {"))
                .unwrap_or_default();
        }
    }
    // Authentication.
    if !PUBLIC.contains(&name) {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .unwrap_or_default();
        if key.is_empty() {
            return ApiError::error(401, "missing API key").into_response();
        }
        if key != app.api_key.0 {
            let bound = app.lock().tokens.get(key).cloned();
            match bound {
                None => return ApiError::error(401, "invalid API key").into_response(),
                Some(bound_sid) => {
                    if !delegated_allowed(name) || sid.as_deref() != Some(bound_sid.as_str()) {
                        return ApiError::error(
                            403,
                            "access token is not valid for this operation",
                        )
                        .into_response();
                    }
                }
            }
        }
    }
    let req = Req {
        name,
        method: parts.method.clone(),
        sid,
        sub,
        query,
        body,
        pre_body,
        stall_mid,
    };
    let resp = handlers::dispatch(app, req)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    if let Some(key) = drop_key {
        return without_key(resp, &key).await;
    }
    if reset_after {
        // Drain a streamed body so the work completes, then drop the connection unanswered.
        let _ = axum::body::to_bytes(resp.into_body(), usize::MAX).await;
        kill.cancel();
        return std::future::pending().await;
    }
    resp
}

/// `resp` with `key` left out of its JSend `data` object (a body that is not one is kept).
async fn without_key(resp: Response, key: &str) -> Response {
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let mut value: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => return Response::from_parts(parts, Body::from(bytes)),
    };
    if let Some(data) = value
        .get_mut("data")
        .and_then(serde_json::Value::as_object_mut)
    {
        data.remove(key);
    }
    let out = value.to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

/// An 8 MiB JSON error body, built once and shared.
fn huge_body() -> Bytes {
    static BODY: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    BODY.get_or_init(|| {
        let mut big = Vec::with_capacity(8 * 1024 * 1024);
        big.extend_from_slice(br#"{"status":"error","code":404,"message":""#);
        big.resize(8 * 1024 * 1024 - 2, b'x');
        big.extend_from_slice(b"\"}");
        Bytes::from(big)
    })
    .clone()
}

fn strip_base<'a>(base: &str, path: &'a str) -> Option<&'a str> {
    if base.is_empty() {
        return Some(path);
    }
    if let Some(rest) = path.strip_prefix(base)
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return Some(rest);
    }
    // Control routes are also served outside the base path.
    if path.starts_with("/_fake/") {
        return Some(path);
    }
    None
}

type Classified = (&'static str, Option<String>, Option<String>);

/// Maps a method and path to a route name and its ids.
fn classify(m: &Method, s: &[&str], stream: bool, follow: bool) -> Result<Classified, ApiError> {
    let get = *m == Method::GET;
    let post = *m == Method::POST;
    let put = *m == Method::PUT;
    let patch = *m == Method::PATCH;
    let del = *m == Method::DELETE;
    let own = |x: &str| Some(x.to_owned());
    let pick = |name: Option<&'static str>, sid: Option<String>, sub: Option<String>| match name {
        Some(n) => Ok((n, sid, sub)),
        None => Err(ApiError::error(405, "method not allowed")),
    };
    let by = |pairs: &[(bool, &'static str)]| pairs.iter().find(|(c, _)| *c).map(|(_, n)| *n);
    match s {
        ["healthz"] => pick(by(&[(get, "healthz")]), None, None),
        ["readyz"] => pick(by(&[(get, "readyz")]), None, None),
        ["v1", "whoami"] => pick(by(&[(get, "whoami")]), None, None),
        ["v1", "shapes"] => pick(by(&[(get, "shapes")]), None, None),
        ["v1", "rootfs"] => pick(by(&[(get, "rootfs")]), None, None),
        ["v1", "hosts"] => pick(by(&[(get, "hosts")]), None, None),
        ["v1", "sandboxes"] => pick(by(&[(get, "list"), (post, "create")]), None, None),
        ["v1", "sandboxes", "by-ip", ip] => pick(by(&[(get, "get_by_ip")]), None, own(ip)),
        ["v1", "sandboxes", id] => pick(
            by(&[(get, "get"), (patch, "patch"), (del, "delete")]),
            own(id),
            None,
        ),
        ["v1", "sandboxes", id, rest @ ..] => {
            let sid = own(id);
            match rest {
                ["pause"] => pick(by(&[(post, "pause")]), sid, None),
                ["resume"] => pick(by(&[(post, "resume")]), sid, None),
                ["fork"] => pick(by(&[(post, "fork")]), sid, None),
                ["resize"] => pick(by(&[(post, "resize")]), sid, None),
                ["ssh-pubkeys"] => pick(by(&[(post, "ssh_keys")]), sid, None),
                ["egress"] => pick(by(&[(get, "egress_get"), (put, "egress_put")]), sid, None),
                ["bandwidth"] => pick(by(&[(get, "bandwidth")]), sid, None),
                ["bandwidth", "recharge"] => pick(by(&[(post, "recharge")]), sid, None),
                ["exec"] => pick(
                    by(&[(post && stream, "exec_stream"), (post, "exec")]),
                    sid,
                    None,
                ),
                ["files"] => pick(by(&[(put, "upload"), (get, "download")]), sid, None),
                ["processes"] => pick(
                    by(&[(get, "process_list"), (post, "process_create")]),
                    sid,
                    None,
                ),
                ["processes", pid] => pick(
                    by(&[(get, "process_get"), (del, "process_delete")]),
                    sid,
                    own(pid),
                ),
                ["processes", pid, "connect"] => {
                    pick(by(&[(get, "process_connect")]), sid, own(pid))
                }
                ["processes", pid, "input"] => pick(by(&[(post, "process_input")]), sid, own(pid)),
                ["processes", pid, "stdin", "close"] => {
                    pick(by(&[(post, "process_stdin_close")]), sid, own(pid))
                }
                ["processes", pid, "resize"] => {
                    pick(by(&[(post, "process_resize")]), sid, own(pid))
                }
                ["processes", pid, "signal"] => {
                    pick(by(&[(post, "process_signal")]), sid, own(pid))
                }
                ["processes", pid, "wait"] => pick(by(&[(get, "process_wait")]), sid, own(pid)),
                ["access-token"] => pick(
                    by(&[
                        (post, "token_create"),
                        (get, "token_get"),
                        (del, "token_delete"),
                    ]),
                    sid,
                    None,
                ),
                ["access-token", "rotate"] => pick(by(&[(post, "token_rotate")]), sid, None),
                ["networks"] => pick(by(&[(post, "network_attach")]), sid, None),
                ["networks", nid] => pick(by(&[(del, "network_detach")]), sid, own(nid)),
                ["disks"] => pick(
                    by(&[(get, "sandbox_disks"), (post, "disk_attach")]),
                    sid,
                    None,
                ),
                ["disks", did] => pick(by(&[(del, "disk_detach")]), sid, own(did)),
                ["computer", ..] => Ok(("computer", sid, Some(rest[1..].join("/")))),
                _ => Err(ApiError::not_found("no such route")),
            }
        }
        ["v1", "templates"] => pick(
            by(&[(get, "template_list"), (post, "template_create")]),
            None,
            None,
        ),
        ["v1", "templates", tid] => pick(
            by(&[(get, "template_get"), (del, "template_delete")]),
            None,
            own(tid),
        ),
        ["v1", "templates", tid, "logs"] => pick(
            by(&[(get && follow, "template_follow"), (get, "template_logs")]),
            None,
            own(tid),
        ),
        ["v1", "networks"] => pick(
            by(&[(get, "network_list"), (post, "network_create")]),
            None,
            None,
        ),
        ["v1", "networks", nid] => pick(
            by(&[(get, "network_get"), (del, "network_delete")]),
            None,
            own(nid),
        ),
        ["v1", "disks"] => pick(by(&[(get, "disk_list"), (post, "disk_create")]), None, None),
        ["v1", "disks", d] => pick(
            by(&[
                (get, "disk_get"),
                (del, "disk_delete"),
                (patch, "disk_patch"),
            ]),
            None,
            own(d),
        ),
        _ => Err(ApiError::not_found("no such route")),
    }
}

/// `/_fake/...` control routes (no auth, no faults, no latency).
async fn control(
    app: &Arc<App>,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    body: Body,
) -> ApiResult {
    match (method.as_str(), path.trim_end_matches('/')) {
        ("GET", "stats") => ok(serde_json::to_value(crate::stats_of(app)).unwrap_or(Value::Null)),
        ("POST", "reset") => {
            crate::reset(app);
            ok(json!({"reset": true}))
        }
        ("PUT" | "POST", "faults") => {
            let bytes = axum::body::to_bytes(body, 1024 * 1024)
                .await
                .map_err(|_| ApiError::bad_request("body", "could not read the body"))?;
            let spec = String::from_utf8_lossy(&bytes);
            let parsed = Faults::parse(&spec).map_err(|e| ApiError::bad_request("faults", e))?;
            *app.faults() = parsed;
            ok(json!({"faults": spec}))
        }
        ("PUT" | "POST", "max-live") => {
            let max = query
                .iter()
                .find(|(k, _)| k == "n")
                .and_then(|(_, v)| v.parse::<u64>().ok())
                .ok_or_else(|| ApiError::bad_request("n", "a whole number is required"))?;
            app.max_live.store(max, std::sync::atomic::Ordering::SeqCst);
            ok(json!({"max_live": max}))
        }
        ("POST", "clock/advance") => {
            let secs = query
                .iter()
                .find(|(k, _)| k == "seconds")
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| {
                    ApiError::bad_request("seconds", "a non-negative number is required")
                })?;
            crate::advance(app, Duration::from_secs_f64(secs));
            ok(json!({"advanced_seconds": secs}))
        }
        ("GET", p) if p.starts_with("desktop/") => {
            computer::inspect(app, &percent_decode(&p["desktop/".len()..]))
        }
        _ => Err(ApiError::not_found("no such control route")),
    }
}
