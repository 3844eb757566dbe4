//! Computer use (contract §2.11): the `/v1/sandboxes/{id}/computer/...` routes and the
//! `GET /_fake/desktop/{id}` control route. They find the guest, start its [`Desktop`] on the
//! first call (guests of any other rootfs answer 501), check the request and act on the desktop.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::desktop::{
    DEFAULT_SIZE, DESKTOP_ROOTFS, DIM_RANGE, Desktop, MAX_SCREENS, PngStream, Scene, Screen,
    WinState, Window,
};
use crate::jsend::{ApiError, ApiResult, ok};
use crate::request::Req;
use crate::state::{App, Sandbox, Status};
use crate::util::{random_id, rfc3339};

/// How long a noVNC link is valid.
const LINK_TTL: Duration = Duration::from_secs(600);

/// `GET /_fake/desktop/{id}`: the desktop's full state and its action log (404 if the sandbox
/// has none yet).
pub(crate) fn inspect(app: &App, sid: &str) -> ApiResult {
    let inner = app.lock();
    let sb = inner
        .sandbox(sid)
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    let desk = sb
        .desktop
        .as_ref()
        .ok_or_else(|| ApiError::not_found("this sandbox has no started desktop"))?;
    ok(desk.inspect())
}

// ---- request parsing -----------------------------------------------------------------------

/// `screen-N` (N in 0..=7) to N.
fn parse_screen_id(s: &str) -> Option<u8> {
    s.strip_prefix("screen-")
        .filter(|n| n.len() == 1)
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| *n < MAX_SCREENS)
}

/// The `screen_id` query: `Some(N)` when given, `None` when absent or empty; 400 if malformed.
fn screen_query(req: &Req) -> Result<Option<u8>, ApiError> {
    match req.q("screen_id") {
        None | Some("") => Ok(None),
        Some(s) => parse_screen_id(s).map(Some).ok_or_else(|| {
            ApiError::bad_request("screen_id", "must be one of screen-0 … screen-7")
        }),
    }
}

fn int(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .filter(|n| i32::try_from(*n).is_ok())
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(key, "must be an integer")),
    }
}

fn required_int(body: &Map<String, Value>, key: &str) -> Result<i64, ApiError> {
    int(body, key)?.ok_or_else(|| ApiError::bad_request(key, "is required"))
}

fn string(body: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(key, "must be a string")),
    }
}

fn required_text(body: &Map<String, Value>, key: &str) -> Result<String, ApiError> {
    string(body, key)?
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request(key, "is required"))
}

/// A dimension in [`DIM_RANGE`].
fn dim(key: &str, v: i64) -> Result<u32, ApiError> {
    u32::try_from(v)
        .ok()
        .filter(|v| DIM_RANGE.contains(v))
        .ok_or_else(|| {
            ApiError::bad_request(
                key,
                format!(
                    "must be between {} and {}",
                    DIM_RANGE.start(),
                    DIM_RANGE.end()
                ),
            )
        })
}

/// A point that lies on the screen.
fn on_screen(s: &Screen, field: &str, x: i64, y: i64) -> Result<(u32, u32), ApiError> {
    match (u32::try_from(x), u32::try_from(y)) {
        (Ok(px), Ok(py)) if px < s.width && py < s.height => Ok((px, py)),
        _ => Err(ApiError::bad_request(
            field,
            format!(
                "({x}, {y}) is outside {} ({}x{})",
                s.id(),
                s.width,
                s.height
            ),
        )),
    }
}

/// A `{x, y}` object.
fn point(body: &Map<String, Value>, key: &str) -> Result<(i64, i64), ApiError> {
    let o = body
        .get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::bad_request(key, "must be an object {x, y}"))?;
    let x = int(o, "x")?.ok_or_else(|| ApiError::bad_request(key, "x is required"))?;
    let y = int(o, "y")?.ok_or_else(|| ApiError::bad_request(key, "y is required"))?;
    Ok((x, y))
}

fn button(body: &Map<String, Value>) -> Result<String, ApiError> {
    match string(body, "button")?.as_deref() {
        None => Ok("left".into()),
        Some(b @ ("left" | "middle" | "right")) => Ok(b.to_owned()),
        Some(_) => Err(ApiError::bad_request(
            "button",
            "must be one of left, middle, right",
        )),
    }
}

