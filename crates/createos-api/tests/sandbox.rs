//! Sandbox handle: lifecycle calls, settings, cache updates and waits.

mod common;

use std::time::Duration;

use common::{KEY, client, ok, sandbox_json};
use createos_api::{Error, ErrorKind, ForkSandboxRequest, SandboxStatus, WaitOptions};
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn refresh_pause_resume_update_the_cache() {
    let server = MockServer::start_async().await;
    let get = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/sb-1")
                .header("x-api-key", KEY);
            then.status(200)
                .json_body(ok(sandbox_json("sb-1", "running")));
        })
        .await;
    let pause = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-1/pause");
            then.status(200)
                .json_body(ok(sandbox_json("sb-1", "pausing")));
        })
        .await;
    let resume = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-1/resume");
            then.status(200)
                .json_body(ok(sandbox_json("sb-1", "resuming")));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    assert_eq!(sb.status(), SandboxStatus::Unknown(String::new()));
    assert_eq!(sb.refresh().await.unwrap().status, SandboxStatus::Running);
    assert_eq!(sb.name().as_deref(), Some("demo"));
    assert_eq!(sb.ip_address().as_deref(), Some("10.0.0.2"));
    sb.pause().await.unwrap();
    assert_eq!(sb.status(), SandboxStatus::Pausing);
    let clone = sb.clone();
    sb.resume().await.unwrap();
    assert_eq!(
        clone.status(),
        SandboxStatus::Resuming,
        "clones share the cache"
    );
    get.assert_async().await;
    pause.assert_async().await;
    resume.assert_async().await;
}

#[tokio::test]
async fn fork_serializes_explicit_false() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/src/fork")
                .json_body(json!({"ingress_enabled": false}));
            then.status(200).json_body(ok(
                json!({"id": "fork-1", "status": "running", "forked_from": "src"}),
            ));
        })
        .await;
    let paused = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/src/fork")
                .json_body(json!({"start_paused": true}));
            then.status(200).json_body(ok(
                json!({"id": "fork-2", "status": "paused", "forked_from": "src"}),
            ));
        })
        .await;
    let sb = client(&server).sandbox_handle("src");
    let req = ForkSandboxRequest {
        ingress_enabled: Some(false),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&req).unwrap(),
        json!({"ingress_enabled": false})
    );
    let fork = sb.fork(req).await.unwrap();
    assert_eq!(fork.id(), "fork-1");
    assert_eq!(fork.info().forked_from.as_deref(), Some("src"));
    let fork2 = sb
        .fork(ForkSandboxRequest::start_paused(true))
        .await
        .unwrap();
    assert_eq!(fork2.status(), SandboxStatus::Paused);
    m.assert_async().await;
    paused.assert_async().await;
    assert_eq!(
        serde_json::to_value(ForkSandboxRequest::default()).unwrap(),
        json!({})
    );
}

#[tokio::test]
async fn destroy_caches_the_answered_status() {
    let server = MockServer::start_async().await;
    let del = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/sb-1");
            then.status(200)
                .json_body(ok(json!({"id": "sb-1", "status": "destroyed"})));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(200)
                .json_body(ok(sandbox_json("sb-1", "running")));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    sb.refresh().await.unwrap();
    assert_eq!(sb.destroy().await.unwrap(), SandboxStatus::Destroyed);
    assert_eq!(sb.status(), SandboxStatus::Destroyed);
    del.assert_async().await;
}

#[tokio::test]
async fn destroy_without_status_is_a_protocol_error_and_keeps_the_cache() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/sb-1");
            then.status(200).json_body(ok(json!({"id": "sb-1"})));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(200)
                .json_body(ok(sandbox_json("sb-1", "running")));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    sb.refresh().await.unwrap();
    let err = sb.destroy().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert_eq!(sb.status(), SandboxStatus::Running);
}

