//! Computer use (contract §2.11): a small simulated desktop for guests of the `desktop:1`
//! rootfs. Nothing is drawn by a real X server: the fake keeps the desktop's state (screens,
//! cursor, clipboard, windows, pressed keys and buttons) and a log of every accepted action, and
//! renders screenshots from that state as real PNG files (stored deflate blocks, so no
//! compression crate is needed). Guests of any other rootfs answer 501.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::jsend::{ApiError, ApiResult, ok};
use crate::server::Req;
use crate::state::{App, Sandbox, Status};
use crate::util::{now_rfc3339, random_id, rfc3339};

/// The rootfs whose guests have a desktop.
pub(crate) const DESKTOP_ROOTFS: &str = "desktop:1";
/// `screen-0` … `screen-7`.
const MAX_SCREENS: u8 = 8;
/// Size of `screen-0` and of a screen created without a size.
const DEFAULT_SIZE: (u32, u32) = (1280, 800);
/// Smallest and largest accepted screen and window dimension.
const DIM_RANGE: std::ops::RangeInclusive<u32> = 64..=3840;
/// How many recorded actions a desktop keeps (oldest dropped first).
const MAX_EVENTS: usize = 1000;
/// How long a noVNC link is valid.
const LINK_TTL: Duration = Duration::from_secs(600);
/// Height of a window's title bar in screenshots.
const TITLE_BAR: i64 = 24;
/// Side of the square drawn for the cursor in screenshots.
const CURSOR: i64 = 6;

/// A window's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WinState {
    Normal,
    Maximized,
    Minimized,
}

impl WinState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Maximized => "maximized",
            Self::Minimized => "minimized",
        }
    }
}

/// One window (created by `open` or `launch`).
#[derive(Debug, Clone)]
struct Window {
    id: String,
    title: String,
    application: String,
    screen: u8,
    /// Geometry when `Normal` (kept while maximized or minimized, for `restore`).
    x: i64,
    y: i64,
    width: u32,
    height: u32,
    state: WinState,
    /// Text typed while the window had the focus.
    typed: String,
}

/// One virtual screen (an X display).
#[derive(Debug, Clone)]
struct Screen {
    index: u8,
    width: u32,
    height: u32,
    cursor: (u32, u32),
    clipboard: String,
    /// Window ids on this screen, bottom to top; the top non-minimized one has the focus.
    stack: Vec<String>,
    buttons: BTreeSet<String>,
    keys: BTreeSet<String>,
}

impl Screen {
    fn new(index: u8, (width, height): (u32, u32)) -> Self {
        Self {
            index,
            width,
            height,
            cursor: (width / 2, height / 2),
            clipboard: String::new(),
            stack: Vec::new(),
            buttons: BTreeSet::new(),
            keys: BTreeSet::new(),
        }
    }

    fn id(&self) -> String {
        format!("screen-{}", self.index)
    }

    fn to_json(&self) -> Value {
        let n = u32::from(self.index);
        json!({
            "screen_id": self.id(),
            "display": format!(":{n}"),
            "width": self.width,
            "height": self.height,
            "vnc_port": 5900 + n,
            "novnc_port": 6080 + n,
        })
    }
}

/// A guest's desktop: its screens, windows and the log of accepted actions.
#[derive(Debug, Clone)]
pub(crate) struct Desktop {
    screens: Vec<Screen>,
    windows: Vec<Window>,
    next_window: u32,
    events: Vec<Value>,
}

impl Desktop {
    fn new() -> Self {
        Self {
            screens: vec![Screen::new(0, DEFAULT_SIZE)],
            windows: Vec::new(),
            next_window: 1,
            events: Vec::new(),
        }
    }

    fn screen(&self, index: u8) -> Result<&Screen, ApiError> {
        self.screens
            .iter()
            .find(|s| s.index == index)
            .ok_or_else(|| ApiError::not_found(format!("screen-{index} not found")))
    }

    fn screen_mut(&mut self, index: u8) -> Result<&mut Screen, ApiError> {
        self.screens
            .iter_mut()
            .find(|s| s.index == index)
            .ok_or_else(|| ApiError::not_found(format!("screen-{index} not found")))
    }

