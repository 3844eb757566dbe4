//! The lifecycle API: each call's request (method, path, query, key header, body) and the
//! decoding of its answer, including the error paths a provider relies on.

mod common;

use std::time::Duration;

use common::{KEY, SB, assert_no_key, client};
use httpmock::prelude::*;
use opensandbox_api::{
    CreateSandbox, Deletion, Diagnostics, EnforcementMode, ErrorKind, Lifetime, NetworkPolicy,
    NetworkRule, PolicyAction, PolicyMode, RuntimeClass, SandboxFilter, SandboxState,
    SnapshotFilter, SnapshotState, parse_timestamp,
};
use serde_json::json;

fn sandbox(id: &str, state: &str) -> serde_json::Value {
    json!({
        "id": id,
        "status": {"state": state, "reason": null, "message": "ok", "lastTransitionAt": "2026-12-04T10:00:01Z"},
        "metadata": {"created-by": "langflow"},
        "entrypoint": ["tail", "-f", "/dev/null"],
        "expiresAt": "2026-12-04T10:10:00Z",
        "createdAt": "2026-12-04T10:00:00.250Z"
    })
}

#[tokio::test]
async fn create_sends_the_whole_request_once_with_the_key() {
    let server = MockServer::start_async().await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes")
                .header("open-sandbox-api-key", KEY)
                .header("content-type", "application/json")
                .json_body(json!({
                    "image": {"uri": "python:3.11"},
                    "entrypoint": ["tail", "-f", "/dev/null"],
                    "timeout": 3600,
                    "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
                    "env": {"PYTHONUNBUFFERED": "1"},
                    "metadata": {"created-by": "langflow", "lf-nonce": "n-1"},
                    "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]},
                    "extensions": {"access.renew.extend.seconds": "600"}
                }));
            then.status(202)
                .header("x-request-id", "req-1")
                .json_body(sandbox(SB, "Running"));
        })
        .await;
    let c = client(&server);
    let req = CreateSandbox::from_image("python:3.11", ["tail", "-f", "/dev/null"])
        .lifetime(Lifetime::After(Duration::from_secs(3600)))
        .resource("cpu", "500m")
        .resource("memory", "512Mi")
        .env("PYTHONUNBUFFERED", "1")
        .metadata("created-by", "langflow")
        .metadata("lf-nonce", "n-1")
        .network_policy(NetworkPolicy::deny_all().allow("pypi.org"))
        .extension("access.renew.extend.seconds", "600");
    let info = c.create_sandbox(&req).await.unwrap();
    create.assert_async().await;
    assert_eq!(info.id, SB);
    assert_eq!(info.status.state, SandboxState::Running);
    assert_eq!(info.metadata["created-by"], "langflow");
    assert_eq!(info.created(), parse_timestamp("2026-12-04T10:00:00.250Z"));
}

#[tokio::test]
async fn create_is_never_repeated_even_on_5xx() {
    let server = MockServer::start_async().await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(503)
                .json_body(json!({"code": "UNAVAILABLE", "message": "busy"}));
        })
        .await;
    let err = client(&server)
        .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.is_retryable(), "the caller may look for it and retry");
    create.assert_calls_async(1).await;
}

#[tokio::test]
async fn an_image_pull_failure_is_not_worth_repeating() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(500).json_body(json!({
                "code": "DOCKER::SANDBOX_IMAGE_PULL_FAILED",
                "message": "Failed to pull image img: 404 Client Error: Not Found",
            }));
        })
        .await;
    let err = client(&server)
        .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.is_image_pull_failure(), "{err}");
    assert!(!err.is_retryable(), "the same image fails the same way");
    // Another 500 is still worth repeating.
    let other = MockServer::start_async().await;
    other
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(500)
                .json_body(json!({"code": "DOCKER::SANDBOX_START_FAILED", "message": "no"}));
        })
        .await;
    let err = client(&other)
        .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
        .await
        .unwrap_err();
    assert!(!err.is_image_pull_failure() && err.is_retryable(), "{err}");
}