fn keys(body: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad_request("keys", "must be a non-empty list of key names");
    let list = body.get("keys").and_then(Value::as_array).ok_or_else(bad)?;
    let keys: Vec<String> = list
        .iter()
        .map(|k| {
            k.as_str()
                .filter(|k| !k.trim().is_empty())
                .map(str::to_owned)
        })
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if keys.is_empty() {
        return Err(bad());
    }
    Ok(keys)
}

/// A non-negative integer query parameter (`None` when absent or empty).
fn query_num(req: &Req, key: &str) -> Result<Option<u32>, ApiError> {
    match req.q(key) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<u32>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(key, "must be a non-negative integer")),
    }
}

fn done() -> ApiResult {
    ok(json!({"ok": true}))
}

// ---- dispatch ------------------------------------------------------------------------------

/// Every `/v1/sandboxes/{id}/computer/...` route.
pub(crate) async fn dispatch(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = if matches!(req.method, Method::POST | Method::PUT) {
        req.json().await?
    } else {
        Map::new()
    };
    let sub = req.sub().to_owned();
    let segs: Vec<&str> = sub.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method.clone();
    let mut inner = app.lock();
    let sb = inner
        .sandbox_mut(req.sid())
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    let desktop = desktop_of(sb)?;
    route(desktop, &method, &segs, req, &body, req.sid())
}

/// The guest's desktop, started on first use; 501 for a guest without one, 409 unless running.
fn desktop_of(sb: &mut Sandbox) -> Result<&mut Desktop, ApiError> {
    if sb.rootfs != DESKTOP_ROOTFS {
        return Err(ApiError::error(
            501,
            format!(
                "computer use needs the {DESKTOP_ROOTFS} rootfs; this sandbox runs {}",
                sb.rootfs
            ),
        ));
    }
    match sb.status {
        Status::Running => {}
        Status::Paused | Status::Pausing => {
            return Err(ApiError::conflict(
                "sandbox is paused; resume it before using the desktop",
            ));
        }
        other => {
            return Err(ApiError::conflict(format!(
                "sandbox is {}; it must be running",
                other.as_str()
            )));
        }
    }
    Ok(sb.desktop.get_or_insert_with(Desktop::new))
}

fn not_allowed() -> ApiError {
    ApiError::error(405, "method not allowed")
}

fn route(
    desk: &mut Desktop,
    method: &Method,
    segs: &[&str],
    req: &Req,
    body: &Map<String, Value>,
    sandbox_id: &str,
) -> ApiResult {
    let get = *method == Method::GET;
    let post = *method == Method::POST;
    match segs {
        ["screens", rest @ ..] => screens(desk, method, rest, body, sandbox_id),
        ["windows", rest @ ..] => windows(desk, method, rest, req, body),
        _ => {
            let asked = screen_query(req)?;
            let si = asked.unwrap_or(0);
            desk.screen(si)?;
            match segs {
                ["screenshot"] if get => screenshot(desk, si, req),
                ["screen"] if get => {
                    let s = desk.screen(si)?;
                    ok(json!({"width": s.width, "height": s.height}))
                }
                ["cursor"] if get => {
                    let (x, y) = desk.screen(si)?.cursor;
                    ok(json!({"x": x, "y": y}))
                }
                ["clipboard"] if get => ok(json!({"text": desk.screen(si)?.clipboard})),
                ["clipboard"] if *method == Method::PUT => {
                    let text = string(body, "text")?
                        .ok_or_else(|| ApiError::bad_request("text", "is required"))?;
                    desk.screen_mut(si)?.clipboard.clone_from(&text);
                    desk.record(Some(si), "clipboard.set", json!({"text": text}));
                    done()
                }
                ["open"] if post => {
                    let target = required_text(body, "target")?;
                    let application =
                        if target.starts_with("http://") || target.starts_with("https://") {
                            "firefox"
                        } else {
                            "xdg-open"
                        };
                    let id = desk.open_window(si, application.into(), target.clone());
                    desk.record(Some(si), "open", json!({"target": target, "window_id": id}));
                    done()
                }
                ["launch"] if post => {
                    let application = required_text(body, "application")?;
                    let uri = string(body, "uri")?.filter(|u| !u.is_empty());
                    let title = uri.clone().unwrap_or_else(|| application.clone());
                    let id = desk.open_window(si, application.clone(), title);
                    desk.record(
                        Some(si),
                        "launch",
                        json!({"application": application, "uri": uri, "window_id": id}),
                    );
                    done()
                }
                ["mouse", action] if post => mouse(desk, si, action, body),
                ["keyboard", action] if post => keyboard(desk, si, action, body),
                ["screenshot" | "screen" | "cursor" | "clipboard" | "open" | "launch"]
                | ["mouse" | "keyboard", _] => Err(not_allowed()),
                _ => Err(ApiError::not_found("no such computer route")),
            }
        }
    }
}

