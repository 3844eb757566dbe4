//! Hosts: the paged admin listing.

mod common;

use common::{KEY, bounded, client, ok};
use createos_api::{HostStatus, PaginationOptions};
use futures::TryStreamExt as _;
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn list_hosts_walks_pages_and_decodes_leniently() {
    let server = MockServer::start_async().await;
    let first = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/hosts")
                .header("x-api-key", KEY)
                .query_param("limit", "2")
                .query_param("offset", "0");
            then.status(200).json_body(ok(json!({
                "data": [
                    {"id": "h1", "status": "active", "free_mib": 4096, "vm_count": 3, "rootfses": ["devbox:1"]},
                    {"id": "h2", "status": "draining", "free_mib": 0, "vm_count": 9, "rootfses": null}
                ],
                "pagination": {"total": 3, "offset": 0, "count": 2}
            })));
        })
        .await;
    let second = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/hosts")
                .query_param("limit", "2")
                .query_param("offset", "2");
            then.status(200).json_body(ok(json!({
                "data": [{"id": "h3", "status": "cordoned"}],
                "pagination": {"total": 3, "offset": 2, "count": 1}
            })));
        })
        .await;
    let hosts: Vec<_> = bounded(
        client(&server)
            .list_hosts(PaginationOptions {
                limit: Some(2),
                offset: None,
            })
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(hosts.len(), 3);
    assert_eq!(hosts[0].status, HostStatus::Active);
    assert_eq!(hosts[0].rootfses, ["devbox:1"]);
    assert_eq!(hosts[1].status, HostStatus::Draining);
    assert!(hosts[1].rootfses.is_empty());
    assert_eq!(hosts[2].status, HostStatus::Unknown("cordoned".into()));
    first.assert_async().await;
    second.assert_async().await;
}

#[tokio::test]
async fn a_forbidden_listing_is_an_auth_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/hosts");
            then.status(403)
                .json_body(json!({"status": "error", "message": "admin only", "code": 3}));
        })
        .await;
    let mut hosts = client(&server).list_hosts(PaginationOptions::default());
    let err = bounded(hosts.try_next()).await.unwrap_err();
    assert_eq!(err.kind(), createos_api::ErrorKind::Auth);
    assert_eq!(err.as_api().unwrap().code, 3);
}
