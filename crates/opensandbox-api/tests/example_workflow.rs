//! The `hello_world` example's workflow, run against a mock of every call it makes.

mod common;

#[allow(dead_code)]
#[path = "../examples/hello_world.rs"]
mod hello_world;

use common::{KEY, SB, client, proxied};
use httpmock::prelude::*;
use opensandbox_api::CreateSandbox;
use serde_json::json;

#[tokio::test]
async fn hello_world_runs_end_to_end_and_cleans_up_after_a_lost_create() {
    let server = MockServer::start_async().await;
    let sandbox =
        json!({"id": SB, "status": {"state": "Running"}, "createdAt": "2026-12-04T10:00:00Z"});
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes")
                .header("open-sandbox-api-key", KEY)
                .json_body_includes(r#"{"metadata": {"created-by": "test"}}"#);
            then.status(202).json_body(sandbox.clone());
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(200).json_body(sandbox.clone());
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/ping"));
            then.status(200);
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/command"));
            then.status(200).body(
                "{\"type\":\"init\",\"text\":\"c1\"}\n\n{\"type\":\"stdout\",\"text\":\"hello 1 from x86_64\"}\n\n\
{\"type\":\"ping\"}\n\n{\"type\":\"execution_complete\",\"execution_time\":600}\n\n",
            );
        })
        .await;
    let upload = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(proxied("/files/upload"))
                .body_includes("\"path\":\"/tmp/hello/greeting.txt\"")
                .body_includes("hello from Rust");
            then.status(200);
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/files/download"))
                .query_param("path", "/tmp/hello/greeting.txt");
            then.status(200).body("hello from Rust");
        })
        .await;
    let delete = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/sb-1");
            then.status(204);
        })
        .await;
    let c = client(&server);
    let request = CreateSandbox::from_image("img", ["tail", "-f", "/dev/null"])
        .metadata("created-by", "test");
    let info = hello_world::create(&c, request).await.unwrap();
    let printed = hello_world::work(&c, &info.id).await.unwrap();
    assert_eq!(printed, "hello 1 from x86_64");
    c.delete_sandbox(&info.id).await.unwrap();
    create.assert_calls_async(1).await;
    upload.assert_calls_async(1).await;
    delete.assert_calls_async(1).await;

    // A create whose answer is lost (here a 503 after the fact): the nonce finds the sandbox
    // it made, which is deleted before the error is returned.
    let lost = MockServer::start_async().await;
    lost.mock_async(|when, then| {
        when.method(POST).path("/v1/sandboxes");
        then.status(503)
            .json_body(json!({"code": "X", "message": "lost"}));
    })
    .await;
    let lookup = lost
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param_exists("metadata");
            then.status(200).json_body(json!({
                "items": [{"id": "orphan", "status": {"state": "Pending"}}],
                "pagination": {"hasNextPage": false}
            }));
        })
        .await;
    let cleanup = lost
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/sandboxes/orphan");
            then.status(204);
        })
        .await;
    let err = hello_world::create(&client(&lost), CreateSandbox::from_image("img", ["sh"]))
        .await
        .unwrap_err();
    assert!(err.is_retryable());
    lookup.assert_calls_async(1).await;
    cleanup.assert_calls_async(1).await;
}
