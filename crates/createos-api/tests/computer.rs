//! Computer use: screenshot query rules and streaming, screen ids, every action's request.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, client_for, ok};
use createos_api::{
    ClickRequest, ErrorKind, LaunchRequest, MAX_SCREENSHOT_BYTES, MouseButton, Point,
    ScreenCreateRequest, ScreenId, ScreenSize, ScreenshotOptions, ScrollDirection, ScrollRequest,
    TypeRequest,
};
use futures::StreamExt as _;
use httpmock::prelude::*;
use secrecy::ExposeSecret as _;
use serde_json::{Value, json};

const C: &str = "/v1/sandboxes/sb-1/computer";

fn exact_query(
    pairs: &[(&str, &str)],
) -> impl Fn(&httpmock::HttpMockRequest) -> bool + Send + Sync + 'static {
    let want: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |req| req.query_params() == want
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10\0\0\0\x08fake";

#[tokio::test]
async fn screenshot_streams_png_bytes_with_the_query_rules() {
    let server = MockServer::start_async().await;
    let full = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screenshot"))
                .header("x-api-key", KEY)
                .is_true(exact_query(&[]));
            then.status(200)
                .header("content-type", "image/png")
                .body(PNG);
        })
        .await;
    let region = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screenshot"))
                .is_true(exact_query(&[
                    ("screen_id", "screen-2"),
                    ("window_id", "0x2a"),
                    ("x", "0"),
                    ("y", "0"),
                    ("width", "16"),
                ]));
            then.status(200).body(&PNG[..8]);
        })
        .await;
    let computer = client(&server).sandbox_handle("sb-1").computer();
    let mut stream = computer
        .screenshot(&ScreenshotOptions::default())
        .await
        .unwrap();
    // The response headers come with the stream.
    assert_eq!(stream.headers().get("content-type").unwrap(), "image/png");
    assert_eq!(stream.content_length(), Some(PNG.len() as u64));
    let mut got = Vec::new();
    while let Some(chunk) = bounded(stream.next()).await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(got, PNG);
    let opts = ScreenshotOptions {
        window_id: "0x2a".into(),
        ..ScreenshotOptions::region(0, 0, 16, 0)
    };
    let png = computer
        .on_screen(ScreenId::parse("screen-2").unwrap())
        .screenshot_bytes(&opts)
        .await
        .unwrap();
    assert_eq!(&png[..], &PNG[..8]);
    full.assert_async().await;
    region.assert_async().await;
}

