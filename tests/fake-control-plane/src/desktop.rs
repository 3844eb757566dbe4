//! The simulated desktop of a `desktop:1` guest (contract §2.11): its screens (cursor, clipboard,
//! pressed keys and buttons), its windows and a log of every accepted action. Nothing is drawn by
//! a real X server: screenshots are rendered from this state as real PNG files (stored deflate
//! blocks, so no compression crate is needed). The computer-use routes that act on it are in
//! `computer`.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::jsend::ApiError;
use crate::util::now_rfc3339;

/// The rootfs whose guests have a desktop.
pub(crate) const DESKTOP_ROOTFS: &str = "desktop:1";
/// `screen-0` … `screen-7`.
pub(crate) const MAX_SCREENS: u8 = 8;
/// Size of `screen-0` and of a screen created without a size.
pub(crate) const DEFAULT_SIZE: (u32, u32) = (1280, 800);
/// Smallest and largest accepted screen and window dimension.
pub(crate) const DIM_RANGE: std::ops::RangeInclusive<u32> = 64..=3840;
/// How many recorded actions a desktop keeps (oldest dropped first).
const MAX_EVENTS: usize = 1000;
/// Height of a window's title bar in screenshots.
const TITLE_BAR: i64 = 24;
/// Side of the square drawn for the cursor in screenshots.
const CURSOR: i64 = 6;

/// A window's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WinState {
    Normal,
    Maximized,
    Minimized,
}

impl WinState {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Maximized => "maximized",
            Self::Minimized => "minimized",
        }
    }
}

/// One window (created by `open` or `launch`).
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub id: String,
    pub title: String,
    pub application: String,
    pub screen: u8,
    /// Geometry when `Normal` (kept while maximized or minimized, for `restore`).
    pub x: i64,
    pub y: i64,
    pub width: u32,
    pub height: u32,
    pub state: WinState,
    /// Text typed while the window had the focus.
    pub typed: String,
}

/// One virtual screen (an X display).
#[derive(Debug, Clone)]
pub(crate) struct Screen {
    pub index: u8,
    pub width: u32,
    pub height: u32,
    pub cursor: (u32, u32),
    pub clipboard: String,
    /// Window ids on this screen, bottom to top; the top non-minimized one has the focus.
    pub stack: Vec<String>,
    pub buttons: BTreeSet<String>,
    pub keys: BTreeSet<String>,
}

impl Screen {
    /// A screen with the cursor in its middle and nothing on it.
    pub(crate) fn new(index: u8, (width, height): (u32, u32)) -> Self {
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

    /// `screen-N`.
    pub(crate) fn id(&self) -> String {
        format!("screen-{}", self.index)
    }

    /// The wire projection.
    pub(crate) fn to_json(&self) -> Value {
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
    pub screens: Vec<Screen>,
    pub windows: Vec<Window>,
    pub next_window: u32,
    pub events: Vec<Value>,
}

impl Desktop {
    /// A desktop as started: `screen-0` only, no windows.
    pub(crate) fn new() -> Self {
        Self {
            screens: vec![Screen::new(0, DEFAULT_SIZE)],
            windows: Vec::new(),
            next_window: 1,
            events: Vec::new(),
        }
    }

    /// A screen by index, or a 404.
    pub(crate) fn screen(&self, index: u8) -> Result<&Screen, ApiError> {
        self.screens
            .iter()
            .find(|s| s.index == index)
            .ok_or_else(|| ApiError::not_found(format!("screen-{index} not found")))
    }

    /// A screen by index, mutably, or a 404.
    pub(crate) fn screen_mut(&mut self, index: u8) -> Result<&mut Screen, ApiError> {
        self.screens
            .iter_mut()
            .find(|s| s.index == index)
            .ok_or_else(|| ApiError::not_found(format!("screen-{index} not found")))
    }

    /// A window by id (on `screen` when given), or a 404.
    pub(crate) fn window(&self, id: &str, screen: Option<u8>) -> Result<&Window, ApiError> {
        self.windows
            .iter()
            .find(|w| w.id == id && screen.is_none_or(|s| s == w.screen))
            .ok_or_else(|| ApiError::not_found(format!("window {id} not found")))
    }

    /// A window by id (on `screen` when given), mutably, or a 404.
    pub(crate) fn window_mut(
        &mut self,
        id: &str,
        screen: Option<u8>,
    ) -> Result<&mut Window, ApiError> {
        self.windows
            .iter_mut()
            .find(|w| w.id == id && screen.is_none_or(|s| s == w.screen))
            .ok_or_else(|| ApiError::not_found(format!("window {id} not found")))
    }

    /// The focused window of a screen: the topmost one that is not minimized.
    pub(crate) fn focused(&self, screen: u8) -> Option<&Window> {
        let s = self.screens.iter().find(|s| s.index == screen)?;
        s.stack
            .iter()
            .rev()
            .filter_map(|id| self.windows.iter().find(|w| &w.id == id))
            .find(|w| w.state != WinState::Minimized)
    }

    /// Puts a window on top of its screen's stack (it gets the focus unless minimized).
    pub(crate) fn raise(&mut self, id: &str) {
        if let Some(w) = self.windows.iter().find(|w| w.id == id)
            && let Some(s) = self.screens.iter_mut().find(|s| s.index == w.screen)
        {
            s.stack.retain(|x| x != id);
            s.stack.push(id.to_owned());
        }
    }

    /// The on-screen rectangle of a window (`None` while minimized).
    pub(crate) fn geometry(&self, w: &Window) -> Option<(i64, i64, u32, u32)> {
        match w.state {
            WinState::Minimized => None,
            WinState::Normal => Some((w.x, w.y, w.width, w.height)),
            WinState::Maximized => {
                let s = self.screens.iter().find(|s| s.index == w.screen)?;
                Some((0, 0, s.width, s.height))
            }
        }
    }

    /// Opens a normal window on `screen`, on top and focused; returns its id.
    pub(crate) fn open_window(&mut self, screen: u8, application: String, title: String) -> String {
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

    /// Logs an accepted action (the last [`MAX_EVENTS`] are kept).
    pub(crate) fn record(&mut self, screen: Option<u8>, action: &str, fields: Value) {
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
    pub(crate) fn inspect(&self) -> Value {
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
pub(crate) struct Scene {
    rects: Vec<Rect>,
}

const BACKGROUND: [u8; 3] = [0x2e, 0x34, 0x40];
const WINDOW_BODY: [u8; 3] = [0xec, 0xef, 0xf4];
const TITLE_FOCUSED: [u8; 3] = [0x5e, 0x81, 0xac];
const TITLE_OTHER: [u8; 3] = [0x4c, 0x56, 0x6a];
const CURSOR_RGB: [u8; 3] = [0xff, 0xff, 0xff];

impl Scene {
    /// The scene of screen `si`: its windows bottom to top, then the cursor.
    pub(crate) fn of(desk: &Desktop, si: u8) -> Result<Self, ApiError> {
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
pub(crate) struct PngStream {
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
    /// A PNG of the `width` x `height` region of `scene` starting at (`x0`, `y0`).
    pub(crate) fn new(scene: Scene, x0: i64, y0: i64, width: u32, height: u32) -> Self {
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
    pub(crate) fn total_len(&self) -> u64 {
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

    /// The next piece of the file (`None` once it is complete).
    pub(crate) fn next_chunk(&mut self) -> Option<Bytes> {
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
