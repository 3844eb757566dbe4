//! Computer use on desktop sandboxes (`/v1/sandboxes/{id}/computer`, rootfs `desktop:1`):
//! screenshots, mouse, keyboard, clipboard, windows and extra screens with noVNC links.
//!
//! Every call can be aimed at one of the sandbox's screens (`screen-0` … `screen-7`): bind a
//! handle with [`Computer::on_screen`] and every call made through it (and through its
//! `mouse()`, `keyboard()` and `windows()`) sends that `screen_id`.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::Method;
use secrecy::SecretString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

use crate::transport::{RawBody, Transport, seg};
use crate::wire_enum::{nullable, protocol_error};
use crate::{Download, Error, RequestOptions, Result, Sandbox};

/// Largest screenshot [`Computer::screenshot_bytes`] collects: 64 MiB (an uncompressed
/// 4K RGBA frame is about 33 MiB).
pub const MAX_SCREENSHOT_BYTES: u64 = 64 * 1024 * 1024;

/// Highest screen index a sandbox offers.
pub const MAX_SCREEN_INDEX: u8 = 7;

/// A validated screen id, `screen-0` … `screen-7`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScreenId(String);

impl ScreenId {
    /// The screen with index `index` (0–7).
    pub fn new(index: u8) -> Result<Self> {
        if index > MAX_SCREEN_INDEX {
            return Err(Error::InvalidArgument(format!(
                "screen index {index} is out of range 0..={MAX_SCREEN_INDEX}"
            )));
        }
        Ok(Self(format!("screen-{index}")))
    }

    /// Parses `screen-N` with N in 0–7.
    pub fn parse(id: &str) -> Result<Self> {
        let index = id
            .strip_prefix("screen-")
            .filter(|n| n.len() == 1)
            .and_then(|n| n.parse::<u8>().ok())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{id:?} is not a screen id (screen-0 … screen-7)"))
            })?;
        Self::new(index)
    }

    /// The id as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScreenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ScreenId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// A point on the screen, in pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Point {
    /// Horizontal position.
    #[serde(deserialize_with = "nullable")]
    pub x: i32,
    /// Vertical position.
    #[serde(deserialize_with = "nullable")]
    pub y: i32,
}

impl Point {
    /// The point (`x`, `y`).
    pub fn new(x: i32, y: i32) -> Self {
        Self { x, y }
    }
}

/// A screen's size in pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScreenSize {
    /// Width.
    #[serde(deserialize_with = "nullable")]
    pub width: u32,
    /// Height.
    #[serde(deserialize_with = "nullable")]
    pub height: u32,
}

/// A mouse button.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MouseButton {
    /// Left button.
    Left,
    /// Middle button.
    Middle,
    /// Right button.
    Right,
}

/// Scroll direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrollDirection {
    /// Scroll up.
    Up,
    /// Scroll down.
    Down,
}

/// Options for [`Computer::screenshot`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScreenshotOptions {
    /// Capture only this window (sent when non-empty).
    pub window_id: String,
    /// Left edge of a region (sent when set, including 0).
    pub x: Option<i32>,
    /// Top edge of a region (sent when set, including 0).
    pub y: Option<i32>,
    /// Region width (sent when non-zero).
    pub width: u32,
    /// Region height (sent when non-zero).
    pub height: u32,
}

impl ScreenshotOptions {
    /// A `width` × `height` region with its top-left corner at (`x`, `y`).
    pub fn region(x: i32, y: i32, width: u32, height: u32) -> Self {
        Self {
            window_id: String::new(),
            x: Some(x),
            y: Some(y),
            width,
            height,
        }
    }

    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if !self.window_id.is_empty() {
            q.push(("window_id", self.window_id.clone()));
        }
        if let Some(x) = self.x {
            q.push(("x", x.to_string()));
        }
        if let Some(y) = self.y {
            q.push(("y", y.to_string()));
        }
        if self.width != 0 {
            q.push(("width", self.width.to_string()));
        }
        if self.height != 0 {
            q.push(("height", self.height.to_string()));
        }
        q
    }
}

/// Body of `POST /launch`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// Application to start (e.g. `firefox`).
    pub application: String,
    /// Optional URI to open with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