    fn window(&self, id: &str, screen: Option<u8>) -> Result<&Window, ApiError> {
        self.windows
            .iter()
            .find(|w| w.id == id && screen.is_none_or(|s| s == w.screen))
            .ok_or_else(|| ApiError::not_found(format!("window {id} not found")))
    }

    fn window_mut(&mut self, id: &str, screen: Option<u8>) -> Result<&mut Window, ApiError> {
        self.windows
            .iter_mut()
            .find(|w| w.id == id && screen.is_none_or(|s| s == w.screen))
            .ok_or_else(|| ApiError::not_found(format!("window {id} not found")))
    }

    /// The focused window of a screen: the topmost one that is not minimized.
    fn focused(&self, screen: u8) -> Option<&Window> {
        let s = self.screens.iter().find(|s| s.index == screen)?;
        s.stack
            .iter()
            .rev()
            .filter_map(|id| self.windows.iter().find(|w| &w.id == id))
            .find(|w| w.state != WinState::Minimized)
    }

    /// Puts a window on top of its screen's stack (it gets the focus unless minimized).
    fn raise(&mut self, id: &str) {
        if let Some(w) = self.windows.iter().find(|w| w.id == id)
            && let Some(s) = self.screens.iter_mut().find(|s| s.index == w.screen)
        {
            s.stack.retain(|x| x != id);
            s.stack.push(id.to_owned());
        }
    }

    /// The on-screen rectangle of a window (`None` while minimized).
    fn geometry(&self, w: &Window) -> Option<(i64, i64, u32, u32)> {
        match w.state {
            WinState::Minimized => None,
            WinState::Normal => Some((w.x, w.y, w.width, w.height)),
            WinState::Maximized => {
                let s = self.screens.iter().find(|s| s.index == w.screen)?;
                Some((0, 0, s.width, s.height))
            }
        }
    }

    fn open_window(&mut self, screen: u8, application: String, title: String) -> String {
        let (sw, sh) = self
            .screens
            .iter()
            .find(|s| s.index == screen)
            .map_or(DEFAULT_SIZE, |s| (s.width, s.height));
        let k = i64::from(self.next_window % 8);
        let id = format!("0x{:08x}", 0x0040_0000 + self.next_window);
        self.next_window += 1;
        self.windows.push(Window {
            id: id.clone(),
            title,
            application,
            screen,
            x: 40 + 30 * k,
            y: 40 + 30 * k,
            width: sw.saturating_sub(160).clamp(*DIM_RANGE.start(), 960),
            height: sh.saturating_sub(160).clamp(*DIM_RANGE.start(), 600),
            state: WinState::Normal,
            typed: String::new(),
        });
        self.raise(&id);
        id
    }

    fn record(&mut self, screen: Option<u8>, action: &str, fields: Value) {
        let mut e = Map::new();
        e.insert("at".into(), json!(now_rfc3339()));
        if let Some(s) = screen {
            e.insert("screen_id".into(), json!(format!("screen-{s}")));
        }
        e.insert("action".into(), json!(action));
        if let Value::Object(f) = fields {
            e.extend(f);
        }
        self.events.push(Value::Object(e));
        if self.events.len() > MAX_EVENTS {
            let extra = self.events.len() - MAX_EVENTS;
            self.events.drain(..extra);
        }
    }

    /// Everything the fake knows about this desktop (for `GET /_fake/desktop/{id}`).
    fn inspect(&self) -> Value {
        let screens: Vec<Value> = self
            .screens
            .iter()
            .map(|s| {
                let mut v = s.to_json();
                v["cursor"] = json!({"x": s.cursor.0, "y": s.cursor.1});
                v["clipboard"] = json!(s.clipboard);
                v["focused_window"] = json!(self.focused(s.index).map(|w| w.id.clone()));
                v["stack"] = json!(s.stack);
                v["pressed_buttons"] = json!(s.buttons);
                v["pressed_keys"] = json!(s.keys);
                v
            })
            .collect();
        let windows: Vec<Value> = self
            .windows
            .iter()
            .map(|w| {
                json!({
                    "id": w.id,
                    "title": w.title,
                    "application": w.application,
                    "screen": w.screen,
                    "state": w.state.as_str(),
                    "x": w.x, "y": w.y, "width": w.width, "height": w.height,
                    "typed": w.typed,
                })
            })
            .collect();
        json!({"screens": screens, "windows": windows, "events": self.events})
    }
}

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

