//! Account endpoints: health, readiness, whoami, shapes, rootfs, sandbox create/get/list.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, client_for, ok, sandbox_json, scripted_server};
use createos_api::{
    Client, CreateSandboxRequest, ErrorKind, ListSandboxesOptions, MAX_READINESS_BODY,
    RetryOptions, SandboxStatus,
};
use futures::TryStreamExt;
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn readiness_tolerates_503_and_is_not_retried() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET).path("/readyz").header_missing("x-api-key");
            then.status(503).json_body(ok(json!({"ready": false, "reason": "scheduler stale", "scheduler_last_ok_ms_ago": 9000})));
        })
        .await;
    let r = client(&server).readiness().await.unwrap();
    assert!(!r.ready);
    assert_eq!(r.reason, "scheduler stale");
    assert_eq!(r.scheduler_last_ok_ms_ago, Some(9000));
    assert_eq!(r.http_status, 503);
    m.assert_calls_async(1).await;
}

#[tokio::test]
async fn readiness_falls_back_to_the_status_without_an_envelope() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.path("/readyz");
            then.status(200).body("ok");
        })
        .await;
    assert!(client(&server).readiness().await.unwrap().ready);
}

#[tokio::test]
async fn a_readiness_body_is_capped_while_reading() {
    let (url, written) = chunked_server(200, vec![vec![b' '; 16 * 1024]], true).await;
    let err = bounded(client_for(&url, Duration::from_secs(10)).readiness())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err:?}");
    assert!(
        err.to_string().contains(&MAX_READINESS_BODY.to_string()),
        "{err}"
    );
    let sent = bounded(written).await.unwrap();
    assert!(sent < 64 * MAX_READINESS_BODY as u64, "{sent} bytes sent");
}

#[tokio::test]
async fn a_stalled_readiness_body_times_out() {
    let url = scripted_server(
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{\"status\":".to_vec(),
        Duration::from_secs(15),
    )
    .await;
    let started = std::time::Instant::now();
    let err = bounded(client_for(&url, Duration::from_millis(300)).readiness())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn shapes_walk_pages_and_accept_the_legacy_key() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/shapes").query_param("limit", "500").query_param("offset", "0").header_missing("x-api-key");
            then.status(200).json_body(ok(json!({"shapes": [
                {"id": "s-1vcpu-1gb", "vcpu": 1, "mem_mib": 1024, "default_disk_mib": 4096, "cpu_quota_pct": 100},
                {"id": "s-2vcpu-4gb", "vcpu": 2, "mem_mib": 4096, "default_disk_mib": 8192, "gpu": "none"}
            ]})));
        })
        .await;
    let shapes = client(&server).list_shapes().await.unwrap();
    m.assert_async().await;
    assert_eq!(shapes.len(), 2);
    assert_eq!(shapes[0].id, "s-1vcpu-1gb");
    assert_eq!(shapes[0].cpu_quota_pct, Some(100.0));
    assert_eq!(
        (
            shapes[1].vcpu,
            shapes[1].mem_mib,
            shapes[1].default_disk_mib
        ),
        (2, 4096, 8192)
    );
    assert_eq!(shapes[1].cpu_quota_pct, None);
}

#[tokio::test]
async fn rootfs_catalog() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/rootfs").header_missing("x-api-key");
            then.status(200).json_body(ok(json!({
                "rootfs": ["devbox:1", "desktop:1"], "default": "devbox:1",
                "entries": [{"name": "devbox:0", "deprecated": true, "successor": "devbox:1"}, {"name": "devbox:1"}]
            })));
        })
        .await;
    let cat = client(&server).list_root_file_systems().await.unwrap();
    assert_eq!(cat.default, "devbox:1");
    assert_eq!(cat.rootfs, ["devbox:1", "desktop:1"]);
    assert!(cat.entries[0].deprecated);
    assert_eq!(cat.entries[0].successor.as_deref(), Some("devbox:1"));
    assert!(!cat.entries[1].deprecated);
}

#[tokio::test]
async fn create_sends_only_set_fields_under_the_path_prefix() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/api/v1/sandboxes")
                .header("x-api-key", KEY)
                .header("content-type", "application/json")
                .json_body(json!({
                    "shape": "s-2vcpu-4gb",
                    "rootfs": "devbox:1",
                    "name": "hello",
                    "egress": ["240.0.0.0/4"],
                    "envs": {"FOO": "bar"},
                    "ingress_enabled": true,
                    "auto_pause_after_seconds": 120
                }));
            then.status(200).json_body(ok(json!({
                "id": "sb-1", "status": "paused", "name": "hello", "ip": "10.0.0.2",
                "ingress_url_template": "https://<port>-sb-1.example.test",
                "bandwidth_quota_bytes": -1
            })));
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.url("/api"))
        .build()
        .unwrap();
    let req = CreateSandboxRequest::new("s-2vcpu-4gb")
        .rootfs("devbox:1")
        .name("hello")
        .egress(["240.0.0.0/4"])
        .env("FOO", "bar")
        .ingress_enabled(true)
        .auto_pause_after_seconds(120);
    let sb = c.create_sandbox(req).await.unwrap();
    m.assert_async().await;
    assert_eq!(sb.id(), "sb-1");
    assert_eq!(sb.status(), SandboxStatus::Paused);
    let info = sb.info();
    // The create answer has no ingress_enabled: it is copied from the request.
    assert!(info.ingress_enabled);
    assert_eq!(info.bandwidth_quota_bytes, Some(-1));
    assert_eq!(
        sb.preview_url(8080).unwrap(),
        "https://8080-sb-1.example.test"
    );
}

