//! Access tokens: owner-key management calls, delegated handles, and secret hygiene.

mod common;

use common::{KEY, client, ok, sandbox_json};
use createos_api::{Error, ErrorKind, ExecOptions, RunCommandRequest, SecretString};
use httpmock::prelude::*;
use secrecy::ExposeSecret as _;
use serde_json::json;

const TOKEN_PATH: &str = "/v1/sandboxes/sb-1/access-token";
const FIRST: &str = "skp_sb_first";
const SECOND: &str = "skp_sb_second";

#[tokio::test]
async fn lifecycle_sends_the_owner_key_for_management_and_the_token_for_work() {
    let server = MockServer::start_async().await;
    let get_sandbox = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/sb-1")
                .header("x-api-key", KEY);
            then.status(200)
                .json_body(ok(sandbox_json("sb-1", "running")));
        })
        .await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST).path(TOKEN_PATH).header("x-api-key", KEY);
            then.status(200).json_body(ok(json!({
                "token": FIRST, "enabled": true, "created_at": "2026-11-29T10:00:00Z"
            })));
        })
        .await;
    let exec_as_worker = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sb-1/exec")
                .header("x-api-key", FIRST)
                .json_body(json!({"cmd": "echo", "args": ["hello"]}));
            then.status(200).json_body(ok(json!({
                "result": {"stdout": "hello\n", "stderr": "", "exit_code": 0}, "exec_ms": 3
            })));
        })
        .await;
    let processes_as_worker = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/sb-1/processes")
                .header("x-api-key", FIRST);
            then.status(200).json_body(ok(json!({"processes": []})));
        })
        .await;
    let metadata = server
        .mock_async(|when, then| {
            when.method(GET).path(TOKEN_PATH).header("x-api-key", KEY);
            then.status(200).json_body(ok(json!({
                "enabled": true, "token_hint": "skp_sb...irst", "created_at": "2026-11-29T10:00:00Z"
            })));
        })
        .await;
    let rotate = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{TOKEN_PATH}/rotate"))
                .header("x-api-key", KEY);
            then.status(200).json_body(ok(json!({
                "token": SECOND, "enabled": true, "created_at": "2026-11-29T10:00:00Z",
                "rotated_at": "2026-11-29T10:05:00Z"
            })));
        })
        .await;
    let disable = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(TOKEN_PATH)
                .header("x-api-key", KEY);
            then.status(200).json_body(ok(json!({"enabled": false})));
        })
        .await;

    let owner = client(&server).get_sandbox("sb-1").await.unwrap();
    let created = owner.create_access_token().await.unwrap();
    assert!(created.enabled);
    assert_eq!(created.token.expose_secret(), FIRST);

    let worker = owner.with_access_token(created.token.clone()).unwrap();
    assert_eq!(worker.id(), "sb-1");
    let out = worker
        .run_command(
            RunCommandRequest::new("echo").arg("hello"),
            ExecOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.result.stdout, "hello\n");
    assert!(worker.processes().list().await.unwrap().is_empty());

    let meta = owner.get_access_token().await.unwrap();
    assert_eq!(meta.token_hint.as_deref(), Some("skp_sb...irst"));
    let replacement = owner.rotate_access_token().await.unwrap();
    assert_eq!(replacement.token.expose_secret(), SECOND);
    assert_eq!(
        replacement.rotated_at.as_deref(),
        Some("2026-11-29T10:05:00Z")
    );
    let disabled = owner.disable_access_token().await.unwrap();
    assert!(!disabled.enabled);

    for m in [
        &get_sandbox,
        &create,
        &exec_as_worker,
        &processes_as_worker,
        &metadata,
        &rotate,
        &disable,
    ] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn the_plaintext_token_never_appears_in_debug_output() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(TOKEN_PATH);
            then.status(200).json_body(ok(json!({
                "token": "skp_sb_topsecretvalue", "enabled": true, "created_at": "t"
            })));
        })
        .await;
    let owner = client(&server).sandbox_handle("sb-1");
    let created = owner.create_access_token().await.unwrap();
    let worker = owner.with_access_token(created.token.clone()).unwrap();
    for shown in [
        format!("{created:?}"),
        format!("{created:#?}"),
        format!("{worker:?}"),
        format!("{:?}", worker.processes()),
        format!("{:?}", worker.computer()),
    ] {
        assert!(!shown.contains("topsecretvalue"), "{shown}");
    }
}

#[tokio::test]
async fn a_token_echoed_by_the_server_is_redacted_from_errors() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1/processes");
            then.status(403).json_body(json!({
                "status": "fail", "data": "token skp_sb_leakyvalue is not valid for this sandbox"
            }));
        })
        .await;
    let worker = client(&server)
        .sandbox_handle("sb-1")
        .with_access_token("skp_sb_leakyvalue")
        .unwrap();
    let err = worker.processes().list().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth);
    let shown = format!("{err} {err:?} {}", err.as_api().unwrap().body_text());
    assert!(!shown.contains("leakyvalue"), "{shown}");
}

#[tokio::test]
async fn blank_or_malformed_tokens_are_refused_before_any_request() {
    let server = MockServer::start_async().await;
    let any = server
        .mock_async(|when, then| {
            when.any_request();
            then.status(200).json_body(ok(json!({})));
        })
        .await;
    let owner = client(&server).sandbox_handle("sb-1");
    for bad in [
        "",
        "   ",
        "\t\n",
        "skp_sb_",
        "sk_live_123",
        "skp_sb_has space",
    ] {
        let err = owner
            .with_access_token(SecretString::from(bad.to_owned()))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err:?}");
    }
    // Surrounding whitespace is trimmed, like the owner key.
    let worker = owner.with_access_token("  skp_sb_padded \n").unwrap();
    assert_eq!(worker.id(), "sb-1");
    any.assert_calls_async(0).await;
}

#[tokio::test]
async fn second_create_conflicts_and_rotate_without_a_token_is_not_found() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(TOKEN_PATH);
            then.status(409).json_body(json!({
                "status": "fail", "data": "sandbox access token already exists"
            }));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(format!("{TOKEN_PATH}/rotate"));
            then.status(404).json_body(json!({
                "status": "fail", "data": "sandbox access token not found"
            }));
        })
        .await;
    let owner = client(&server).sandbox_handle("sb-1");
    let err = owner.create_access_token().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    let err = owner.rotate_access_token().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(
        err.to_string().contains("sandbox access token not found"),
        "{err}"
    );
}

#[tokio::test]
async fn create_without_the_plaintext_is_a_protocol_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(TOKEN_PATH);
            then.status(200)
                .json_body(ok(json!({"enabled": true, "created_at": "t"})));
        })
        .await;
    let err = client(&server)
        .sandbox_handle("sb-1")
        .create_access_token()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
}