#[tokio::test]
async fn a_kubernetes_pod_failed_on_its_image_is_an_image_pull_failure() {
    // The 1.1.1 server on Kubernetes waits in the create; OpenSandbox's controller marks the
    // BatchSandbox Failed with the kubelet's waiting reason, and the create answers this.
    for (reason, pull) in [
        ("ErrImagePull", true),
        ("ImagePullBackOff", true),
        ("CrashLoopBackOff", false),
        ("CreateContainerConfigError", false),
    ] {
        let server = MockServer::start_async().await;
        server
            .mock_async(|when, then| {
                when.method(POST).path("/v1/sandboxes");
                then.status(500).json_body(json!({
                    "code": "KUBERNETES::POD_FAILED",
                    "message": format!(
                        "Sandbox 6b1f failed: 1/1 observed pods failed; primary reason={reason}; \
                         sample pod=6b1f-0"
                    ),
                }));
            })
            .await;
        let err = client(&server)
            .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
            .await
            .unwrap_err();
        assert_eq!(err.is_image_pull_failure(), pull, "{reason}: {err}");
        assert_eq!(err.is_retryable(), !pull, "{reason}: {err}");
    }
    assert!(opensandbox_api::is_image_pull_message(
        "FAILED: 1/1 observed pods failed; primary reason=ImagePullBackOff; sample pod=x"
    ));
    assert!(!opensandbox_api::is_image_pull_message(
        "Sandbox is running"
    ));
}

#[tokio::test]
async fn a_create_with_registry_credentials_never_shows_the_password() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            // FastAPI's validation errors echo the input.
            then.status(422).json_body(json!({"detail": [{
                "msg": "bad image; got password registry-pw-77aa",
                "input": {"image": {"auth": {"password": "registry-pw-77aa"}}}
            }]}));
        })
        .await;
    let err = client(&server)
        .create_sandbox(
            &CreateSandbox::from_image("img", ["sh"]).image_auth("bot", "registry-pw-77aa"),
        )
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("registry-pw"), "{shown}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[tokio::test]
async fn get_decodes_unknown_states_and_fields_and_errors_carry_code_and_request_id() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-new");
            then.status(200).json_body(json!({
                "id": "sb-new",
                "status": {"state": "Hibernating"},
                "allocation": {"poolRef": "p1"}
            }));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/gone");
            then.status(404)
                .header("x-request-id", "r".repeat(300))
                .json_body(json!({"code": "DOCKER::SANDBOX_NOT_FOUND", "message": "Sandbox gone not found"}));
        })
        .await;
    let c = client(&server);
    let info = c.get_sandbox("sb-new").await.unwrap();
    assert_eq!(info.status.state, SandboxState::Other("Hibernating".into()));
    assert!(info.metadata.is_empty() && info.entrypoint.is_empty());
    assert_eq!(info.extra["allocation"], json!({"poolRef": "p1"}));

    let err = c.get_sandbox("gone").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.code(), Some("DOCKER::SANDBOX_NOT_FOUND"));
    let api = err.as_api().unwrap();
    assert_eq!(api.message, "Sandbox gone not found");
    assert_eq!(api.route.to_string(), "GET /sandboxes/gone");
    // A request id is kept, capped.
    assert_eq!(api.request_id, format!("{}…", "r".repeat(128)));
}

#[tokio::test]
async fn list_encodes_the_metadata_filter_twice_and_walks_pages() {
    let server = MockServer::start_async().await;
    let page1 = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                // One decoding (the query's) leaves the form-encoded pairs the server then
                // parses with parse_qsl.
                .query_param("metadata", "created-by=langflow&lf-nonce=n+1")
                .query_param("state", "Running")
                .query_param("page", "1")
                .header("open-sandbox-api-key", KEY);
            then.status(200).json_body(json!({
                "items": [sandbox("a", "Running")],
                "pagination": {"page": 1, "pageSize": 1, "totalItems": 2, "totalPages": 2, "hasNextPage": true}
            }));
        })
        .await;
    let page2 = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes").query_param("page", "2");
            then.status(200).json_body(json!({
                "items": [sandbox("b", "Paused")],
                "pagination": {"page": 2, "pageSize": 1, "totalItems": 2, "totalPages": 2, "hasNextPage": false}
            }));
        })
        .await;
    let c = client(&server);
    let filter = SandboxFilter::metadata("created-by", "langflow")
        .and_metadata("lf-nonce", "n 1")
        .state(SandboxState::Running);
    let all = c.list_all_sandboxes(&filter).await.unwrap();
    assert_eq!(
        all.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    page1.assert_async().await;
    page2.assert_async().await;
}

