//! Computer use: the simulated desktop of `desktop:1` guests, over HTTP against the binary.

mod common;

use common::Fx;
use serde_json::{Value, json};

/// A PNG checked independently of the fake's encoder: signature, chunk CRCs (bitwise CRC-32),
/// IHDR, a zlib stream of stored deflate blocks with a correct Adler-32, and the pixel rows.
struct Png {
    width: u32,
    height: u32,
    /// RGB rows without their filter bytes.
    rows: Vec<Vec<u8>>,
}

impl Png {
    fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let r = &self.rows[y];
        [r[3 * x], r[3 * x + 1], r[3 * x + 2]]
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffff_u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn decode_png(bytes: &[u8]) -> Png {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "signature");
    let mut pos = 8;
    let mut chunks: Vec<([u8; 4], &[u8])> = Vec::new();
    while pos < bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let kind: [u8; 4] = bytes[pos + 4..pos + 8].try_into().unwrap();
        let data = &bytes[pos + 8..pos + 8 + len];
        let crc = u32::from_be_bytes(bytes[pos + 8 + len..pos + 12 + len].try_into().unwrap());
        assert_eq!(
            crc,
            crc32(&bytes[pos + 4..pos + 8 + len]),
            "CRC of {}",
            String::from_utf8_lossy(&kind)
        );
        chunks.push((kind, data));
        pos += 12 + len;
    }
    assert_eq!(pos, bytes.len(), "trailing bytes");
    assert_eq!(&chunks[0].0, b"IHDR");
    assert_eq!(&chunks.last().unwrap().0, b"IEND");
    let ihdr = chunks[0].1;
    let width = u32::from_be_bytes(ihdr[0..4].try_into().unwrap());
    let height = u32::from_be_bytes(ihdr[4..8].try_into().unwrap());
    assert_eq!(&ihdr[8..], &[8, 2, 0, 0, 0], "8-bit RGB, no interlace");
    let z: Vec<u8> = chunks
        .iter()
        .filter(|(k, _)| k == b"IDAT")
        .flat_map(|(_, d)| d.iter().copied())
        .collect();
    assert_eq!(
        (u16::from(z[0]) << 8 | u16::from(z[1])) % 31,
        0,
        "zlib header check"
    );
    assert_eq!(z[0] & 0x0f, 8, "deflate");
    let mut p = 2;
    let mut raw = Vec::new();
    loop {
        let header = z[p];
        assert_eq!(header >> 1, 0, "stored block");
        let len = u16::from_le_bytes([z[p + 1], z[p + 2]]);
        let nlen = u16::from_le_bytes([z[p + 3], z[p + 4]]);
        assert_eq!(len, !nlen, "LEN/NLEN");
        raw.extend_from_slice(&z[p + 5..p + 5 + usize::from(len)]);
        p += 5 + usize::from(len);
        if header & 1 == 1 {
            break;
        }
    }
    let (mut a, mut b) = (1u32, 0u32);
    for x in &raw {
        a = (a + u32::from(*x)) % 65_521;
        b = (b + a) % 65_521;
    }
    assert_eq!(
        u32::from_be_bytes(z[p..p + 4].try_into().unwrap()),
        (b << 16) | a,
        "Adler-32"
    );
    assert_eq!(p + 4, z.len(), "bytes after the zlib stream");
    let stride = 1 + 3 * width as usize;
    assert_eq!(raw.len(), stride * height as usize, "image data size");
    let rows = raw
        .chunks(stride)
        .map(|r| {
            assert_eq!(r[0], 0, "filter type none");
            r[1..].to_vec()
        })
        .collect();
    Png {
        width,
        height,
        rows,
    }
}

const BACKGROUND: [u8; 3] = [0x2e, 0x34, 0x40];

async fn desktop(fx: &Fx) -> (String, String) {
    let id = fx.create(json!({"rootfs": "desktop:1"})).await;
    let base = format!("/v1/sandboxes/{id}/computer");
    (id, base)
}

