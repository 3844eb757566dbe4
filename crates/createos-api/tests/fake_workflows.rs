//! The SDK example workflows, run end to end against the fake control plane
//! (`createos-fake`), using the very code of `examples/`.

#![allow(dead_code)]

mod common;

use common::fake::{bounded, start};
#[path = "../examples/command_streaming.rs"]
mod command_streaming;
#[path = "../examples/execution_server.rs"]
mod execution_server;
#[path = "../examples/files_and_snapshots.rs"]
mod files_and_snapshots;
#[path = "../examples/hello_world.rs"]
mod hello_world;
#[path = "../examples/ingress_preview.rs"]
mod ingress_preview;

use std::time::Duration;

use createos_api::{
    CreateSandboxRequest, DownloadOptions, ErrorKind, ExecEvent, ExecOptions, ListSandboxesOptions,
    RunCommandRequest, SandboxStatus, WaitOptions,
};
use createos_fake::FakeOptions;
use futures::{StreamExt, TryStreamExt};

const SHAPE: &str = "s-2vcpu-4gb";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn hello_world() {
    let (server, client) = start(FakeOptions::default()).await;
    let out = bounded(hello_world::run(&client)).await.unwrap();
    assert!(out.starts_with("Rust says hello from "), "{out:?}");
    assert!(out.ends_with('\n'));
    let stats = server.stats();
    assert_eq!((stats.created, stats.live), (1, 0));
    server.shutdown().await;
}

#[tokio::test]
async fn command_streaming_ndjson_and_sse() {
    for sse in [false, true] {
        let (server, client) = start(FakeOptions {
            sse,
            heartbeat: Duration::from_millis(100),
            ..FakeOptions::default()
        })
        .await;
        let mut echoed = Vec::new();
        let t = bounded(command_streaming::run(&client, &mut echoed))
            .await
            .unwrap();
        assert_eq!(
            t.stdout, "step 1\nstep 2\nstep 3\nstep 4\nstep 5\n",
            "sse={sse}"
        );
        assert_eq!(t.stderr, "done\n");
        assert_eq!(t.exit_code, Some(0));
        let echoed = String::from_utf8(echoed).unwrap();
        assert!(echoed.ends_with("exit code: 0\n"), "{echoed}");
        assert_eq!(server.stats().live, 0);
        server.shutdown().await;
    }
}

