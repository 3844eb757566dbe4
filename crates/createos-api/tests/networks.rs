//! Networks: account CRUD and sandbox attach/detach.

mod common;

use common::{KEY, bounded, client, ok};
use createos_api::{ErrorKind, NetworkCreateRequest, PaginationOptions};
use futures::TryStreamExt as _;
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn create_get_list_and_delete() {
    let server = MockServer::start_async().await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/networks")
                .header("x-api-key", KEY)
                .json_body(json!({"name": "agent-mesh"}));
            then.status(200).json_body(ok(json!({
                "id": "net_1", "name": "agent-mesh", "created_at": "2026-11-29T10:00:00Z",
                "member_count": 0
            })));
        })
        .await;
    let get = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/networks/net_1");
            then.status(200).json_body(ok(json!({
                "id": "net_1", "name": "agent-mesh", "member_count": 1,
                "members": [{"sandbox_id": "sb-1", "status": "connected", "ip": "10.9.0.2", "name": "demo"}]
            })));
        })
        .await;
    let list = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/networks")
                .query_param("limit", "100")
                .query_param("offset", "0");
            then.status(200).json_body(ok(json!([
                {"id": "net_1", "name": "agent-mesh", "member_count": 1}
            ])));
        })
        .await;
    let delete = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/networks/net_1");
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let networks = client(&server).networks();
    let created = networks
        .create(&NetworkCreateRequest::new("agent-mesh"))
        .await
        .unwrap();
    assert_eq!(created.id, "net_1");
    let detail = networks.get("net_1").await.unwrap();
    assert_eq!(detail.members.len(), 1);
    assert_eq!(detail.members[0].sandbox_id, "sb-1");
    assert_eq!(detail.members[0].ip_address, "10.9.0.2");
    assert_eq!(detail.members[0].status, "connected");
    let all: Vec<_> = bounded(
        networks
            .list(PaginationOptions::default())
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].member_count, 1);
    networks.delete("net_1").await.unwrap();
    for m in [&create, &get, &list, &delete] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn attach_and_detach_use_the_sandbox_paths() {
    let server = MockServer::start_async().await;
    let attach = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sb-1/networks")
                .header("x-api-key", KEY)
                .json_body(json!({"id": "net 1"}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let detach = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path("/v1/sandboxes/sb-1/networks/net%201");
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    sb.attach_network("net 1").await.unwrap();
    sb.detach_network("net 1").await.unwrap();
    attach.assert_async().await;
    detach.assert_async().await;
}

#[tokio::test]
async fn errors_are_typed() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-1/networks");
            then.status(409)
                .json_body(json!({"status": "fail", "data": {"id": "already attached"}}));
        })
        .await;
    let err = client(&server)
        .sandbox_handle("sb-1")
        .attach_network("net_1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(err.as_api().unwrap().message, "id: already attached");
}