fn mouse(desk: &mut Desktop, si: u8, action: &str, body: &Map<String, Value>) -> ApiResult {
    let s = desk.screen(si)?;
    let event = match action {
        "move" => {
            let (x, y) = (required_int(body, "x")?, required_int(body, "y")?);
            let to = on_screen(s, "x", x, y)?;
            desk.screen_mut(si)?.cursor = to;
            json!({"x": to.0, "y": to.1})
        }
        "click" => {
            let b = button(body)?;
            let at = match (int(body, "x")?, int(body, "y")?) {
                (Some(x), Some(y)) => Some(on_screen(s, "x", x, y)?),
                (None, None) => None,
                _ => {
                    return Err(ApiError::bad_request("x", "x and y must be given together"));
                }
            };
            let count = match int(body, "count")? {
                None => 1,
                Some(c @ 1..=10) => c,
                Some(_) => return Err(ApiError::bad_request("count", "must be between 1 and 10")),
            };
            let screen = desk.screen_mut(si)?;
            if let Some(p) = at {
                screen.cursor = p;
            }
            let (x, y) = screen.cursor;
            json!({"button": b, "x": x, "y": y, "count": count})
        }
        "scroll" => {
            let direction = match string(body, "direction")?.as_deref() {
                None => "down".to_owned(),
                Some(v @ ("up" | "down")) => v.to_owned(),
                Some(_) => return Err(ApiError::bad_request("direction", "must be up or down")),
            };
            let amount = match int(body, "amount")? {
                None => 1,
                Some(a @ 1..=1000) => a,
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "amount",
                        "must be between 1 and 1000",
                    ));
                }
            };
            json!({"direction": direction, "amount": amount})
        }
        "drag" => {
            let (fx, fy) = point(body, "from")?;
            let (tx, ty) = point(body, "to")?;
            let from = on_screen(s, "from", fx, fy)?;
            let to = on_screen(s, "to", tx, ty)?;
            desk.screen_mut(si)?.cursor = to;
            json!({"from": {"x": from.0, "y": from.1}, "to": {"x": to.0, "y": to.1}})
        }
        "down" | "up" => {
            let b = button(body)?;
            let screen = desk.screen_mut(si)?;
            if action == "down" {
                screen.buttons.insert(b.clone());
            } else {
                screen.buttons.remove(&b);
            }
            json!({"button": b})
        }
        _ => return Err(ApiError::not_found("no such mouse action")),
    };
    desk.record(Some(si), &format!("mouse.{action}"), event);
    done()
}

fn keyboard(desk: &mut Desktop, si: u8, action: &str, body: &Map<String, Value>) -> ApiResult {
    let event = match action {
        "type" => {
            let text = string(body, "text")?
                .ok_or_else(|| ApiError::bad_request("text", "is required"))?;
            let delay = match int(body, "delay_in_ms")? {
                None => None,
                Some(ms @ 0..=10_000) => Some(ms),
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "delay_in_ms",
                        "must be between 0 and 10000",
                    ));
                }
            };
            let focused = desk.focused(si).map(|w| w.id.clone());
            if let Some(id) = &focused
                && let Ok(w) = desk.window_mut(id, None)
            {
                w.typed.push_str(&text);
            }
            json!({"text": text, "delay_in_ms": delay, "window_id": focused})
        }
        "press" | "down" | "up" => {
            let keys = keys(body)?;
            let screen = desk.screen_mut(si)?;
            for k in &keys {
                if action == "down" {
                    screen.keys.insert(k.clone());
                } else if action == "up" {
                    screen.keys.remove(k);
                }
            }
            json!({"keys": keys})
        }
        _ => return Err(ApiError::not_found("no such keyboard action")),
    };
    desk.record(Some(si), &format!("keyboard.{action}"), event);
    done()
}