impl LaunchRequest {
    /// Launch `application`.
    pub fn new(application: impl Into<String>) -> Self {
        Self {
            application: application.into(),
            uri: None,
        }
    }

    /// Opens `uri` with the application.
    #[must_use]
    pub fn uri(mut self, uri: impl Into<String>) -> Self {
        self.uri = Some(uri.into());
        self
    }
}

/// Body of `POST /mouse/click`. Unset fields (and a zero count) are omitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClickRequest {
    /// Button; the server default is left.
    pub button: Option<MouseButton>,
    /// Where to click; the current cursor position when unset.
    pub at: Option<Point>,
    /// Number of clicks (2 = double click); `0` means the server default.
    pub count: u32,
}

impl ClickRequest {
    /// A single click of `button` at `at`.
    pub fn at(button: MouseButton, at: Point) -> Self {
        Self {
            button: Some(button),
            at: Some(at),
            count: 0,
        }
    }

    fn to_json(self) -> Value {
        let mut body = serde_json::Map::new();
        if let Some(button) = self.button {
            body.insert("button".into(), json!(button));
        }
        if let Some(at) = self.at {
            body.insert("x".into(), json!(at.x));
            body.insert("y".into(), json!(at.y));
        }
        if self.count != 0 {
            body.insert("count".into(), json!(self.count));
        }
        Value::Object(body)
    }
}

/// Body of `POST /mouse/scroll`. Unset fields are omitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrollRequest {
    /// Direction; server default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<ScrollDirection>,
    /// Number of scroll steps; server default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<u32>,
}

/// Body of `POST /keyboard/type`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeRequest {
    /// Text to type.
    pub text: String,
    /// Delay between keystrokes in milliseconds; server default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_in_ms: Option<u32>,
}

impl TypeRequest {
    /// Type `text` with the default delay.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            delay_in_ms: None,
        }
    }
}

/// A desktop window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Window {
    /// Window id (numbers on the wire are read as their decimal text).
    #[serde(deserialize_with = "string_or_number")]
    pub id: String,
    /// Window title.
    #[serde(deserialize_with = "nullable")]
    pub title: String,
}

/// A window's position and size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct WindowGeometry {
    /// Window id.
    #[serde(deserialize_with = "string_or_number")]
    pub id: String,
    /// Left edge.
    #[serde(deserialize_with = "nullable")]
    pub x: i32,
    /// Top edge.
    #[serde(deserialize_with = "nullable")]
    pub y: i32,
    /// Width.
    #[serde(deserialize_with = "nullable")]
    pub width: u32,
    /// Height.
    #[serde(deserialize_with = "nullable")]
    pub height: u32,
    /// Index of the screen the window is on.
    #[serde(deserialize_with = "nullable")]
    pub screen: i64,
}

/// One virtual screen of a desktop sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Screen {
    /// Screen id (`screen-N`).
    #[serde(deserialize_with = "nullable")]
    pub screen_id: String,
    /// X display name (numbers on the wire are read as their decimal text).
    #[serde(deserialize_with = "string_or_number")]
    pub display: String,
    /// Width.
    #[serde(deserialize_with = "nullable")]
    pub width: u32,
    /// Height.
    #[serde(deserialize_with = "nullable")]
    pub height: u32,
    /// VNC port inside the guest.
    #[serde(deserialize_with = "nullable")]
    pub vnc_port: u32,
    /// noVNC port inside the guest.
    #[serde(deserialize_with = "nullable")]
    pub novnc_port: u32,
}

/// Body of `POST /screens`. Unset fields are omitted (server default size).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScreenCreateRequest {
    /// Width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Height.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
}

/// A temporary noVNC link to a screen. The token (and the URL, which embeds it) are redacted
/// from `Debug`.
#[derive(Clone)]
#[non_exhaustive]
pub struct ScreenConnection {
    /// Screen id.
    pub screen_id: String,
    /// Port of the noVNC endpoint.
    pub port: u32,
    /// Path of the noVNC endpoint.
    pub path: String,
    /// Short-lived access token.
    pub token: SecretString,
    /// When the link expires (RFC 3339).
    pub expires_at: String,
    /// The full `https://…` link, token included.
    pub url: SecretString,
}