// ---- screenshots ---------------------------------------------------------------------------

/// A rectangle drawn in a screenshot, in screen coordinates.
#[derive(Debug, Clone, Copy)]
struct Rect {
    x: i64,
    y: i64,
    w: i64,
    h: i64,
    rgb: [u8; 3],
}

/// What a screenshot shows: the background, then rectangles bottom to top.
#[derive(Debug, Clone)]
struct Scene {
    rects: Vec<Rect>,
}

const BACKGROUND: [u8; 3] = [0x2e, 0x34, 0x40];
const WINDOW_BODY: [u8; 3] = [0xec, 0xef, 0xf4];
const TITLE_FOCUSED: [u8; 3] = [0x5e, 0x81, 0xac];
const TITLE_OTHER: [u8; 3] = [0x4c, 0x56, 0x6a];
const CURSOR_RGB: [u8; 3] = [0xff, 0xff, 0xff];

impl Scene {
    fn of(desk: &Desktop, si: u8) -> Result<Self, ApiError> {
        let s = desk.screen(si)?;
        let focused = desk.focused(si).map(|w| w.id.clone());
        let mut rects = Vec::new();
        for id in &s.stack {
            let Some(w) = desk.windows.iter().find(|w| &w.id == id) else {
                continue;
            };
            let Some((x, y, width, height)) = desk.geometry(w) else {
                continue;
            };
            let (width, height) = (i64::from(width), i64::from(height));
            rects.push(Rect {
                x,
                y,
                w: width,
                h: height,
                rgb: WINDOW_BODY,
            });
            let title = if focused.as_deref() == Some(w.id.as_str()) {
                TITLE_FOCUSED
            } else {
                TITLE_OTHER
            };
            rects.push(Rect {
                x,
                y,
                w: width,
                h: TITLE_BAR.min(height),
                rgb: title,
            });
        }
        rects.push(Rect {
            x: i64::from(s.cursor.0),
            y: i64::from(s.cursor.1),
            w: CURSOR,
            h: CURSOR,
            rgb: CURSOR_RGB,
        });
        Ok(Self { rects })
    }