#[tokio::test]
async fn screen_cursor_clipboard_open_and_launch() {
    let server = MockServer::start_async().await;
    let screen = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screen"))
                .is_true(exact_query(&[("screen_id", "screen-0")]));
            then.status(200)
                .json_body(ok(json!({"width": 1280, "height": 800})));
        })
        .await;
    let cursor = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/cursor"))
                .is_true(exact_query(&[("screen_id", "screen-0")]));
            then.status(200).json_body(ok(json!({"x": 5, "y": 7})));
        })
        .await;
    let get_clip = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/clipboard"));
            then.status(200).json_body(ok(json!({"text": "copied"})));
        })
        .await;
    let set_clip = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path(format!("{C}/clipboard"))
                .json_body(json!({"text": "pasted"}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let open = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{C}/open"))
                .json_body(json!({"target": "https://example.test"}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let launch = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{C}/launch"))
                .json_body(json!({"application": "firefox", "uri": "https://example.test"}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let launch_bare = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{C}/launch"))
                .json_body(json!({"application": "xterm"}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let computer = client(&server).sandbox_handle("sb-1").computer();
    let on0 = computer.clone().on_screen(ScreenId::new(0).unwrap());
    assert_eq!(
        on0.screen().await.unwrap(),
        ScreenSize {
            width: 1280,
            height: 800
        }
    );
    assert_eq!(on0.cursor().await.unwrap(), Point::new(5, 7));
    assert_eq!(computer.clipboard().await.unwrap(), "copied");
    computer.set_clipboard("pasted").await.unwrap();
    computer.open("https://example.test").await.unwrap();
    computer
        .launch(&LaunchRequest::new("firefox").uri("https://example.test"))
        .await
        .unwrap();
    computer.launch(&LaunchRequest::new("xterm")).await.unwrap();
    for m in [
        &screen,
        &cursor,
        &get_clip,
        &set_clip,
        &open,
        &launch,
        &launch_bare,
    ] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn mouse_and_keyboard_send_the_documented_bodies_with_the_screen_id() {
    let server = MockServer::start_async().await;
    let cases: Vec<(&str, Value)> = vec![
        ("/mouse/move", json!({"x": 10, "y": 0})),
        (
            "/mouse/click",
            json!({"button": "right", "x": 0, "y": 0, "count": 2}),
        ),
        ("/mouse/click", json!({})),
        ("/mouse/scroll", json!({"direction": "down", "amount": 3})),
        (
            "/mouse/drag",
            json!({"from": {"x": 1, "y": 2}, "to": {"x": 3, "y": 4}}),
        ),
        ("/mouse/down", json!({"button": "middle"})),
        ("/mouse/up", json!({})),
        ("/keyboard/type", json!({"text": "hello", "delay_in_ms": 5})),
        ("/keyboard/press", json!({"keys": ["ctrl", "c"]})),
        ("/keyboard/down", json!({"keys": ["shift"]})),
        ("/keyboard/up", json!({"keys": ["shift"]})),
    ];
    let mut mocks = Vec::new();
    for (tail, body) in &cases {
        let path = format!("{C}{tail}");
        let body = body.clone();
        mocks.push(
            server
                .mock_async(move |when, then| {
                    when.method(POST)
                        .path(path)
                        .is_true(exact_query(&[("screen_id", "screen-3")]))
                        .json_body(body);
                    then.status(200).json_body(ok(json!({"ok": true})));
                })
                .await,
        );
    }
    let computer = client(&server)
        .sandbox_handle("sb-1")
        .computer()
        .on_screen("screen-3".parse().unwrap());
    let mouse = computer.mouse();
    mouse.move_to(Point::new(10, 0)).await.unwrap();
    mouse
        .click(ClickRequest {
            count: 2,
            ..ClickRequest::at(MouseButton::Right, Point::new(0, 0))
        })
        .await
        .unwrap();
    mouse.click(ClickRequest::default()).await.unwrap();
    mouse
        .scroll(ScrollRequest {
            direction: Some(ScrollDirection::Down),
            amount: Some(3),
        })
        .await
        .unwrap();
    mouse
        .drag(Point::new(1, 2), Point::new(3, 4))
        .await
        .unwrap();
    mouse.down(Some(MouseButton::Middle)).await.unwrap();
    mouse.up(None).await.unwrap();
    let keyboard = computer.keyboard();
    keyboard
        .type_text(&TypeRequest {
            text: "hello".into(),
            delay_in_ms: Some(5),
        })
        .await
        .unwrap();
    keyboard.press(&["ctrl", "c"]).await.unwrap();
    keyboard.down(&["shift"]).await.unwrap();
    keyboard.up(&["shift"]).await.unwrap();
    for m in &mocks {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn windows_list_get_geometry_actions_and_close() {
    let server = MockServer::start_async().await;
    let list = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/windows"))
                .is_true(exact_query(&[
                    ("screen_id", "screen-1"),
                    ("application", "xterm"),
                ]));
            then.status(200).json_body(ok(
                json!([{"id": 41, "title": "xterm"}, {"id": "42", "title": "b"}]),
            ));
        })
        .await;
    let current = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/windows/current"));
            then.status(200)
                .json_body(ok(json!({"id": "41", "title": "xterm"})));
        })
        .await;
    let get = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/windows/41"));
            then.status(200)
                .json_body(ok(json!({"id": "41", "title": "xterm"})));
        })
        .await;
    let geometry = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/windows/41/geometry"));
            then.status(200).json_body(ok(
                json!({"id": 41, "x": 0, "y": 20, "width": 640, "height": 480, "screen": 1}),
            ));
        })
        .await;
    let mut actions = Vec::new();
    for (tail, body) in [
        ("/focus", None),
        ("/maximize", None),
        ("/minimize", None),
        ("/restore", None),
        ("/move", Some(json!({"x": 0, "y": 0}))),
        ("/resize", Some(json!({"width": 300, "height": 200}))),
    ] {
        let path = format!("{C}/windows/41{tail}");
        actions.push(
            server
                .mock_async(move |when, then| {
                    let when = when
                        .method(POST)
                        .path(path)
                        .is_true(exact_query(&[("screen_id", "screen-1")]));
                    match body {
                        Some(b) => {
                            when.json_body(b);
                        }
                        None => {
                            when.body("");
                        }
                    }
                    then.status(200).json_body(ok(json!({"ok": true})));
                })
                .await,
        );
    }
    let close = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(format!("{C}/windows/41"))
                .is_true(exact_query(&[("screen_id", "screen-1")]));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let windows = client(&server)
        .sandbox_handle("sb-1")
        .computer()
        .on_screen(ScreenId::new(1).unwrap())
        .windows();
    let all = windows.list(Some("xterm")).await.unwrap();
    assert_eq!(
        all.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        ["41", "42"]
    );
    assert_eq!(windows.current().await.unwrap().title, "xterm");
    assert_eq!(windows.get("41").await.unwrap().id, "41");
    let g = windows.geometry("41").await.unwrap();
    assert_eq!(
        (g.x, g.y, g.width, g.height, g.screen),
        (0, 20, 640, 480, 1)
    );
    windows.focus("41").await.unwrap();
    windows.maximize("41").await.unwrap();
    windows.minimize("41").await.unwrap();
    windows.restore("41").await.unwrap();
    windows.move_to("41", Point::new(0, 0)).await.unwrap();
    windows
        .resize(
            "41",
            ScreenSize {
                width: 300,
                height: 200,
            },
        )
        .await
        .unwrap();
    windows.close("41").await.unwrap();
    for m in [&list, &current, &get, &geometry, &close]
        .into_iter()
        .chain(actions.iter())
    {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn screens_never_send_a_screen_id_query_and_connect_hides_the_token() {
    let server = MockServer::start_async().await;
    let screen = json!({"screen_id": "screen-1", "display": ":2", "width": 1024, "height": 768, "vnc_port": 5902, "novnc_port": 6082});
    let s1 = screen.clone();
    let list = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screens"))
                .is_true(exact_query(&[]));
            then.status(200).json_body(ok(json!([s1])));
        })
        .await;
    let s2 = screen.clone();
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{C}/screens"))
                .is_true(exact_query(&[]))
                .json_body(json!({"width": 1024}));
            then.status(200).json_body(ok(s2));
        })
        .await;
    let s3 = screen.clone();
    let get = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screens/screen-1"))
                .is_true(exact_query(&[]));
            then.status(200).json_body(ok(s3));
        })
        .await;
    let connect = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/screens/screen-1/connect"));
            then.status(200).json_body(ok(json!({
                "screen_id": "screen-1", "port": 6082, "path": "/vnc.html", "token": "vnc-secret-tok",
                "expires_at": "2026-11-29T11:00:00Z", "url": "https://6082-sb-1.example.test/vnc.html?token=vnc-secret-tok"
            })));
        })
        .await;
    let s4 = screen.clone();
    let resize = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{C}/screens/screen-1/resize"))
                .json_body(json!({"width": 800, "height": 600}));
            then.status(200).json_body(ok(s4));
        })
        .await;
    let delete = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(format!("{C}/screens/screen-1"))
                .is_true(exact_query(&[]));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    // Even a handle bound to a screen addresses screens by path only.
    let screens = client(&server)
        .sandbox_handle("sb-1")
        .computer()
        .on_screen(ScreenId::new(4).unwrap())
        .screens();
    let id = ScreenId::new(1).unwrap();
    assert_eq!(screens.list().await.unwrap()[0].display, ":2");
    let created = screens
        .create(ScreenCreateRequest {
            width: Some(1024),
            height: None,
        })
        .await
        .unwrap();
    assert_eq!(created.novnc_port, 6082);
    assert_eq!(screens.get(&id).await.unwrap().width, 1024);
    let link = screens.connect(&id).await.unwrap();
    assert!(link.url.expose_secret().starts_with("https://"));
    assert_eq!(link.token.expose_secret(), "vnc-secret-tok");
    assert!(!format!("{link:?}").contains("vnc-secret-tok"));
    screens
        .resize(
            &id,
            ScreenSize {
                width: 800,
                height: 600,
            },
        )
        .await
        .unwrap();
    screens.delete(&id).await.unwrap();
    for m in [&list, &create, &get, &connect, &resize, &delete] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn screenshot_errors_and_bad_screen_ids() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/screenshot"));
            then.status(409)
                .json_body(json!({"status": "fail", "data": "desktop is not running"}));
        })
        .await;
    let computer = client(&server).sandbox_handle("sb-1").computer();
    let Err(err) = computer.screenshot(&ScreenshotOptions::default()).await else {
        panic!("screenshot must fail");
    };
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(
        ScreenId::parse("screen-8").unwrap_err().kind(),
        ErrorKind::Config
    );
}