impl fmt::Debug for ScreenConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScreenConnection")
            .field("screen_id", &self.screen_id)
            .field("port", &self.port)
            .field("path", &self.path)
            .field("token", &"[REDACTED]")
            .field("expires_at", &self.expires_at)
            .field("url", &"[REDACTED]")
            .finish()
    }
}

#[derive(Deserialize)]
struct ScreenConnectionWire {
    #[serde(default, deserialize_with = "nullable")]
    screen_id: String,
    #[serde(default, deserialize_with = "nullable")]
    port: u32,
    #[serde(default, deserialize_with = "nullable")]
    path: String,
    #[serde(default, deserialize_with = "nullable")]
    token: String,
    #[serde(default, deserialize_with = "nullable")]
    expires_at: String,
    #[serde(default, deserialize_with = "nullable")]
    url: String,
}

#[derive(Deserialize)]
struct ClipboardWire {
    #[serde(default, deserialize_with = "nullable")]
    text: String,
}

fn string_or_number<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<String, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Null => Ok(String::new()),
        other => Err(serde::de::Error::custom(format!(
            "expected a string or number, got {other}"
        ))),
    }
}

/// Computer-use operations on one sandbox; get it from [`Sandbox::computer`].
#[derive(Clone)]
pub struct Computer {
    transport: Arc<Transport>,
    sandbox_id: String,
    screen: Option<ScreenId>,
    options: RequestOptions,
}

impl fmt::Debug for Computer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Computer")
            .field("sandbox_id", &self.sandbox_id)
            .field("screen", &self.screen)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Computer use (desktop rootfs) for this sandbox, on the default screen.
    pub fn computer(&self) -> Computer {
        Computer {
            transport: Arc::clone(self.transport()),
            sandbox_id: self.id().to_owned(),
            screen: None,
            options: RequestOptions::default(),
        }
    }
}

impl Computer {
    /// The same handle aimed at `screen`: every call sends `screen_id=<screen>`.
    #[must_use]
    pub fn on_screen(mut self, screen: ScreenId) -> Self {
        self.screen = Some(screen);
        self
    }

    /// The same handle on the default screen (no `screen_id` sent).
    #[must_use]
    pub fn on_default_screen(mut self) -> Self {
        self.screen = None;
        self
    }

    /// The screen this handle is aimed at, if any.
    pub fn screen_id(&self) -> Option<&ScreenId> {
        self.screen.as_ref()
    }

    /// The same handle with `options` applied to every call.
    #[must_use]
    pub fn with_options(mut self, options: RequestOptions) -> Self {
        self.options = options;
        self
    }

    /// Mouse control.
    pub fn mouse(&self) -> Mouse {
        Mouse(self.clone())
    }

    /// Keyboard control.
    pub fn keyboard(&self) -> Keyboard {
        Keyboard(self.clone())
    }

    /// Window management.
    pub fn windows(&self) -> Windows {
        Windows(self.clone())
    }

    /// Virtual screens and noVNC links.
    pub fn screens(&self) -> Screens {
        Screens(self.clone())
    }

    fn path(&self, tail: &str) -> String {
        format!("/v1/sandboxes/{}/computer{tail}", seg(&self.sandbox_id))
    }

    fn query(&self, mut extra: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
        if let Some(screen) = &self.screen {
            extra.insert(0, ("screen_id", screen.as_str().to_owned()));
        }
        extra
    }