    /// One row of the region starting at screen column `x0`, `out.len() / 3` pixels wide.
    fn row(&self, y: i64, x0: i64, out: &mut [u8]) {
        for px in out.chunks_exact_mut(3) {
            px.copy_from_slice(&BACKGROUND);
        }
        let w = i64::try_from(out.len() / 3).unwrap_or(0);
        for r in &self.rects {
            if y < r.y || y >= r.y + r.h {
                continue;
            }
            let from = (r.x - x0).clamp(0, w);
            let to = (r.x + r.w - x0).clamp(0, w);
            for px in (from..to).filter_map(|i| usize::try_from(i).ok()) {
                out[px * 3..px * 3 + 3].copy_from_slice(&r.rgb);
            }
        }
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

// ---- PNG encoding (RGB, 8 bits, no interlace; one IDAT with stored deflate blocks) ---------

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0u32;
    while n < 256 {
        let mut c = n;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[n as usize] = c;
        n += 1;
    }
    table
};

/// CRC-32 (ISO 3309, as PNG uses it), fed incrementally; starts at `0xffff_ffff`.
fn crc_update(mut crc: u32, bytes: &[u8]) -> u32 {
    for b in bytes {
        crc = CRC_TABLE[((crc ^ u32::from(*b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// A chunk's bytes: length, type, data, CRC over type and data.
fn png_chunk(kind: [u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + data.len());
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&kind);
    out.extend_from_slice(data);
    let crc = crc_update(crc_update(0xffff_ffff, &kind), data) ^ 0xffff_ffff;
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Largest stored deflate block.
const BLOCK: u64 = 65_535;

/// Produces a PNG chunk by chunk (about 64 KiB each) without holding the whole image.
struct PngStream {
    scene: Scene,
    x0: i64,
    y0: i64,
    width: u32,
    height: u32,
    /// Raw (filtered) image bytes not yet emitted: one filter byte plus RGB per row.
    raw_left: u64,
    next_row: u32,
    row: Vec<u8>,
    row_pos: usize,
    crc: u32,
    adler: (u32, u32),
    stage: u8,
}

impl PngStream {
    fn new(scene: Scene, x0: i64, y0: i64, width: u32, height: u32) -> Self {
        let row_len = 1 + 3 * u64::from(width);
        Self {
            scene,
            x0,
            y0,
            width,
            height,
            raw_left: row_len * u64::from(height),
            next_row: 0,
            row: Vec::new(),
            row_pos: 0,
            crc: 0xffff_ffff,
            adler: (1, 0),
            stage: 0,
        }
    }

    fn raw_len(&self) -> u64 {
        (1 + 3 * u64::from(self.width)) * u64::from(self.height)
    }

    /// The zlib stream's length: header, stored blocks (5 header bytes each), Adler-32.
    fn zlib_len(&self) -> u64 {
        let raw = self.raw_len();
        2 + raw + 5 * raw.div_ceil(BLOCK) + 4
    }

    /// The exact size of the file (the `Content-Length`).
    fn total_len(&self) -> u64 {
        8 + (12 + 13) + (12 + self.zlib_len()) + 12
    }

    /// Copies the next `n` raw bytes into `out`, rendering rows as needed.
    fn fill(&mut self, out: &mut Vec<u8>, mut n: usize) {
        while n > 0 {
            if self.row_pos == self.row.len() {
                let width = usize::try_from(self.width).unwrap_or(0);
                self.row.clear();
                self.row.resize(1 + 3 * width, 0);
                let y = self.y0 + i64::from(self.next_row);
                self.scene.row(y, self.x0, &mut self.row[1..]);
                self.next_row += 1;
                self.row_pos = 0;
            }
            let take = n.min(self.row.len() - self.row_pos);
            out.extend_from_slice(&self.row[self.row_pos..self.row_pos + take]);
            self.row_pos += take;
            n -= take;
        }
    }

    fn adler_update(&mut self, bytes: &[u8]) {
        const MOD: u32 = 65_521;
        let (mut a, mut b) = self.adler;
        for chunk in bytes.chunks(5552) {
            for x in chunk {
                a += u32::from(*x);
                b += a;
            }
            a %= MOD;
            b %= MOD;
        }
        self.adler = (a, b);
    }

    fn next_chunk(&mut self) -> Option<Bytes> {
        match self.stage {
            0 => {
                self.stage = 1;
                let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
                let mut ihdr = Vec::with_capacity(13);
                ihdr.extend_from_slice(&self.width.to_be_bytes());
                ihdr.extend_from_slice(&self.height.to_be_bytes());
                // Bit depth 8, colour type 2 (RGB), deflate, adaptive filtering, no interlace.
                ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
                out.extend_from_slice(&png_chunk(*b"IHDR", &ihdr));
                let zlen = u32::try_from(self.zlib_len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&zlen.to_be_bytes());
                // IDAT: its CRC covers the type and every data byte that follows.
                let head = [b'I', b'D', b'A', b'T', 0x78, 0x01];
                self.crc = crc_update(self.crc, &head);
                out.extend_from_slice(&head);
                Some(Bytes::from(out))
            }
            1 => {
                let len = self.raw_left.min(BLOCK);
                self.raw_left -= len;
                let last = self.raw_left == 0;
                let len16 = u16::try_from(len).unwrap_or(u16::MAX);
                let mut out = Vec::with_capacity(5 + usize::from(len16) + 8 + 12);
                out.push(u8::from(last));
                out.extend_from_slice(&len16.to_le_bytes());
                out.extend_from_slice(&(!len16).to_le_bytes());
                self.fill(&mut out, usize::from(len16));
                self.adler_update(&out[5..]);
                if last {
                    let (a, b) = self.adler;
                    out.extend_from_slice(&((b << 16) | a).to_be_bytes());
                }
                self.crc = crc_update(self.crc, &out);
                if last {
                    out.extend_from_slice(&(self.crc ^ 0xffff_ffff).to_be_bytes());
                    out.extend_from_slice(&png_chunk(*b"IEND", &[]));
                    self.stage = 2;
                }
                Some(Bytes::from(out))
            }
            _ => None,
        }
    }
}