#[tokio::test]
async fn the_raw_query_has_the_nested_encoding_the_server_parses() {
    let server = common::RawServer::start(|_| {
        vec![common::Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"items\":[]}"[..]
                .to_vec(),
        )]
    })
    .await;
    let page = server
        .client()
        .list_sandboxes(&SandboxFilter::metadata("note", "a&b=c d"), 1)
        .await
        .unwrap();
    assert!(page.items.is_empty() && !page.pagination.has_next_page);
    let (head, _) = server.request(0);
    let line = head.lines().next().unwrap();
    assert_eq!(
        line, "GET /v1/sandboxes?metadata=note%3Da%2526b%253Dc%2Bd&page=1 HTTP/1.1",
        "the value is form-encoded k=v pairs, form-encoded again as a query value"
    );
}

#[tokio::test]
async fn find_by_metadata_is_the_nonce_lookup() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("metadata", "lf-nonce=abc123")
                .query_param_missing("state");
            then.status(200).json_body(json!({
                "items": [sandbox("orphan", "Pending")],
                "pagination": {"page": 1, "pageSize": 20, "totalItems": 1, "totalPages": 1, "hasNextPage": false}
            }));
        })
        .await;
    let found = client(&server)
        .find_by_metadata("lf-nonce", "abc123")
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, "orphan");
    m.assert_async().await;
}

#[tokio::test]
async fn delete_is_repeated_after_a_500_and_a_404_means_gone() {
    let server = MockServer::start_async().await;
    let first = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/paused-gvisor");
            then.status(500)
                .json_body(json!({"code": "DOCKER::SANDBOX_DELETE_FAILED", "message": "paused"}));
        })
        .await;
    first.up_to_n_times_async(1).await;
    let second = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path("/v1/sandboxes/paused-gvisor")
                .header("open-sandbox-api-key", KEY);
            then.status(204);
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/gone");
            then.status(404)
                .json_body(json!({"code": "DOCKER::SANDBOX_NOT_FOUND", "message": "gone"}));
        })
        .await;
    let c = client(&server);
    assert_eq!(
        c.delete_sandbox("paused-gvisor").await.unwrap(),
        Deletion::Deleted
    );
    first.assert_calls_async(1).await;
    second.assert_calls_async(1).await;
    assert_eq!(
        c.delete_sandbox("gone").await.unwrap(),
        Deletion::AlreadyGone
    );
}

#[tokio::test]
async fn patch_metadata_sends_a_merge_patch() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(PATCH)
                .path("/v1/sandboxes/sb-1/metadata")
                .json_body(json!({"lf-run": "r2", "lf-nonce": null}));
            then.status(200).json_body(sandbox(SB, "Running"));
        })
        .await;
    let info = client(&server)
        .patch_metadata(SB, [("lf-run", Some("r2")), ("lf-nonce", None)])
        .await
        .unwrap();
    assert_eq!(info.id, SB);
    m.assert_async().await;
}

#[tokio::test]
async fn renew_is_clamped_by_the_caller() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sb-1/renew-expiration");
            then.status(200)
                .json_body(json!({"expiresAt": "2026-12-04T11:00:00Z"}));
        })
        .await;
    let c = client(&server);
    let before = opensandbox_api::OffsetDateTime::now_utc();
    let r = c
        .renew_expiration(
            SB,
            Duration::from_secs(3 * 86_400),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    let after = opensandbox_api::OffsetDateTime::now_utc();
    assert!(r.clamped);
    let sent = parse_timestamp(&r.requested).unwrap();
    assert!(
        sent <= after + Duration::from_secs(3600),
        "{} past the maximum",
        r.requested
    );
    assert!(
        sent >= before + Duration::from_secs(3599),
        "{} too early",
        r.requested
    );
    assert!(r.requested.ends_with('Z') && !r.requested.contains('.'));
    assert_eq!(r.expires_at, "2026-12-04T11:00:00Z");
    m.assert_async().await;
    let r = c
        .renew_expiration(SB, Duration::from_secs(600), Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(!r.clamped);
    assert!(
        c.renew_expiration(SB, Duration::ZERO, Duration::from_secs(1))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn pause_and_resume_are_sent_once() {
    let server = MockServer::start_async().await;
    let pause = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sb-1/pause")
                .header("open-sandbox-api-key", KEY);
            then.status(202);
        })
        .await;
    let resume = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-1/resume");
            then.status(409)
                .json_body(json!({"code": "SANDBOX_NOT_PAUSED", "message": "running"}));
        })
        .await;
    let c = client(&server);
    c.pause_sandbox(SB).await.unwrap();
    let err = c.resume_sandbox(SB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    pause.assert_calls_async(1).await;
    resume.assert_calls_async(1).await;
}