#[path = "../examples/desktop.rs"]
#[allow(dead_code)]
mod desktop;

/// A PNG header (signature + IHDR) claiming `width` × `height`.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    png.extend_from_slice(&width.to_be_bytes());
    png.extend_from_slice(&height.to_be_bytes());
    png.extend_from_slice(b"\x08\x06\0\0\0");
    png
}

#[tokio::test]
async fn the_desktop_example_against_a_mocked_desktop() {
    let server = MockServer::start_async().await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes")
                .json_body_includes(r#"{"rootfs": "desktop:1"}"#);
            then.status(200)
                .json_body(ok(json!({"id": "sb-1", "status": "running"})));
        })
        .await;
    // The desktop is still starting on the first poll.
    let starting = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/screen"));
            then.status(503)
                .json_body(json!({"status": "error", "message": "desktop starting"}));
        })
        .await;
    let s0 = [("screen_id", "screen-0")];
    let full = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screenshot"))
                .is_true(exact_query(&s0));
            then.status(200).body(png_header(1280, 800));
        })
        .await;
    let region = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{C}/screenshot"))
                .is_true(exact_query(&[
                    ("screen_id", "screen-0"),
                    ("x", "0"),
                    ("y", "0"),
                    ("width", "200"),
                    ("height", "100"),
                ]));
            then.status(200).body(png_header(200, 100));
        })
        .await;
    let mouse = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{C}/mouse/move"))
                .json_body(json!({"x": 100, "y": 80}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let cursor = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/cursor"));
            then.status(200).json_body(ok(json!({"x": 100, "y": 80})));
        })
        .await;
    let set_clip = server
        .mock_async(|when, then| {
            when.method(PUT).path(format!("{C}/clipboard"));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let get_clip = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/clipboard"));
            then.status(200)
                .json_body(ok(json!({"text": "hello from the desktop example"})));
        })
        .await;
    let connect = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/screens/screen-0/connect"));
            then.status(200).json_body(ok(json!({
                "screen_id": "screen-0", "port": 6080, "path": "/vnc.html", "token": "t",
                "expires_at": "2026-11-29T11:00:00Z", "url": "https://6080-sb-1.example.test/vnc.html?token=t"
            })));
        })
        .await;
    let destroy = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/sb-1");
            then.status(200)
                .json_body(ok(json!({"id": "sb-1", "status": "destroying"})));
        })
        .await;
    let c = client(&server);
    let run = tokio::spawn(async move { desktop::run(&c, Duration::from_secs(20)).await });
    // Let the example see the "starting" answer, then bring the desktop up.
    bounded(async {
        while starting.calls_async().await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    starting.delete_async().await;
    let ready = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{C}/screen"));
            then.status(200)
                .json_body(ok(json!({"width": 1280, "height": 800})));
        })
        .await;
    let outcome = bounded(run).await.unwrap().unwrap();
    assert_eq!(
        outcome.screen,
        ScreenSize {
            width: 1280,
            height: 800
        }
    );
    assert_eq!(outcome.screenshot_size, Some((1280, 800)));
    assert_eq!(outcome.region_size, Some((200, 100)));
    assert_eq!(outcome.cursor, Point::new(100, 80));
    assert_eq!(outcome.clipboard, "hello from the desktop example");
    assert!(outcome.novnc_is_https);
    for m in [
        &create, &full, &region, &mouse, &cursor, &set_clip, &get_clip, &connect, &destroy, &ready,
    ] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn screenshot_bytes_is_capped_while_reading() {
    // Chunked and endless: only the cap can end it.
    let (url, written) = chunked_server(200, vec![vec![0u8; 256 * 1024]], true).await;
    let err = bounded(
        client_for(&url, Duration::from_secs(10))
            .sandbox_handle("sb-1")
            .computer()
            .screenshot_bytes(&ScreenshotOptions::default()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err:?}");
    assert!(
        matches!(err, createos_api::Error::TooLarge { limit, .. } if limit == MAX_SCREENSHOT_BYTES)
    );
    let sent = bounded(written).await.unwrap();
    assert!(sent < 2 * MAX_SCREENSHOT_BYTES, "{sent} bytes sent");
}