fn windows(
    desk: &mut Desktop,
    method: &Method,
    rest: &[&str],
    req: &Req,
    body: &Map<String, Value>,
) -> ApiResult {
    let asked = screen_query(req)?;
    let si = asked.unwrap_or(0);
    desk.screen(si)?;
    let get = *method == Method::GET;
    let post = *method == Method::POST;
    let view = |w: &Window| json!({"id": w.id, "title": w.title});
    match rest {
        [] if get => {
            let app_filter = req.q("application").filter(|a| !a.is_empty());
            let s = desk.screen(si)?;
            let rows: Vec<Value> = s
                .stack
                .iter()
                .filter_map(|id| desk.windows.iter().find(|w| &w.id == id))
                .filter(|w| app_filter.is_none_or(|a| w.application == a))
                .map(view)
                .collect();
            ok(Value::Array(rows))
        }
        ["current"] if get => desk
            .focused(si)
            .map(view)
            .map_or_else(|| Err(ApiError::not_found("no window has the focus")), ok),
        [wid] if get => ok(view(desk.window(wid, asked)?)),
        [wid] if *method == Method::DELETE => {
            let id = desk.window(wid, asked)?.id.clone();
            desk.windows.retain(|w| w.id != id);
            for s in &mut desk.screens {
                s.stack.retain(|x| *x != id);
            }
            desk.record(Some(si), "window.close", json!({"window_id": id}));
            done()
        }
        [wid, "geometry"] if get => {
            let w = desk.window(wid, asked)?;
            let (x, y, width, height) = desk.geometry(w).unwrap_or((w.x, w.y, w.width, w.height));
            ok(
                json!({"id": w.id, "x": x, "y": y, "width": width, "height": height, "screen": w.screen}),
            )
        }
        [
            wid,
            action @ ("focus" | "maximize" | "minimize" | "restore" | "move" | "resize"),
        ] if post => {
            let id = desk.window(wid, asked)?.id.clone();
            let mut event = json!({"window_id": id});
            match *action {
                "move" => {
                    let (x, y) = (required_int(body, "x")?, required_int(body, "y")?);
                    let w = desk.window_mut(&id, None)?;
                    (w.x, w.y, w.state) = (x, y, WinState::Normal);
                    event["x"] = json!(x);
                    event["y"] = json!(y);
                }
                "resize" => {
                    let width = dim("width", required_int(body, "width")?)?;
                    let height = dim("height", required_int(body, "height")?)?;
                    let w = desk.window_mut(&id, None)?;
                    (w.width, w.height, w.state) = (width, height, WinState::Normal);
                    event["width"] = json!(width);
                    event["height"] = json!(height);
                }
                "focus" => {
                    let w = desk.window_mut(&id, None)?;
                    if w.state == WinState::Minimized {
                        w.state = WinState::Normal;
                    }
                    desk.raise(&id);
                }
                "maximize" => {
                    desk.window_mut(&id, None)?.state = WinState::Maximized;
                    desk.raise(&id);
                }
                "minimize" => desk.window_mut(&id, None)?.state = WinState::Minimized,
                _ => {
                    desk.window_mut(&id, None)?.state = WinState::Normal;
                    desk.raise(&id);
                }
            }
            desk.record(Some(si), &format!("window.{action}"), event);
            done()
        }
        []
        | [_]
        | [
            _,
            "geometry" | "focus" | "maximize" | "minimize" | "restore" | "move" | "resize",
        ] => Err(not_allowed()),
        _ => Err(ApiError::not_found("no such windows route")),
    }
}