    async fn get<T: DeserializeOwned>(
        &self,
        tail: &str,
        query: Vec<(&'static str, String)>,
    ) -> Result<T> {
        let query = self.query(query);
        self.transport
            .json(Method::GET, &self.path(tail), &query, None, &self.options)
            .await
    }

    async fn post(&self, tail: &str, body: Option<Value>) -> Result<()> {
        let query = self.query(Vec::new());
        self.transport
            .unit(Method::POST, &self.path(tail), &query, body, &self.options)
            .await
    }

    /// Captures a PNG of the screen, a window or a region, streamed as it arrives (never
    /// retried), with the response headers (`Content-Type`, `Content-Length` …). See
    /// [`Computer::screenshot_bytes`] to collect it.
    pub async fn screenshot(&self, options: &ScreenshotOptions) -> Result<Download> {
        self.screenshot_capped(options, None).await
    }

    /// [`Computer::screenshot`], collected into one buffer of at most
    /// [`MAX_SCREENSHOT_BYTES`] ([`Error::TooLarge`] beyond it, early when `Content-Length`
    /// says so).
    pub async fn screenshot_bytes(&self, options: &ScreenshotOptions) -> Result<Bytes> {
        self.screenshot_capped(options, Some(MAX_SCREENSHOT_BYTES))
            .await?
            .bytes()
            .await
    }

    async fn screenshot_capped(
        &self,
        options: &ScreenshotOptions,
        max_bytes: Option<u64>,
    ) -> Result<Download> {
        let query = self.query(options.query());
        let path = self.path("/screenshot");
        let response = self
            .transport
            .raw(Method::GET, &path, &query, RawBody::None, &self.options)
            .await?;
        Download::from_response(response, max_bytes, &format!("screenshot of {path}"))
    }

    /// The screen's size.
    pub async fn screen(&self) -> Result<ScreenSize> {
        self.get("/screen", Vec::new()).await
    }

    /// The cursor position.
    pub async fn cursor(&self) -> Result<Point> {
        self.get("/cursor", Vec::new()).await
    }

    /// The clipboard's text.
    pub async fn clipboard(&self) -> Result<String> {
        let wire: ClipboardWire = self.get("/clipboard", Vec::new()).await?;
        Ok(wire.text)
    }

    /// Replaces the clipboard's text.
    pub async fn set_clipboard(&self, text: &str) -> Result<()> {
        let query = self.query(Vec::new());
        self.transport
            .unit(
                Method::PUT,
                &self.path("/clipboard"),
                &query,
                Some(json!({ "text": text })),
                &self.options,
            )
            .await
    }

    /// Opens a URL or desktop target with its default handler.
    pub async fn open(&self, target: &str) -> Result<()> {
        self.post("/open", Some(json!({ "target": target }))).await
    }

    /// Launches an application, optionally with a URI.
    pub async fn launch(&self, request: &LaunchRequest) -> Result<()> {
        let body = serde_json::to_value(request).map_err(|e| protocol_error(e.to_string()))?;
        self.post("/launch", Some(body)).await
    }
}

/// Mouse control; get it from [`Computer::mouse`].
#[derive(Debug, Clone)]
pub struct Mouse(Computer);

impl Mouse {
    /// Moves the cursor to `to` (`POST /mouse/move`).
    pub async fn move_to(&self, to: Point) -> Result<()> {
        self.0
            .post("/mouse/move", Some(json!({ "x": to.x, "y": to.y })))
            .await
    }

    /// Clicks.
    pub async fn click(&self, request: ClickRequest) -> Result<()> {
        self.0.post("/mouse/click", Some(request.to_json())).await
    }

    /// Scrolls.
    pub async fn scroll(&self, request: ScrollRequest) -> Result<()> {
        let body = serde_json::to_value(request).map_err(|e| protocol_error(e.to_string()))?;
        self.0.post("/mouse/scroll", Some(body)).await
    }

    /// Drags from `from` to `to`.
    pub async fn drag(&self, from: Point, to: Point) -> Result<()> {
        self.0
            .post(
                "/mouse/drag",
                Some(json!({ "from": {"x": from.x, "y": from.y}, "to": {"x": to.x, "y": to.y} })),
            )
            .await
    }

    /// Presses a button (server default: left) without releasing it.
    pub async fn down(&self, button: Option<MouseButton>) -> Result<()> {
        self.0.post("/mouse/down", Some(button_body(button))).await
    }

    /// Releases a button (server default: left).
    pub async fn up(&self, button: Option<MouseButton>) -> Result<()> {
        self.0.post("/mouse/up", Some(button_body(button))).await
    }
}

fn button_body(button: Option<MouseButton>) -> Value {
    match button {
        Some(button) => json!({ "button": button }),
        None => json!({}),
    }
}

/// Keyboard control; get it from [`Computer::keyboard`].
#[derive(Debug, Clone)]
pub struct Keyboard(Computer);

impl Keyboard {
    /// Types text (`POST /keyboard/type`).
    pub async fn type_text(&self, request: &TypeRequest) -> Result<()> {
        let body = serde_json::to_value(request).map_err(|e| protocol_error(e.to_string()))?;
        self.0.post("/keyboard/type", Some(body)).await
    }

