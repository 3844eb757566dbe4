//! Disks: account CRUD with secret credentials, sandbox mounts and the attach id check.

mod common;

use common::{KEY, bounded, client, ok};
use createos_api::{
    AttachDiskOptions, DetachDiskOptions, DiskConfig, DiskCreateRequest, DiskCredentials, DiskKind,
    ErrorKind, MountStatus, PaginationOptions,
};
use futures::TryStreamExt as _;
use httpmock::prelude::*;
use serde_json::json;

fn disk_json() -> serde_json::Value {
    json!({
        "id": "disk_01", "name": "datasets", "kind": "s3",
        "config": {"bucket": "bkt", "endpoint": "https://s3.example.test", "region": "eu-west-1"},
        "created_at": "2026-11-29T10:00:00Z"
    })
}

#[tokio::test]
async fn create_sends_credentials_and_the_request_is_redacted_in_debug() {
    let server = MockServer::start_async().await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/disks")
                .header("x-api-key", KEY)
                .json_body(json!({
                    "name": "datasets", "kind": "s3",
                    "config": {"bucket": "bkt", "endpoint": "https://s3.example.test", "region": "eu-west-1"},
                    "credentials": {"access_key": "AKIAEXAMPLE", "secret_key": "wJalrXUtnFEMI"}
                }));
            then.status(200).json_body(ok(disk_json()));
        })
        .await;
    let request = DiskCreateRequest::s3(
        "datasets",
        DiskConfig::new("bkt", "https://s3.example.test").region("eu-west-1"),
        DiskCredentials::new("AKIAEXAMPLE", "wJalrXUtnFEMI"),
    );
    let shown = format!("{request:?}");
    assert!(
        !shown.contains("AKIAEXAMPLE") && !shown.contains("wJalr"),
        "{shown}"
    );
    let disk = client(&server).disks().create(&request).await.unwrap();
    create.assert_async().await;
    assert_eq!(disk.kind, DiskKind::S3);
    assert_eq!(disk.config.region, "eu-west-1");
    assert!(!disk.config.use_path_style);
}

#[tokio::test]
async fn get_delete_rotate_and_list() {
    let server = MockServer::start_async().await;
    let get = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/disks/datasets");
            then.status(200).json_body(ok(disk_json()));
        })
        .await;
    let delete = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/disks/disk_01");
            then.status(200).json_body(ok(json!({"deleted": true})));
        })
        .await;
    let delete_gone = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/disks/already-gone");
            then.status(200).json_body(ok(json!({"deleted": false})));
        })
        .await;
    let rotate = server
        .mock_async(|when, then| {
            when.method(PATCH).path("/v1/disks/disk_01").json_body(
                json!({"credentials": {"access_key": "NEWKEY", "secret_key": "NEWSECRET"}}),
            );
            then.status(200).json_body(ok(disk_json()));
        })
        .await;
    let list = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/disks");
            then.status(200).json_body(ok(
                json!({"disks": [disk_json(), {"id": "disk_02", "kind": "gcs"}]}),
            ));
        })
        .await;
    let disks = client(&server).disks();
    assert_eq!(disks.get("datasets").await.unwrap().id, "disk_01");
    assert!(disks.delete("disk_01").await.unwrap());
    assert!(!disks.delete("already-gone").await.unwrap());
    disks
        .rotate_credentials("disk_01", &DiskCredentials::new("NEWKEY", "NEWSECRET"))
        .await
        .unwrap();
    let all: Vec<_> = bounded(
        disks
            .list(PaginationOptions::default())
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].kind, DiskKind::Unknown("gcs".into()));
    for m in [&get, &delete, &delete_gone, &rotate, &list] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn sandbox_mounts_list_attach_and_detach() {
    let server = MockServer::start_async().await;
    let list = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1/disks");
            then.status(200).json_body(ok(json!({"disks": [{
                "disk_id": "disk_01", "name": "datasets", "kind": "s3",
                "config": {"bucket": "bkt", "endpoint": "e"}, "mount_path": "/mnt/data",
                "sub_path": "", "mount_status": "mounted", "mount_error": null
            }]})));
        })
        .await;
    let attach = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sb-1/disks")
                .json_body(
                    json!({"disk_id": "disk_01", "mount_path": "/mnt/data", "sub_path": "team/a"}),
                );
            then.status(200)
                .json_body(ok(json!({"id": "sb-1", "ok": true})));
        })
        .await;
    let detach = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path("/v1/sandboxes/sb-1/disks/disk_01")
                .query_param("mount_path", "/mnt/data");
            then.status(200).json_body(ok(json!({"detached": true})));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    let mounts: Vec<_> = bounded(
        sb.list_disks(PaginationOptions::default())
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(mounts[0].mount_status, MountStatus::Mounted);
    assert_eq!(mounts[0].mount_path, "/mnt/data");
    let mut opts = AttachDiskOptions::new("disk_01", "/mnt/data");
    opts.sub_path = "team/a".into();
    sb.attach_disk(&opts).await.unwrap();
    assert!(
        sb.detach_disk(&DetachDiskOptions::new("disk_01", "/mnt/data"))
            .await
            .unwrap()
    );
    for m in [&list, &attach, &detach] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn attach_checks_the_answered_sandbox_id() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-1/disks");
            then.status(200)
                .json_body(ok(json!({"id": "sb-OTHER", "ok": true})));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-2/disks");
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/sb-3/disks");
            then.status(409)
                .json_body(json!({"status": "fail", "data": "sandbox is not running"}));
        })
        .await;
    let c = client(&server);
    let opts = AttachDiskOptions::new("disk_01", "/mnt/data");
    let err = c
        .sandbox_handle("sb-1")
        .attach_disk(&opts)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    let err = c
        .sandbox_handle("sb-2")
        .attach_disk(&opts)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    let err = c
        .sandbox_handle("sb-3")
        .attach_disk(&opts)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
}