#[tokio::test]
async fn a_minimal_create_body_is_just_the_shape() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes")
                .json_body(json!({"shape": "s-1vcpu-1gb"}));
            then.status(200)
                .json_body(ok(json!({"id": "sb-2", "status": "running"})));
        })
        .await;
    let sb = client(&server)
        .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb"))
        .await
        .unwrap();
    m.assert_async().await;
    assert_eq!(sb.status(), SandboxStatus::Running);
    // Ingress not enabled: no preview URL.
    assert_eq!(sb.preview_url(80).unwrap_err().kind(), ErrorKind::Config);
}

#[tokio::test]
async fn get_and_get_by_ip_encode_path_segments() {
    let server = MockServer::start_async().await;
    let get = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/a%2Fb%20c");
            then.status(200)
                .json_body(ok(sandbox_json("a/b c", "running")));
        })
        .await;
    let by_ip = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/by-ip/10.0.0.2");
            then.status(200)
                .json_body(ok(sandbox_json("sb-9", "paused")));
        })
        .await;
    let c = client(&server);
    let sb = c.get_sandbox("a/b c").await.unwrap();
    assert_eq!(sb.id(), "a/b c");
    let info = sb.info();
    assert_eq!(
        info.egress.as_deref(),
        Some(&["240.0.0.0/4".to_owned()][..])
    );
    assert_eq!(info.envs, ["FOO"]);
    assert_eq!(info.auto_pause_after_seconds, Some(300));
    assert_eq!(c.get_sandbox_by_ip("10.0.0.2").await.unwrap().id(), "sb-9");
    get.assert_async().await;
    by_ip.assert_async().await;
}

#[tokio::test]
async fn list_walks_offsets_until_the_total() {
    let server = MockServer::start_async().await;
    let p0 = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("limit", "2")
                .query_param("offset", "0")
                .query_param("status", "running");
            then.status(200).json_body(ok(json!({
                "data": [sandbox_json("a", "running"), sandbox_json("b", "running")],
                "pagination": {"total": 3, "offset": 0, "count": 2}
            })));
        })
        .await;
    let p1 = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("limit", "2")
                .query_param("offset", "2")
                .query_param("status", "running");
            then.status(200).json_body(ok(json!({
                "data": [sandbox_json("c", "running")],
                "pagination": {"total": 3, "offset": 2, "count": 1}
            })));
        })
        .await;
    let opts = ListSandboxesOptions {
        status: Some(SandboxStatus::Running),
        limit: Some(2),
        ..Default::default()
    };
    let all: Vec<_> = client(&server)
        .list_sandboxes(opts)
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<&str> = all.iter().map(createos_api::Sandbox::id).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    p0.assert_calls_async(1).await;
    p1.assert_calls_async(1).await;
}

#[tokio::test]
async fn list_stops_on_an_empty_page_or_a_missing_total() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("offset", "0");
            then.status(200)
                .json_body(ok(json!({"data": [sandbox_json("a", "running")]})));
        })
        .await;
    let all: Vec<_> = client(&server)
        .list_sandboxes(ListSandboxesOptions::default())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    m.assert_calls_async(1).await;

    // A server that claims more rows but returns an empty page does not loop forever.
    let server = MockServer::start_async().await;
    let empty = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes");
            then.status(200)
                .json_body(ok(json!({"data": [], "pagination": {"total": 10}})));
        })
        .await;
    let all: Vec<_> = client(&server)
        .list_sandboxes(ListSandboxesOptions::default())
        .try_collect()
        .await
        .unwrap();
    assert!(all.is_empty());
    empty.assert_calls_async(1).await;
}

#[tokio::test]
async fn lenient_decoding_of_unknown_values_and_missing_fields() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes");
            then.status(200).json_body(ok(json!([
                {"id": "a", "status": "hibernating", "envs": null, "ssh_pubkeys": null, "ingress_enabled": null, "future_field": {"x": 1}},
                {"id": "b", "status": "running", "envs": {"K": "v"}}
            ])));
        })
        .await;
    let rows: Vec<_> = client(&server)
        .list_sandboxes(ListSandboxesOptions::default())
        .try_collect()
        .await
        .unwrap();
    let a = rows[0].info();
    assert_eq!(a.status, SandboxStatus::Unknown("hibernating".into()));
    assert_eq!(a.status.to_string(), "hibernating");
    assert!(a.envs.is_empty() && a.ssh_pubkeys.is_empty() && !a.ingress_enabled);
    assert_eq!(a.extra["future_field"], json!({"x": 1}));
    assert_eq!(rows[1].info().envs, ["K"]);
}

#[tokio::test]
async fn a_bad_row_fails_the_stream_with_a_protocol_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes");
            then.status(200).json_body(ok(json!({"data": "nope"})));
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .retry(RetryOptions::none())
        .build()
        .unwrap();
    let err = c
        .list_sandboxes(ListSandboxesOptions::default())
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
}