    /// Presses and releases a key combination, e.g. `["ctrl", "c"]`.
    pub async fn press<S: AsRef<str>>(&self, keys: &[S]) -> Result<()> {
        self.0.post("/keyboard/press", Some(keys_body(keys))).await
    }

    /// Presses keys without releasing them.
    pub async fn down<S: AsRef<str>>(&self, keys: &[S]) -> Result<()> {
        self.0.post("/keyboard/down", Some(keys_body(keys))).await
    }

    /// Releases keys.
    pub async fn up<S: AsRef<str>>(&self, keys: &[S]) -> Result<()> {
        self.0.post("/keyboard/up", Some(keys_body(keys))).await
    }
}

fn keys_body<S: AsRef<str>>(keys: &[S]) -> Value {
    json!({ "keys": keys.iter().map(AsRef::as_ref).collect::<Vec<&str>>() })
}

/// Window management; get it from [`Computer::windows`].
#[derive(Debug, Clone)]
pub struct Windows(Computer);

impl Windows {
    fn tail(id: &str, action: &str) -> String {
        format!("/windows/{}{action}", seg(id))
    }

    /// Lists windows, optionally only those of `application` (the response is a bare array).
    pub async fn list(&self, application: Option<&str>) -> Result<Vec<Window>> {
        let query = match application {
            Some(app) if !app.is_empty() => vec![("application", app.to_owned())],
            _ => Vec::new(),
        };
        self.0.get("/windows", query).await
    }

    /// The focused window.
    pub async fn current(&self) -> Result<Window> {
        self.0.get("/windows/current", Vec::new()).await
    }

    /// One window.
    pub async fn get(&self, id: &str) -> Result<Window> {
        self.0.get(&Self::tail(id, ""), Vec::new()).await
    }

    /// A window's position, size and screen.
    pub async fn geometry(&self, id: &str) -> Result<WindowGeometry> {
        self.0.get(&Self::tail(id, "/geometry"), Vec::new()).await
    }

    /// Focuses a window.
    pub async fn focus(&self, id: &str) -> Result<()> {
        self.0.post(&Self::tail(id, "/focus"), None).await
    }

    /// Moves a window's top-left corner to `to`.
    pub async fn move_to(&self, id: &str, to: Point) -> Result<()> {
        self.0
            .post(
                &Self::tail(id, "/move"),
                Some(json!({ "x": to.x, "y": to.y })),
            )
            .await
    }

    /// Resizes a window.
    pub async fn resize(&self, id: &str, size: ScreenSize) -> Result<()> {
        self.0
            .post(
                &Self::tail(id, "/resize"),
                Some(json!({ "width": size.width, "height": size.height })),
            )
            .await
    }

    /// Maximizes a window.
    pub async fn maximize(&self, id: &str) -> Result<()> {
        self.0.post(&Self::tail(id, "/maximize"), None).await
    }

    /// Minimizes a window.
    pub async fn minimize(&self, id: &str) -> Result<()> {
        self.0.post(&Self::tail(id, "/minimize"), None).await
    }

    /// Restores a maximized or minimized window.
    pub async fn restore(&self, id: &str) -> Result<()> {
        self.0.post(&Self::tail(id, "/restore"), None).await
    }

    /// Closes a window (`DELETE /windows/{id}`).
    pub async fn close(&self, id: &str) -> Result<()> {
        let query = self.0.query(Vec::new());
        self.0
            .transport
            .unit(
                Method::DELETE,
                &self.0.path(&Self::tail(id, "")),
                &query,
                None,
                &self.0.options,
            )
            .await
    }
}

/// Virtual screens; get it from [`Computer::screens`]. These calls address screens by path and
/// never send a `screen_id` query.
#[derive(Debug, Clone)]
pub struct Screens(Computer);

impl Screens {
    fn path(&self, tail: &str) -> String {
        self.0.path(&format!("/screens{tail}"))
    }

    fn screen_path(&self, id: &ScreenId, tail: &str) -> String {
        self.path(&format!("/{}{tail}", seg(id.as_str())))
    }