async fn screenshot(fx: &Fx, base: &str, query: &str) -> (reqwest::header::HeaderMap, Vec<u8>) {
    let r = fx
        .http
        .get(format!("{}{base}/screenshot{query}", fx.url))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{query}");
    let headers = r.headers().clone();
    (headers, r.bytes().await.unwrap().to_vec())
}

async fn inspect(fx: &Fx, id: &str) -> Value {
    let v: Value = fx
        .http
        .get(fx.control(&format!("desktop/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["status"], "success", "{v}");
    v["data"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_desktop_guests_have_a_desktop() {
    let fx = Fx::new().await;
    let plain = fx.create(json!({})).await;
    let r = fx
        .get(&format!("/v1/sandboxes/{plain}/computer/screen"))
        .await;
    assert_eq!(r.status, 501, "{r:?}");
    assert_eq!(r.body["status"], "error");
    assert!(r.text.contains("desktop:1"), "{}", r.text);
    let r = fx.get("/v1/sandboxes/sbx-nope/computer/screen").await;
    assert_eq!(r.status, 404);

    let (id, base) = desktop(&fx).await;
    // Not started until first used; the fake's inspection route says so.
    let r = fx
        .http
        .get(fx.control(&format!("desktop/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(
        fx.get(&format!("{base}/screen")).await.data(),
        &json!({"width": 1280, "height": 800})
    );
    // A paused guest's desktop is unavailable until resumed.
    fx.post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await
        .data();
    let r = fx.get(&format!("{base}/cursor")).await;
    assert_eq!(r.status, 409, "{r:?}");
    fx.post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await
        .data();
    fx.wait_status(&id, "running").await;
    fx.get(&format!("{base}/cursor")).await.data();
    // Unknown routes and wrong methods.
    assert_eq!(fx.get(&format!("{base}/nope")).await.status, 404);
    assert_eq!(
        fx.post(&format!("{base}/screen"), json!({})).await.status,
        405
    );
    assert_eq!(fx.get(&format!("{base}/mouse/move")).await.status, 405);
    assert_eq!(fx.delete(&format!("{base}/screens")).await.status, 405);
}

#[tokio::test(flavor = "multi_thread")]
async fn screenshots_are_valid_pngs_of_the_screen_window_or_region() {
    let fx = Fx::new().await;
    let (_id, base) = desktop(&fx).await;
    let (headers, full) = screenshot(&fx, &base, "").await;
    assert_eq!(headers["content-type"], "image/png");
    assert_eq!(
        headers["content-length"].to_str().unwrap(),
        full.len().to_string()
    );
    let png = decode_png(&full);
    assert_eq!((png.width, png.height), (1280, 800));
    assert_eq!(png.pixel(0, 0), BACKGROUND);
    // The cursor starts in the middle and is drawn there.
    assert_eq!(png.pixel(640, 400), [0xff, 0xff, 0xff]);

    let (_, region) = screenshot(
        &fx,
        &base,
        "?screen_id=screen-0&x=0&y=0&width=200&height=100",
    )
    .await;
    let png = decode_png(&region);
    assert_eq!((png.width, png.height), (200, 100));
    // Only x and y: the rest of the screen from there.
    let (_, corner) = screenshot(&fx, &base, "?x=1000&y=700").await;
    assert_eq!(
        {
            let p = decode_png(&corner);
            (p.width, p.height)
        },
        (280, 100)
    );

    for bad in [
        "?x=1200&width=200",
        "?y=800",
        "?x=-1",
        "?width=abc",
        "?screen_id=screen-8",
        "?screen_id=display-0",
    ] {
        let r = fx.get(&format!("{base}/screenshot{bad}")).await;
        assert_eq!(r.status, 400, "{bad}: {r:?}");
    }
    let r = fx
        .get(&format!("{base}/screenshot?screen_id=screen-3"))
        .await;
    assert_eq!(r.status, 404, "a screen that does not exist");
    let r = fx.get(&format!("{base}/screenshot?window_id=0xdead")).await;
    assert_eq!(r.status, 404);

    // A window screenshot is the window's size; the window is drawn in full screenshots.
    fx.post(&format!("{base}/launch"), json!({"application": "xterm"}))
        .await
        .data();
    let win = fx
        .get(&format!("{base}/windows/current"))
        .await
        .data()
        .clone();
    let wid = win["id"].as_str().unwrap().to_owned();
    let g = fx
        .get(&format!("{base}/windows/{wid}/geometry"))
        .await
        .data()
        .clone();
    let (_, shot) = screenshot(&fx, &base, &format!("?window_id={wid}")).await;
    let png = decode_png(&shot);
    assert_eq!(
        (u64::from(png.width), u64::from(png.height)),
        (g["width"].as_u64().unwrap(), g["height"].as_u64().unwrap())
    );
    assert_ne!(png.pixel(5, 40), BACKGROUND, "the window body is drawn");
    let (_, shot) = screenshot(
        &fx,
        &base,
        &format!("?window_id={wid}&x=10&y=10&width=50&height=20"),
    )
    .await;
    let png = decode_png(&shot);
    assert_eq!((png.width, png.height), (50, 20));
    fx.post(&format!("{base}/windows/{wid}/minimize"), json!({}))
        .await
        .data();
    let r = fx.get(&format!("{base}/screenshot?window_id={wid}")).await;
    assert_eq!(r.status, 409, "a minimized window cannot be captured");
}

#[tokio::test(flavor = "multi_thread")]
async fn mouse_keyboard_and_clipboard_act_and_are_recorded() {
    let fx = Fx::new().await;
    let (id, base) = desktop(&fx).await;
    let cursor = |v: &Value| (v["x"].as_i64().unwrap(), v["y"].as_i64().unwrap());

    let r = fx
        .post(&format!("{base}/mouse/move"), json!({"x": 100, "y": 80}))
        .await;
    assert_eq!(r.data(), &json!({"ok": true}));
    assert_eq!(
        cursor(fx.get(&format!("{base}/cursor")).await.data()),
        (100, 80)
    );
    fx.post(
        &format!("{base}/mouse/click"),
        json!({"button": "right", "x": 10, "y": 20, "count": 2}),
    )
    .await
    .data();
    assert_eq!(
        cursor(fx.get(&format!("{base}/cursor")).await.data()),
        (10, 20)
    );
    fx.post(&format!("{base}/mouse/click"), json!({}))
        .await
        .data();
    fx.post(
        &format!("{base}/mouse/drag"),
        json!({"from": {"x": 1, "y": 2}, "to": {"x": 300, "y": 400}}),
    )
    .await
    .data();
    assert_eq!(
        cursor(fx.get(&format!("{base}/cursor")).await.data()),
        (300, 400)
    );
    fx.post(
        &format!("{base}/mouse/scroll"),
        json!({"direction": "up", "amount": 3}),
    )
    .await
    .data();
    fx.post(&format!("{base}/mouse/down"), json!({"button": "middle"}))
        .await
        .data();
    fx.post(&format!("{base}/keyboard/down"), json!({"keys": ["shift"]}))
        .await
        .data();

    for (path, body) in [
        ("mouse/move", json!({"x": 100})),
        ("mouse/move", json!({"x": 1280, "y": 0})),
        ("mouse/move", json!({"x": -1, "y": 0})),
        ("mouse/move", json!({"x": "1", "y": 0})),
        ("mouse/click", json!({"x": 5})),
        ("mouse/click", json!({"button": "back"})),
        ("mouse/click", json!({"count": 0})),
        ("mouse/scroll", json!({"direction": "left"})),
        ("mouse/scroll", json!({"amount": 0})),
        ("mouse/drag", json!({"from": {"x": 1, "y": 2}})),
        (
            "mouse/drag",
            json!({"from": {"x": 1}, "to": {"x": 1, "y": 1}}),
        ),
        ("mouse/up", json!({"button": 1})),
        ("keyboard/type", json!({})),
        ("keyboard/type", json!({"text": "x", "delay_in_ms": -5})),
        ("keyboard/press", json!({"keys": []})),
        ("keyboard/press", json!({"keys": ["ctrl", ""]})),
        ("keyboard/up", json!({"keys": "ctrl"})),
        ("open", json!({})),
        ("launch", json!({"application": ""})),
        ("mouse/wiggle", json!({})),
    ] {
        let r = fx.post(&format!("{base}/{path}"), body.clone()).await;
        let want = if path == "mouse/wiggle" { 404 } else { 400 };
        assert_eq!(r.status, want, "{path} {body}: {r:?}");
    }
    let r = fx
        .send(
            reqwest::Method::PUT,
            &format!("{base}/clipboard"),
            Some(&fx.key),
            Some(json!({"text": 5})),
        )
        .await;
    assert_eq!(r.status, 400);

    assert_eq!(
        fx.get(&format!("{base}/clipboard")).await.data()["text"],
        ""
    );
    fx.put(
        &format!("{base}/clipboard"),
        json!({"text": "hello, desktop"}),
    )
    .await
    .data();
    assert_eq!(
        fx.get(&format!("{base}/clipboard")).await.data()["text"],
        "hello, desktop"
    );

    // Typing goes to the focused window.
    fx.post(
        &format!("{base}/open"),
        json!({"target": "https://example.com/"}),
    )
    .await
    .data();
    fx.post(
        &format!("{base}/keyboard/type"),
        json!({"text": "hi there", "delay_in_ms": 5}),
    )
    .await
    .data();
    fx.post(
        &format!("{base}/keyboard/press"),
        json!({"keys": ["ctrl", "l"]}),
    )
    .await
    .data();

    let state = inspect(&fx, &id).await;
    let s0 = &state["screens"][0];
    assert_eq!(s0["pressed_buttons"], json!(["middle"]));
    assert_eq!(s0["pressed_keys"], json!(["shift"]));
    assert_eq!(s0["clipboard"], "hello, desktop");
    assert_eq!(state["windows"][0]["typed"], "hi there");
    assert_eq!(state["windows"][0]["application"], "firefox");
    let actions: Vec<&str> = state["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "mouse.move",
            "mouse.click",
            "mouse.click",
            "mouse.drag",
            "mouse.scroll",
            "mouse.down",
            "keyboard.down",
            "clipboard.set",
            "open",
            "keyboard.type",
            "keyboard.press",
        ],
        "rejected requests are not recorded"
    );
    let click = &state["events"][1];
    assert_eq!(
        (
            click["button"].clone(),
            click["x"].clone(),
            click["count"].clone()
        ),
        (json!("right"), json!(10), json!(2))
    );
    assert_eq!(state["events"][2]["button"], "left", "default button");
    assert_eq!(state["events"][4]["amount"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn windows_open_filter_focus_and_close() {
    let fx = Fx::new().await;
    let (id, base) = desktop(&fx).await;
    assert_eq!(fx.get(&format!("{base}/windows")).await.data(), &json!([]));
    assert_eq!(fx.get(&format!("{base}/windows/current")).await.status, 404);

    fx.post(
        &format!("{base}/open"),
        json!({"target": "https://nodeops.network"}),
    )
    .await
    .data();
    fx.post(&format!("{base}/launch"), json!({"application": "xterm"}))
        .await
        .data();
    fx.post(
        &format!("{base}/launch"),
        json!({"application": "firefox", "uri": "https://example.com"}),
    )
    .await
    .data();
    let all = fx.get(&format!("{base}/windows")).await.data().clone();
    let rows = all.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(
        rows.iter().all(|w| w.as_object().unwrap().len() == 2),
        "{all}"
    );
    let titles: Vec<&str> = rows.iter().map(|w| w["title"].as_str().unwrap()).collect();
    assert_eq!(
        titles,
        ["https://nodeops.network", "xterm", "https://example.com"]
    );
    let ff = fx
        .get(&format!("{base}/windows?application=firefox"))
        .await
        .data()
        .clone();
    assert_eq!(ff.as_array().unwrap().len(), 2, "{ff}");
    let xterm = fx
        .get(&format!(
            "{base}/windows?application=xterm&screen_id=screen-0"
        ))
        .await
        .data()[0]
        .clone();
    let xid = xterm["id"].as_str().unwrap().to_owned();
    let current = fx
        .get(&format!("{base}/windows/current"))
        .await
        .data()
        .clone();
    assert_eq!(
        current["title"], "https://example.com",
        "the newest window has the focus"
    );
    let cid = current["id"].as_str().unwrap().to_owned();

    fx.post(&format!("{base}/windows/{xid}/focus"), json!({}))
        .await
        .data();
    assert_eq!(
        fx.get(&format!("{base}/windows/current")).await.data()["id"],
        xid.as_str()
    );
    assert_eq!(
        fx.get(&format!("{base}/windows/{xid}")).await.data(),
        &xterm
    );

    fx.post(
        &format!("{base}/windows/{xid}/move"),
        json!({"x": 5, "y": 7}),
    )
    .await
    .data();
    fx.post(
        &format!("{base}/windows/{xid}/resize"),
        json!({"width": 300, "height": 200}),
    )
    .await
    .data();
    let g = fx
        .get(&format!("{base}/windows/{xid}/geometry"))
        .await
        .data()
        .clone();
    assert_eq!(
        g,
        json!({"id": xid, "x": 5, "y": 7, "width": 300, "height": 200, "screen": 0})
    );
    fx.post(&format!("{base}/windows/{xid}/maximize"), json!({}))
        .await
        .data();
    let g = fx
        .get(&format!("{base}/windows/{xid}/geometry"))
        .await
        .data()
        .clone();
    assert_eq!(
        (g["x"].clone(), g["width"].clone(), g["height"].clone()),
        (json!(0), json!(1280), json!(800))
    );
    fx.post(&format!("{base}/windows/{xid}/restore"), json!({}))
        .await
        .data();
    let g = fx
        .get(&format!("{base}/windows/{xid}/geometry"))
        .await
        .data()
        .clone();
    assert_eq!(g["width"], 300);
    fx.post(&format!("{base}/windows/{xid}/minimize"), json!({}))
        .await
        .data();
    assert_eq!(
        fx.get(&format!("{base}/windows/current")).await.data()["id"],
        cid.as_str(),
        "minimizing passes the focus on"
    );
    for (path, body) in [
        ("move", json!({"x": 1})),
        ("resize", json!({"width": 10, "height": 200})),
        ("resize", json!({"width": 300})),
    ] {
        let r = fx.post(&format!("{base}/windows/{xid}/{path}"), body).await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
    }
    assert_eq!(fx.get(&format!("{base}/windows/0xdead")).await.status, 404);
    assert_eq!(
        fx.get(&format!("{base}/windows/{xid}?screen_id=screen-1"))
            .await
            .status,
        404,
        "screen-1 does not exist"
    );

    let r = fx
        .delete(&format!("{base}/windows/{cid}?screen_id=screen-0"))
        .await;
    assert_eq!(r.data(), &json!({"ok": true}));
    assert_eq!(fx.get(&format!("{base}/windows/{cid}")).await.status, 404);
    assert_eq!(
        fx.get(&format!("{base}/windows"))
            .await
            .data()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let actions: Vec<String> = inspect(&fx, &id).await["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        actions,
        [
            "open",
            "launch",
            "launch",
            "window.focus",
            "window.move",
            "window.resize",
            "window.maximize",
            "window.restore",
            "window.minimize",
            "window.close",
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn screens_create_connect_resize_and_delete() {
    let fx = Fx::new().await;
    let (id, base) = desktop(&fx).await;
    let screens = fx.get(&format!("{base}/screens")).await.data().clone();
    assert_eq!(
        screens,
        json!([{"screen_id": "screen-0", "display": ":0", "width": 1280, "height": 800, "vnc_port": 5900, "novnc_port": 6080}])
    );
    let s1 = fx
        .post(
            &format!("{base}/screens"),
            json!({"width": 800, "height": 600}),
        )
        .await
        .data()
        .clone();
    assert_eq!(s1["screen_id"], "screen-1");
    assert_eq!(
        (s1["width"].clone(), s1["height"].clone()),
        (json!(800), json!(600))
    );
    assert_eq!(
        fx.get(&format!("{base}/screens/screen-1")).await.data(),
        &s1
    );
    assert_eq!(
        fx.get(&format!("{base}/screen?screen_id=screen-1"))
            .await
            .data(),
        &json!({"width": 800, "height": 600})
    );
    let (_, shot) = screenshot(&fx, &base, "?screen_id=screen-1").await;
    let png = decode_png(&shot);
    assert_eq!((png.width, png.height), (800, 600));
    // Each screen has its own windows.
    fx.post(
        &format!("{base}/launch?screen_id=screen-1"),
        json!({"application": "xterm"}),
    )
    .await
    .data();
    assert_eq!(fx.get(&format!("{base}/windows")).await.data(), &json!([]));
    assert_eq!(
        fx.get(&format!("{base}/windows?screen_id=screen-1"))
            .await
            .data()
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let link = fx
        .get(&format!("{base}/screens/screen-1/connect"))
        .await
        .data()
        .clone();
    assert_eq!(link["screen_id"], "screen-1");
    assert_eq!(link["port"], 6081);
    let url = link["url"].as_str().unwrap();
    let token = link["token"].as_str().unwrap();
    assert!(
        url.starts_with("https://") && url.contains(&id) && url.contains(token),
        "{url}"
    );
    assert!(link["expires_at"].as_str().unwrap().ends_with('Z'));
    assert!(link["path"].as_str().unwrap().starts_with('/'));

    let resized = fx
        .post(
            &format!("{base}/screens/screen-1/resize"),
            json!({"width": 1024, "height": 768}),
        )
        .await
        .data()
        .clone();
    assert_eq!(
        (resized["width"].clone(), resized["height"].clone()),
        (json!(1024), json!(768))
    );
    for body in [json!({"width": 1024}), json!({"width": 10, "height": 768})] {
        let r = fx
            .post(&format!("{base}/screens/screen-1/resize"), body)
            .await;
        assert_eq!(r.status, 400);
    }
    assert_eq!(
        fx.get(&format!("{base}/screens/screen-5")).await.status,
        404
    );
    assert_eq!(fx.get(&format!("{base}/screens/monitor")).await.status, 400);
    assert_eq!(
        fx.delete(&format!("{base}/screens/screen-0")).await.status,
        409
    );

    // Eight screens at most.
    for _ in 2..8 {
        fx.post(&format!("{base}/screens"), json!({})).await.data();
    }
    assert_eq!(
        fx.post(&format!("{base}/screens"), json!({})).await.status,
        409
    );

    assert_eq!(
        fx.delete(&format!("{base}/screens/screen-1")).await.data(),
        &json!({"ok": true})
    );
    assert_eq!(
        fx.get(&format!("{base}/screens/screen-1")).await.status,
        404
    );
    assert_eq!(
        fx.get(&format!("{base}/windows?screen_id=screen-1"))
            .await
            .status,
        404
    );
    assert_eq!(
        fx.get(&format!("{base}/screens"))
            .await
            .data()
            .as_array()
            .unwrap()
            .len(),
        7
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_keeps_the_desktop_and_a_delegated_token_may_use_it() {
    let fx = Fx::new().await;
    let (id, base) = desktop(&fx).await;
    fx.put(&format!("{base}/clipboard"), json!({"text": "before fork"}))
        .await
        .data();
    let fork = fx
        .post(&format!("/v1/sandboxes/{id}/fork"), json!({}))
        .await
        .data()
        .clone();
    let fid = fork["id"].as_str().unwrap();
    assert_eq!(fork["rootfs"], "desktop:1");
    let fbase = format!("/v1/sandboxes/{fid}/computer");
    assert_eq!(
        fx.get(&format!("{fbase}/clipboard")).await.data()["text"],
        "before fork"
    );
    fx.put(&format!("{fbase}/clipboard"), json!({"text": "fork"}))
        .await
        .data();
    assert_eq!(
        fx.get(&format!("{base}/clipboard")).await.data()["text"],
        "before fork",
        "the two desktops diverge"
    );

    let token = fx
        .post(&format!("/v1/sandboxes/{id}/access-token"), json!({}))
        .await
        .data()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = fx
        .send(
            reqwest::Method::GET,
            &format!("{base}/cursor"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = fx
        .send(
            reqwest::Method::GET,
            &format!("{fbase}/cursor"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, 403, "another sandbox's desktop");
}