#[tokio::test]
async fn settings_calls_send_the_documented_bodies() {
    let server = MockServer::start_async().await;
    let resize = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/resize")
                .json_body(json!({"disk_mib": 16384}));
            then.status(200)
                .json_body(ok(json!({"id": "s", "disk_mib": 16384})));
        })
        .await;
    let ingress = server
        .mock_async(|when, then| {
            when.method(PATCH).path("/v1/sandboxes/s").json_body(json!({"ingress_enabled": true}));
            then.status(200).json_body(ok(json!({"id": "s", "status": "running", "ingress_enabled": true, "ingress_url_template": "https://<port>-s.example.test"})));
        })
        .await;
    let auto = server
        .mock_async(|when, then| {
            when.method(PATCH)
                .path("/v1/sandboxes/s")
                .json_body(json!({"auto_pause_after_seconds": 600}));
            then.status(200).json_body(ok(
                json!({"id": "s", "status": "running", "auto_pause_after_seconds": 600}),
            ));
        })
        .await;
    let disable = server
        .mock_async(|when, then| {
            when.method(PATCH)
                .path("/v1/sandboxes/s")
                .json_body(json!({"disable_auto_pause": true}));
            then.status(200)
                .json_body(ok(json!({"id": "s", "status": "running"})));
        })
        .await;
    let keys = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/ssh-pubkeys")
                .json_body(json!({"keys": ["ssh-ed25519 AAA"]}));
            then.status(200).json_body(ok(json!({"count": 2})));
        })
        .await;
    let egress_get = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/egress");
            then.status(200)
                .json_body(ok(json!({"id": "s", "egress": ["*"]})));
        })
        .await;
    let egress_put = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path("/v1/sandboxes/s/egress")
                .json_body(json!({"egress": ["240.0.0.0/4"]}));
            then.status(200)
                .json_body(ok(json!({"id": "s", "egress": ["240.0.0.0/4"]})));
        })
        .await;
    let bw = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/bandwidth");
            then.status(200).json_body(ok(json!({"id": "s", "quota_bytes": -1, "used_bytes": 10, "ingress_bytes": 5, "remaining_bytes": -1, "capped": false})));
        })
        .await;
    let recharge = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/bandwidth/recharge").json_body(json!({"add_bytes": 1000}));
            then.status(200).json_body(ok(json!({"id": "s", "quota_bytes": 2000, "used_bytes": 10, "remaining_bytes": 1990, "capped": false})));
        })
        .await;

    let sb = client(&server).sandbox_handle("s");
    assert_eq!(sb.resize(16384).await.unwrap().disk_mib, 16384);
    assert_eq!(sb.info().disk_mib, Some(16384));
    sb.set_ingress(true).await.unwrap();
    assert_eq!(sb.preview_url(3000).unwrap(), "https://3000-s.example.test");
    assert_eq!(
        sb.set_auto_pause(Some(Duration::from_secs(600)))
            .await
            .unwrap()
            .auto_pause_after_seconds,
        Some(600)
    );
    assert_eq!(
        sb.set_auto_pause(None)
            .await
            .unwrap()
            .auto_pause_after_seconds,
        None
    );
    for bad in [
        Duration::from_secs(59),
        Duration::from_secs(86_401),
        Duration::from_millis(60_500),
    ] {
        assert_eq!(
            sb.set_auto_pause(Some(bad)).await.unwrap_err().kind(),
            ErrorKind::Config
        );
    }
    assert_eq!(
        sb.add_ssh_public_keys(["ssh-ed25519 AAA"]).await.unwrap(),
        2
    );
    assert_eq!(sb.egress().await.unwrap(), ["*"]);
    assert_eq!(
        sb.set_egress(["240.0.0.0/4"]).await.unwrap(),
        ["240.0.0.0/4"]
    );
    assert_eq!(sb.info().egress, Some(vec!["240.0.0.0/4".to_owned()]));
    let b = sb.bandwidth().await.unwrap();
    assert_eq!((b.quota_bytes, b.used_bytes, b.ingress_bytes), (-1, 10, 5));
    assert_eq!(sb.recharge_bandwidth(1000).await.unwrap().quota_bytes, 2000);
    for m in [
        resize, ingress, auto, disable, keys, egress_get, egress_put, bw, recharge,
    ] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn wait_until_running_polls_through_resuming() {
    let server = MockServer::start_async().await;
    let resuming = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s");
            then.status(200)
                .up_to_n_times(2)
                .json_body(ok(sandbox_json("s", "resuming")));
        })
        .await;
    let running = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s");
            then.status(200).json_body(ok(sandbox_json("s", "running")));
        })
        .await;
    let sb = client(&server).sandbox_handle("s");
    let opts = WaitOptions::timeout(Duration::from_secs(10)).interval(Duration::from_millis(10));
    assert_eq!(
        sb.wait_until_running(opts).await.unwrap().status,
        SandboxStatus::Running
    );
    resuming.assert_calls_async(2).await;
    running.assert_calls_async(1).await;
}