    /// Lists screens (bare array).
    pub async fn list(&self) -> Result<Vec<Screen>> {
        self.0
            .transport
            .json(Method::GET, &self.path(""), &[], None, &self.0.options)
            .await
    }

    /// Adds a screen.
    pub async fn create(&self, request: ScreenCreateRequest) -> Result<Screen> {
        let body = serde_json::to_value(request).map_err(|e| protocol_error(e.to_string()))?;
        self.0
            .transport
            .json(
                Method::POST,
                &self.path(""),
                &[],
                Some(body),
                &self.0.options,
            )
            .await
    }

    /// One screen.
    pub async fn get(&self, id: &ScreenId) -> Result<Screen> {
        self.0
            .transport
            .json(
                Method::GET,
                &self.screen_path(id, ""),
                &[],
                None,
                &self.0.options,
            )
            .await
    }

    /// A temporary noVNC link to a screen.
    pub async fn connect(&self, id: &ScreenId) -> Result<ScreenConnection> {
        let wire: ScreenConnectionWire = self
            .0
            .transport
            .json(
                Method::GET,
                &self.screen_path(id, "/connect"),
                &[],
                None,
                &self.0.options,
            )
            .await?;
        Ok(ScreenConnection {
            screen_id: wire.screen_id,
            port: wire.port,
            path: wire.path,
            token: SecretString::from(wire.token),
            expires_at: wire.expires_at,
            url: SecretString::from(wire.url),
        })
    }

    /// Resizes a screen.
    pub async fn resize(&self, id: &ScreenId, size: ScreenSize) -> Result<Screen> {
        self.0
            .transport
            .json(
                Method::POST,
                &self.screen_path(id, "/resize"),
                &[],
                Some(json!({ "width": size.width, "height": size.height })),
                &self.0.options,
            )
            .await
    }

    /// Removes a screen.
    pub async fn delete(&self, id: &ScreenId) -> Result<()> {
        self.0
            .transport
            .unit(
                Method::DELETE,
                &self.screen_path(id, ""),
                &[],
                None,
                &self.0.options,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screen_ids_are_validated() {
        assert_eq!(ScreenId::parse("screen-0").unwrap().as_str(), "screen-0");
        assert_eq!(ScreenId::new(7).unwrap().to_string(), "screen-7");
        for bad in [
            "screen-8",
            "screen-",
            "screen-01",
            "Screen-1",
            "1",
            "screen-1 ",
        ] {
            assert!(ScreenId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ScreenId::new(8).is_err());
    }

    #[test]
    fn screenshot_query_rules() {
        assert!(ScreenshotOptions::default().query().is_empty());
        let q = ScreenshotOptions::region(0, 0, 0, 50).query();
        assert_eq!(
            q,
            vec![
                ("x", "0".to_owned()),
                ("y", "0".to_owned()),
                ("height", "50".to_owned())
            ]
        );
    }

    #[test]
    fn click_body_omits_unset_fields() {
        assert_eq!(ClickRequest::default().to_json(), json!({}));
        let c = ClickRequest {
            count: 2,
            ..ClickRequest::at(MouseButton::Right, Point::new(0, 5))
        };
        assert_eq!(
            c.to_json(),
            json!({"button": "right", "x": 0, "y": 5, "count": 2})
        );
    }

    #[test]
    fn lenient_window_and_screen_decoding() {
        let w: Vec<Window> =
            serde_json::from_value(json!([{"id": 12, "title": "xterm"}, {"id": "0x3"}])).unwrap();
        assert_eq!(w[0].id, "12");
        assert_eq!(w[1].id, "0x3");
        let s: Screen =
            serde_json::from_value(json!({"screen_id": "screen-1", "display": 2, "width": 800}))
                .unwrap();
        assert_eq!(s.display, "2");
    }

    #[test]
    fn connection_debug_hides_token() {
        let c = ScreenConnection {
            screen_id: "screen-0".into(),
            port: 6080,
            path: "/vnc".into(),
            token: SecretString::from("tok-secret".to_owned()),
            expires_at: "t".into(),
            url: SecretString::from("https://x/?token=tok-secret".to_owned()),
        };
        assert!(!format!("{c:?}").contains("tok-secret"));
    }
}