#[tokio::test]
async fn snapshots_create_get_list_delete() {
    let server = MockServer::start_async().await;
    let snap = |state: &str| json!({"id": "snap-1", "sandboxId": SB, "name": "before", "status": {"state": state}, "createdAt": "2026-12-04T10:00:00Z"});
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sb-1/snapshots")
                .json_body(json!({"name": "before"}));
            then.status(202).json_body(snap("Creating"));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/snapshots/snap-1");
            then.status(200).json_body(snap("Ready"));
        })
        .await;
    let list = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/snapshots")
                .query_param("sandboxId", SB)
                .query_param("state", "Ready")
                .query_param("page", "1");
            then.status(200).json_body(
                json!({"items": [snap("Archived")], "pagination": {"hasNextPage": false}}),
            );
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/snapshots/snap-1");
            then.status(204);
        })
        .await;
    let c = client(&server);
    assert_eq!(
        c.create_snapshot(SB, Some("before"))
            .await
            .unwrap()
            .status
            .state,
        SnapshotState::Creating
    );
    assert_eq!(
        c.get_snapshot("snap-1").await.unwrap().status.state,
        SnapshotState::Ready
    );
    let page = c
        .list_snapshots(&SnapshotFilter {
            sandbox_id: Some(SB.into()),
            states: vec![SnapshotState::Ready],
            ..SnapshotFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.items[0].status.state,
        SnapshotState::Other("Archived".into())
    );
    assert_eq!(
        c.delete_snapshot("snap-1").await.unwrap(),
        Deletion::Deleted
    );
    create.assert_calls_async(1).await;
    list.assert_async().await;
}

#[tokio::test]
async fn network_policy_read_back_keeps_the_enforcement_mode() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1/networkpolicy").header("open-sandbox-api-key", KEY);
            then.status(200).json_body(json!({
                "status": "ok", "mode": "enforcing", "enforcementMode": "dns+nft",
                "policy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}
            }));
        })
        .await;
    let put = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path("/v1/sandboxes/sb-1/networkpolicy")
                .json_body(json!({"defaultAction": "deny", "egress": []}));
            then.status(200)
                .json_body(json!({"status": "ok", "mode": "deny_all", "enforcementMode": "dns"}));
        })
        .await;
    let patch = server
        .mock_async(|when, then| {
            when.method(PATCH)
                .path("/v1/sandboxes/sb-1/networkpolicy")
                .json_body(json!([{"action": "deny", "target": "*.example.com"}]));
            then.status(200).json_body(
                json!({"status": "ok", "mode": "enforcing", "enforcementMode": "dns+nft"}),
            );
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/no-sidecar/networkpolicy");
            then.status(502).json_body(
                json!({"code": "BACKEND_CONNECTION_FAILED", "message": "connect refused"}),
            );
        })
        .await;
    let c = client(&server);
    let p = c.get_network_policy(SB).await.unwrap();
    assert_eq!(p.enforcement_mode, EnforcementMode::DnsNft);
    assert_eq!(p.mode, PolicyMode::Enforcing);
    assert_eq!(
        p.policy.unwrap(),
        NetworkPolicy::deny_all().allow("pypi.org")
    );
    let p = c
        .replace_network_policy(SB, &NetworkPolicy::deny_all())
        .await
        .unwrap();
    assert_eq!(p.enforcement_mode, EnforcementMode::Dns);
    let rule = NetworkRule {
        action: PolicyAction::Deny,
        target: "*.example.com".into(),
    };
    c.patch_network_policy(SB, &[rule]).await.unwrap();
    put.assert_async().await;
    patch.assert_async().await;
    let err = c.get_network_policy("no-sidecar").await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(502));
    assert_eq!(err.code(), Some("BACKEND_CONNECTION_FAILED"));
}

