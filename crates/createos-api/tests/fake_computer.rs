//! The desktop (computer use) example against the fake control plane: its workflow in process,
//! the rest of the computer API, and the example binary itself run with
//! `CREATEOS_SANDBOX_BASE_URL` pointing at a started fake.

#![allow(dead_code)]

mod common;

use common::fake::{bounded, start};
#[path = "../examples/desktop.rs"]
mod desktop;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use createos_api::{
    ClickRequest, CreateSandboxRequest, ErrorKind, LaunchRequest, MouseButton, Point,
    ScreenCreateRequest, ScreenId, ScreenSize, ScreenshotOptions, ScrollDirection, ScrollRequest,
    TypeRequest,
};
use createos_fake::FakeOptions;
use secrecy::ExposeSecret as _;

#[tokio::test(flavor = "multi_thread")]
async fn desktop_example_workflow() {
    let (server, client) = start(FakeOptions::default()).await;
    let o = bounded(desktop::run(&client, Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(
        o.screen,
        ScreenSize {
            width: 1280,
            height: 800
        }
    );
    assert_eq!(o.screenshot_size, Some((1280, 800)));
    assert_eq!(o.region_size, Some((200, 100)));
    assert_eq!(o.cursor, Point::new(100, 80));
    assert_eq!(o.clipboard, "hello from the desktop example");
    assert!(o.novnc_is_https);
    let stats = server.stats();
    assert_eq!(
        (stats.created, stats.live),
        (1, 0),
        "the example destroys its sandbox"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_without_a_desktop_answers_501_and_the_wait_gives_up() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let sb = client
            .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb"))
            .await
            .unwrap();
        let err = sb.computer().screen().await.unwrap_err();
        assert_eq!(err.status().map(|s| s.as_u16()), Some(501), "{err}");
        let err = desktop::wait_for_desktop(&sb.computer(), Duration::from_millis(10))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OperationTimeout, "{err}");
        assert!(err.to_string().contains("501"), "{err}");
        sb.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_whole_computer_api_against_the_fake() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let sb = client
            .create_sandbox(CreateSandboxRequest::new("s-2vcpu-4gb").rootfs("desktop:1"))
            .await
            .unwrap();
        let computer = sb.computer();

        // Streamed screenshot with its headers.
        let shot = computer
            .screenshot(&ScreenshotOptions::region(10, 20, 64, 32))
            .await
            .unwrap();
        assert_eq!(shot.headers()["content-type"], "image/png");
        let len = shot.content_length();
        let png = shot.bytes().await.unwrap();
        assert_eq!(len, Some(png.len() as u64));
        assert_eq!(desktop::png_size(&png), Some((64, 32)));
        let err = computer
            .screenshot_bytes(&ScreenshotOptions::region(1270, 0, 64, 32))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");

        // Windows from open and launch.
        computer.open("https://example.com/").await.unwrap();
        computer.launch(&LaunchRequest::new("xterm")).await.unwrap();
        let windows = computer.windows();
        assert_eq!(windows.list(None).await.unwrap().len(), 2);
        let xterms = windows.list(Some("xterm")).await.unwrap();
        assert_eq!(xterms.len(), 1);
        assert_eq!(xterms[0].title, "xterm");
        let current = windows.current().await.unwrap();
        assert_eq!(current, xterms[0]);
        windows
            .move_to(&current.id, Point::new(3, 4))
            .await
            .unwrap();
        windows
            .resize(
                &current.id,
                ScreenSize {
                    width: 320,
                    height: 240,
                },
            )
            .await
            .unwrap();
        let g = windows.geometry(&current.id).await.unwrap();
        assert_eq!((g.x, g.y, g.width, g.height, g.screen), (3, 4, 320, 240, 0));
        let shot = computer
            .screenshot_bytes(&ScreenshotOptions {
                window_id: current.id.clone(),
                ..ScreenshotOptions::default()
            })
            .await
            .unwrap();
        assert_eq!(desktop::png_size(&shot), Some((320, 240)));
        windows.maximize(&current.id).await.unwrap();
        windows.minimize(&current.id).await.unwrap();
        assert_ne!(windows.current().await.unwrap().id, current.id);
        windows.restore(&current.id).await.unwrap();
        windows.focus(&current.id).await.unwrap();
        assert_eq!(windows.get(&current.id).await.unwrap(), current);
        windows.close(&current.id).await.unwrap();
        let err = windows.get(&current.id).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);

        // Mouse and keyboard.
        let mouse = computer.mouse();
        mouse
            .click(ClickRequest::at(MouseButton::Right, Point::new(7, 9)))
            .await
            .unwrap();
        assert_eq!(computer.cursor().await.unwrap(), Point::new(7, 9));
        mouse
            .scroll(ScrollRequest {
                direction: Some(ScrollDirection::Up),
                amount: Some(2),
            })
            .await
            .unwrap();
        mouse
            .drag(Point::new(1, 1), Point::new(50, 60))
            .await
            .unwrap();
        assert_eq!(computer.cursor().await.unwrap(), Point::new(50, 60));
        mouse.down(Some(MouseButton::Left)).await.unwrap();
        mouse.up(None).await.unwrap();
        let err = mouse.move_to(Point::new(5000, 0)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
        let keyboard = computer.keyboard();
        keyboard
            .type_text(&TypeRequest::new("hello"))
            .await
            .unwrap();
        keyboard.press(&["ctrl", "a"]).await.unwrap();
        keyboard.down(&["shift"]).await.unwrap();
        keyboard.up(&["shift"]).await.unwrap();
        let err = keyboard.press::<&str>(&[]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");

        // Screens.
        let screens = computer.screens();
        assert_eq!(screens.list().await.unwrap().len(), 1);
        let s1 = screens
            .create(ScreenCreateRequest {
                width: Some(800),
                height: Some(600),
            })
            .await
            .unwrap();
        assert_eq!(
            (s1.screen_id.as_str(), s1.width, s1.height),
            ("screen-1", 800, 600)
        );
        let id1 = ScreenId::parse(&s1.screen_id).unwrap();
        assert_eq!(screens.get(&id1).await.unwrap(), s1);
        let on1 = sb.computer().on_screen(id1.clone());
        assert_eq!(
            on1.screen().await.unwrap(),
            ScreenSize {
                width: 800,
                height: 600
            }
        );
        on1.set_clipboard("screen one").await.unwrap();
        assert_eq!(on1.clipboard().await.unwrap(), "screen one");
        assert_eq!(
            computer.clipboard().await.unwrap(),
            "",
            "each screen has its own"
        );
        let link = screens.connect(&id1).await.unwrap();
        assert!(link.url.expose_secret().starts_with("https://"));
        assert!(!link.token.expose_secret().is_empty());
        assert!(!format!("{link:?}").contains(link.token.expose_secret()));
        let resized = screens
            .resize(
                &id1,
                ScreenSize {
                    width: 1024,
                    height: 768,
                },
            )
            .await
            .unwrap();
        assert_eq!((resized.width, resized.height), (1024, 768));
        screens.delete(&id1).await.unwrap();
        let err = on1.screen().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let err = screens
            .delete(&ScreenId::new(0).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);

        sb.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}

/// `<target>/<profile>` of this test binary (`<target>/<profile>/deps/fake_computer-…`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(std::path::Path::parent)
        .expect("test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

/// Builds the `desktop` example into this test's target directory and profile, then runs it
/// the documented way: `CREATEOS_SANDBOX_BASE_URL` and `CREATEOS_API_KEY` pointing at a started
/// fake, nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn the_desktop_example_binary_runs_against_the_fake() {
    let profile = profile_dir();
    let target = profile.parent().unwrap().to_path_buf();
    let mut cargo = tokio::process::Command::new(env!("CARGO"));
    cargo
        .args([
            "build",
            "--quiet",
            "-p",
            "createos-api",
            "--example",
            "desktop",
        ])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if profile.file_name().is_some_and(|p| p == "release") {
        cargo.arg("--release");
    }
    let built = tokio::time::timeout(Duration::from_secs(900), cargo.output())
        .await
        .expect("building the example timed out")
        .unwrap();
    assert!(
        built.status.success(),
        "cargo build --example desktop failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let exe = profile.join("examples").join("desktop");
    assert!(exe.is_file(), "{} was not built", exe.display());

    let (server, _client) = start(FakeOptions::default()).await;
    let run = tokio::process::Command::new(&exe)
        .env_remove("CREATEOS_SANDBOX_API_KEY")
        .env_remove("CREATEOS_SHAPE")
        .env("CREATEOS_SANDBOX_BASE_URL", server.url())
        .env("CREATEOS_API_KEY", server.api_key())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the example timed out")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for want in [
        "desktop is 1280x800",
        "noVNC link for screen-0 expires at ",
        "clipboard: \"hello from the desktop example\"",
        "novnc_is_https: true",
    ] {
        assert!(stdout.contains(want), "{want:?} missing from:\n{stdout}");
    }
    assert!(
        !stdout.contains("token="),
        "the noVNC token leaked:\n{stdout}"
    );
    let stats = server.stats();
    assert_eq!((stats.created, stats.live), (1, 0));
    assert_eq!(stats.requests.get("computer").copied(), Some(8));
    server.shutdown().await;
}