fn screens(
    desk: &mut Desktop,
    method: &Method,
    rest: &[&str],
    body: &Map<String, Value>,
    sandbox_id: &str,
) -> ApiResult {
    let get = *method == Method::GET;
    let post = *method == Method::POST;
    let index = |sid: &str| {
        parse_screen_id(sid)
            .ok_or_else(|| ApiError::bad_request("screen_id", "must be one of screen-0 … screen-7"))
    };
    match rest {
        [] if get => {
            let mut rows: Vec<&Screen> = desk.screens.iter().collect();
            rows.sort_by_key(|s| s.index);
            ok(Value::Array(
                rows.into_iter().map(Screen::to_json).collect(),
            ))
        }
        [] if post => {
            let width = int(body, "width")?
                .filter(|w| *w != 0)
                .map(|w| dim("width", w))
                .transpose()?
                .unwrap_or(DEFAULT_SIZE.0);
            let height = int(body, "height")?
                .filter(|h| *h != 0)
                .map(|h| dim("height", h))
                .transpose()?
                .unwrap_or(DEFAULT_SIZE.1);
            let free = (0..MAX_SCREENS)
                .find(|i| !desk.screens.iter().any(|s| s.index == *i))
                .ok_or_else(|| {
                    ApiError::conflict(format!("all {MAX_SCREENS} screens are in use"))
                })?;
            let s = Screen::new(free, (width, height));
            let v = s.to_json();
            desk.screens.push(s);
            desk.record(
                Some(free),
                "screen.create",
                json!({"width": width, "height": height}),
            );
            ok(v)
        }
        [sid] if get => ok(desk.screen(index(sid)?)?.to_json()),
        [sid] if *method == Method::DELETE => {
            let i = index(sid)?;
            desk.screen(i)?;
            if i == 0 {
                return Err(ApiError::conflict("screen-0 is the primary display"));
            }
            desk.screens.retain(|s| s.index != i);
            desk.windows.retain(|w| w.screen != i);
            desk.record(Some(i), "screen.delete", json!({}));
            done()
        }
        [sid, "connect"] if get => {
            let s = desk.screen(index(sid)?)?;
            let novnc = 6080 + u32::from(s.index);
            let token = random_id(32);
            let expires_at = rfc3339(SystemTime::now() + LINK_TTL);
            let url = format!(
                "https://{novnc}-{sandbox_id}.fake.localhost/vnc.html?autoconnect=1&token={token}"
            );
            let v = json!({
                "screen_id": s.id(),
                "port": novnc,
                "path": "/vnc.html",
                "token": token,
                "expires_at": expires_at,
                "url": url,
            });
            let i = s.index;
            desk.record(Some(i), "screen.connect", json!({"expires_at": expires_at}));
            ok(v)
        }
        [sid, "resize"] if post => {
            let i = index(sid)?;
            desk.screen(i)?;
            let width = dim("width", required_int(body, "width")?)?;
            let height = dim("height", required_int(body, "height")?)?;
            let s = desk.screen_mut(i)?;
            s.width = width;
            s.height = height;
            s.cursor = (s.cursor.0.min(width - 1), s.cursor.1.min(height - 1));
            let v = s.to_json();
            desk.record(
                Some(i),
                "screen.resize",
                json!({"width": width, "height": height}),
            );
            ok(v)
        }
        [] | [_] | [_, "connect" | "resize"] => Err(not_allowed()),
        _ => Err(ApiError::not_found("no such screens route")),
    }
}

/// `GET /screenshot`: the screen, a window (`window_id`) or a region (`x`, `y`, `width`,
/// `height`, relative to the screen or window) as a PNG of exactly that size.
fn screenshot(desk: &Desktop, si: u8, req: &Req) -> ApiResult {
    let s = desk.screen(si)?;
    // The area the region is relative to: the whole screen, or a window clipped to it.
    let (ax, ay, aw, ah) = match req.q("window_id").filter(|w| !w.is_empty()) {
        None => (0, 0, i64::from(s.width), i64::from(s.height)),
        Some(wid) => {
            let w = desk.window(wid, Some(si))?;
            let (x, y, width, height) = desk
                .geometry(w)
                .ok_or_else(|| ApiError::conflict(format!("window {wid} is minimized")))?;
            let (x0, y0) = (x.max(0), y.max(0));
            let x1 = (x + i64::from(width)).min(i64::from(s.width));
            let y1 = (y + i64::from(height)).min(i64::from(s.height));
            if x1 <= x0 || y1 <= y0 {
                return Err(ApiError::conflict(format!(
                    "window {wid} is off the screen"
                )));
            }
            (x0, y0, x1 - x0, y1 - y0)
        }
    };
    let rx = i64::from(query_num(req, "x")?.unwrap_or(0));
    let ry = i64::from(query_num(req, "y")?.unwrap_or(0));
    let rw = query_num(req, "width")?
        .filter(|w| *w != 0)
        .map_or(aw - rx, i64::from);
    let rh = query_num(req, "height")?
        .filter(|h| *h != 0)
        .map_or(ah - ry, i64::from);
    if rx >= aw || ry >= ah || rw <= 0 || rh <= 0 || rx + rw > aw || ry + rh > ah {
        return Err(ApiError::bad_request(
            "region",
            format!(
                "x={rx} y={ry} width={rw} height={rh} does not fit in the {aw}x{ah} capture area"
            ),
        ));
    }
    let scene = Scene::of(desk, si)?;
    let (w, h) = (
        u32::try_from(rw).unwrap_or(0),
        u32::try_from(rh).unwrap_or(0),
    );
    let png = PngStream::new(scene, ax + rx, ay + ry, w, h);
    let len = png.total_len();
    let stream = futures::stream::unfold(png, |mut png| async move {
        png.next_chunk()
            .map(|chunk| (Ok::<Bytes, Infallible>(chunk), png))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "image/png")
        .header(header::CONTENT_LENGTH, len)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(stream))
        .unwrap_or_default())
}