#[tokio::test]
async fn endpoints_ask_for_the_server_proxy() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/sb-1/endpoints/44772")
                .query_param("use_server_proxy", "true");
            then.status(200).json_body(json!({
                "endpoint": "127.0.0.1:8080/sandboxes/sb-1/proxy/44772",
                "headers": {"X-Secure": "tok-abc-123"}
            }));
        })
        .await;
    let e = client(&server).get_endpoint(SB, 44772, true).await.unwrap();
    m.assert_async().await;
    assert_eq!(e.endpoint, "127.0.0.1:8080/sandboxes/sb-1/proxy/44772");
    assert_eq!(e.headers["X-Secure"], "tok-abc-123");
    assert!(!format!("{e:?}").contains("tok-abc"));
}

#[tokio::test]
async fn diagnostics_are_plain_text_and_the_runtime_class_is_read() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/sb-1/diagnostics/inspect");
            then.status(200)
                .header("content-type", "text/plain; charset=utf-8")
                .body("Pod:            sb-1\nRuntime Class:  kata-fc\nStart Time: now\n");
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/docker/diagnostics/inspect");
            then.status(200)
                .body("Image: python:3.11\nState: running\n");
        })
        .await;
    let logs = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1/diagnostics/logs");
            then.status(200).body("line 1\n");
        })
        .await;
    let c = client(&server);
    assert_eq!(
        c.runtime_class(SB).await.unwrap(),
        RuntimeClass::Named("kata-fc".into())
    );
    assert_eq!(
        c.runtime_class("docker").await.unwrap(),
        RuntimeClass::NotReported
    );
    assert_eq!(
        c.diagnostics(SB, Diagnostics::Logs).await.unwrap(),
        "line 1\n"
    );
    logs.assert_async().await;
}

#[tokio::test]
async fn wait_until_running_polls_and_stops_on_failure() {
    let server = MockServer::start_async().await;
    let pending = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/k8s");
            then.status(200).json_body(sandbox("k8s", "Pending"));
        })
        .await;
    pending.up_to_n_times_async(2).await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/k8s");
            then.status(200).json_body(sandbox("k8s", "Running"));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/bad");
            then.status(200).json_body(sandbox("bad", "Failed"));
        })
        .await;
    let c = client(&server);
    let info = c
        .wait_until_running("k8s", Duration::from_secs(5), Duration::from_millis(10))
        .await
        .unwrap();
    assert_eq!(info.status.state, SandboxState::Running);
    pending.assert_calls_async(2).await;
    let err = c
        .wait_until_running("bad", Duration::from_secs(5), Duration::from_millis(10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Wait);
    assert!(err.to_string().contains("Failed"), "{err}");
}

#[tokio::test]
async fn ids_that_would_name_another_resource_are_refused_before_sending() {
    let server = MockServer::start_async().await;
    let any = server
        .mock_async(|when, then| {
            when.any_request();
            then.status(204);
        })
        .await;
    let c = client(&server);
    for id in ["", ".", ".."] {
        let err = c.delete_sandbox(id).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{id:?}");
    }
    // Anything else is one encoded segment.
    c.delete_sandbox("a/../b").await.unwrap();
    any.assert_calls_async(1).await;
    assert_no_key(&format!("{c:?}"));
}

#[tokio::test]
async fn a_create_may_take_longer_than_one_buffered_request() {
    // A Kubernetes server answers the create only once the pod runs (up to 60 s by default),
    // and Docker pulls a missing image inside it: the client's timeout (1 s here) bounds the
    // other calls, not the create.
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(202)
                .delay(Duration::from_millis(1500))
                .json_body(sandbox(SB, "Running"));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(format!("/v1/sandboxes/{SB}"));
            then.status(200)
                .delay(Duration::from_millis(1500))
                .json_body(sandbox(SB, "Running"));
        })
        .await;
    let c = opensandbox_api::Client::builder()
        .domain(server.base_url())
        .api_key(KEY)
        .timeout(Duration::from_secs(1))
        .retry(opensandbox_api::RetryPolicy {
            max_retries: 0,
            ..common::fast_retry()
        })
        .build()
        .unwrap();
    let info = c
        .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
        .await
        .expect("the create's answer is waited for");
    assert_eq!(info.id, SB);
    let err = c.get_sandbox(SB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}