#[tokio::test]
async fn waits_abort_on_terminal_states_and_budgets() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/failed");
            then.status(200)
                .json_body(ok(sandbox_json("failed", "failed")));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/stuck");
            then.status(200)
                .json_body(ok(sandbox_json("stuck", "resuming")));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/gone");
            then.status(404)
                .json_body(json!({"status": "fail", "data": "sandbox not found"}));
        })
        .await;
    let c = client(&server);
    let err = c
        .sandbox_handle("failed")
        .wait_until_running(WaitOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::UnexpectedState { ref status, .. } if *status == SandboxStatus::Failed),
        "{err}"
    );
    // Budget 0 checks once and reports a timeout instead of hanging.
    let err = c
        .sandbox_handle("stuck")
        .wait_until_running(WaitOptions::timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OperationTimeout);
    assert!(err.to_string().contains("resuming"), "{err}");
    let err = c
        .sandbox_handle("stuck")
        .wait_until_paused(WaitOptions::timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OperationTimeout);
    // A sandbox that is gone counts as destroyed.
    let gone = c.sandbox_handle("gone");
    assert_eq!(
        gone.wait_until_destroyed(WaitOptions::default())
            .await
            .unwrap()
            .status,
        SandboxStatus::Destroyed
    );
}

/// Every public future must be `Send` so it can be spawned on a multi-threaded runtime.
#[test]
fn public_futures_are_send() {
    fn send<T: Send>(_: T) {}
    let c = createos_api::Client::builder()
        .base_url("https://x.test")
        .build()
        .unwrap();
    let sb = c.sandbox_handle("s");
    send(c.health());
    send(c.readiness());
    send(c.whoami());
    send(c.list_shapes());
    send(c.list_root_file_systems());
    send(c.create_sandbox(createos_api::CreateSandboxRequest::new("s")));
    send(c.get_sandbox("s"));
    send(c.get_sandbox_by_ip("10.0.0.1"));
    send(c.list_sandboxes(createos_api::ListSandboxesOptions::default()));
    send(sb.refresh());
    send(sb.pause());
    send(sb.resume());
    send(sb.fork(ForkSandboxRequest::default()));
    send(sb.destroy());
    send(sb.resize(1));
    send(sb.set_ingress(true));
    send(sb.set_auto_pause(None));
    send(sb.add_ssh_public_keys(["k"]));
    send(sb.egress());
    send(sb.set_egress(["*"]));
    send(sb.bandwidth());
    send(sb.recharge_bandwidth(1));
    send(sb.wait_until_running(WaitOptions::default()));
    send(sb.wait_until_paused(WaitOptions::default()));
    send(sb.wait_until_destroyed(WaitOptions::default()));
    send(sb.wait_for_port(80, "127.0.0.1", Duration::from_secs(1)));
    send(sb.run_command(
        createos_api::RunCommandRequest::new("x"),
        createos_api::ExecOptions::default(),
    ));
    send(sb.shell("x", createos_api::ExecOptions::default()));
    send(sb.stream_command(
        createos_api::RunCommandRequest::new("x"),
        createos_api::ExecOptions::default(),
    ));
    send(sb.files().upload("/x", "y"));
    send(
        sb.files()
            .download("/x", createos_api::DownloadOptions::default()),
    );
}