#[tokio::test]
async fn files_and_snapshots_diverge_after_fork() {
    let (server, client) = start(FakeOptions {
        resume_delay: Duration::from_millis(100),
        ..FakeOptions::default()
    })
    .await;
    let o = bounded(files_and_snapshots::run(&client)).await.unwrap();
    assert_eq!(o.downloaded, br#"{"mode":"production"}"#);
    assert_eq!(o.source_state, "before-snapshot\nsource-after\n");
    assert_eq!(o.fork_state, "before-snapshot\nfork-after\n");
    assert!(o.forked_from.is_some());
    let stats = server.stats();
    assert_eq!((stats.created, stats.live), (2, 0));
    server.shutdown().await;
}

#[tokio::test]
async fn ingress_preview_waits_for_the_port() {
    let (server, client) = start(FakeOptions::default()).await;
    let port = free_port();
    let (url, page) = bounded(ingress_preview::run(&client, port)).await.unwrap();
    assert!(
        url.contains(&port.to_string()) && !url.contains("<port>"),
        "{url}"
    );
    assert_eq!(page.trim(), "hello from the sandbox");
    assert_eq!(server.stats().live, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn execution_server_validates_runs_and_always_destroys() {
    let (server, client) = start(FakeOptions::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app =
        tokio::spawn(async move { axum::serve(listener, execution_server::router(client)).await });
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/run");

    for bad in [
        "not json",
        "{}",
        r#"{"code": ""}"#,
        r#"{"code": 5}"#,
        r#"{"code": "print(1)", "timeoutSeconds": 0}"#,
    ] {
        let r = bounded(http.post(&url).body(bad).send()).await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{bad}");
    }
    assert_eq!(
        server.stats().created,
        0,
        "an invalid body must not create a sandbox"
    );

    let r = bounded(
        http.post(&url)
            .body(r#"{"code": "import sys\nprint(6*7)\nsys.exit(3)"}"#)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["stdout"], "42\n");
    assert_eq!(v["exitCode"], 3);
    assert!(
        v["executionMilliseconds"]
            .as_f64()
            .is_some_and(|ms| ms >= 0.0),
        "{v}"
    );
    let stats = server.stats();
    assert_eq!((stats.created, stats.live), (1, 0));
    app.abort();
    server.shutdown().await;
}

#[tokio::test]
async fn lifecycle_listing_and_errors_against_the_fake() {
    let (server, client) = start(FakeOptions {
        destroy_delay: Duration::from_millis(50),
        ..FakeOptions::default()
    })
    .await;
    bounded(async {
        assert!(client.health().await.unwrap().up);
        let shapes = client.list_shapes().await.unwrap();
        assert!(shapes.iter().any(|s| s.id == SHAPE && s.mem_mib == 4096));
        let a = client
            .create_sandbox(
                CreateSandboxRequest::new(SHAPE)
                    .name("list-a")
                    .env("FOO", "1"),
            )
            .await
            .unwrap();
        let b = client
            .create_sandbox(CreateSandboxRequest::new(SHAPE).name("list-b"))
            .await
            .unwrap();
        a.wait_until_running(WaitOptions::default()).await.unwrap();
        assert_eq!(a.info().envs, ["FOO"]);

        let opts = ListSandboxesOptions {
            limit: Some(1),
            ..Default::default()
        };
        let mut ids: Vec<String> = client
            .list_sandboxes(opts)
            .map_ok(|s| s.id().to_owned())
            .try_collect()
            .await
            .unwrap();
        ids.sort();
        let mut want = vec![a.id().to_owned(), b.id().to_owned()];
        want.sort();
        assert_eq!(ids, want);

        // A duplicate name among live sandboxes is refused.
        let dup = client
            .create_sandbox(CreateSandboxRequest::new(SHAPE).name("list-a"))
            .await
            .unwrap_err();
        assert_eq!(dup.kind(), ErrorKind::Conflict, "{dup}");

        // Paused sandboxes refuse exec with 409.
        a.pause().await.unwrap();
        a.wait_until_paused(WaitOptions::default()).await.unwrap();
        let err = a
            .run_command(RunCommandRequest::new("true"), ExecOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        a.resume().await.unwrap();
        a.wait_until_running(WaitOptions::default()).await.unwrap();

        // Downloads: missing file, cap.
        let err = a
            .files()
            .download("/nope.txt", DownloadOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        a.files()
            .upload("/workspace/ten.bin", vec![1u8; 10])
            .await
            .unwrap();
        let err = a
            .files()
            .download("/workspace/ten.bin", DownloadOptions::max_bytes(9))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge);

        // Egress round trip.
        a.set_egress(["240.0.0.0/4"]).await.unwrap();
        assert_eq!(a.egress().await.unwrap(), ["240.0.0.0/4"]);

        for s in [&a, &b] {
            let st = s.destroy().await.unwrap();
            assert!(
                matches!(st, SandboxStatus::Destroying | SandboxStatus::Destroyed),
                "{st}"
            );
            s.wait_until_destroyed(WaitOptions::default().interval(Duration::from_millis(20)))
                .await
                .unwrap();
        }
    })
    .await;
    assert_eq!(server.stats().live, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn retries_and_faults_against_the_fake() {
    let (server, client) = start(FakeOptions::default()).await;
    let sb = bounded(client.create_sandbox(CreateSandboxRequest::new(SHAPE)))
        .await
        .unwrap();
    // Two 503s then success: a GET survives with the default two retries.
    server.set_faults("get=503#2").unwrap();
    bounded(sb.refresh()).await.unwrap();
    // A 500 on a POST is not retried.
    server.set_faults("exec=500#1").unwrap();
    let err = bounded(sb.run_command(RunCommandRequest::new("true"), ExecOptions::default()))
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(500));
    bounded(sb.run_command(RunCommandRequest::new("true"), ExecOptions::default()))
        .await
        .unwrap();
    server.set_faults("").unwrap();

    // Stream a command and stop early: dropping the stream releases the fake's exec.
    let mut s = bounded(sb.stream_command(
        RunCommandRequest::new("sh").args(["-c", "while true; do echo tick; sleep 0.05; done"]),
        ExecOptions::default(),
    ))
    .await
    .unwrap();
    assert_eq!(
        bounded(s.next()).await.unwrap().unwrap(),
        ExecEvent::Stdout {
            data: "tick\n".into()
        }
    );
    drop(s);
    bounded(sb.destroy()).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn hostile_answers_from_the_fake_are_handled() {
    let (server, client) = start(FakeOptions::default()).await;
    let key = server.api_key().to_owned();
    bounded(async {
        // A server that reflects every request header must not leak the key into the error.
        server.set_faults("whoami=echo-headers#3").unwrap();
        let err = client.whoami().await.unwrap_err();
        for text in [
            err.to_string(),
            format!("{err:?}"),
            err.as_api().unwrap().body_text(),
        ] {
            assert!(!text.contains(&key), "key leaked: {text}");
        }
        server.set_faults("whoami=redirect#1").unwrap();
        let err = client.whoami().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
        assert!(err.to_string().contains("redirect"), "{err}");

        server.set_faults("whoami=huge#1").unwrap();
        let err = client.whoami().await.unwrap_err();
        let api = err.as_api().unwrap();
        assert_eq!(
            (api.status.as_u16(), api.body.len(), api.body_truncated),
            (404, (4 << 20) - (key.len() - 1), true)
        );

        server.set_faults("whoami=malformed#1").unwrap();
        assert_eq!(
            client.whoami().await.unwrap_err().kind(),
            ErrorKind::Protocol
        );

        server.set_faults("whoami=text#3").unwrap();
        let err = client.whoami().await.unwrap_err();
        assert_eq!(
            (err.kind(), err.as_api().unwrap().code),
            (ErrorKind::Unavailable, 0)
        );

        // A connection reset on a GET is retried, and the third attempt succeeds.
        server.set_faults("whoami=reset#2").unwrap();
        client.whoami().await.unwrap();
        // On a POST it is not.
        server.set_faults("create=reset#1").unwrap();
        let err = client
            .create_sandbox(CreateSandboxRequest::new(SHAPE))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transport, "{err:?}");
        server.set_faults("").unwrap();
    })
    .await;
    assert_eq!(server.stats().created, 0);
    server.shutdown().await;
}
