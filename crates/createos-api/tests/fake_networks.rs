//! The private-network example against the fake control plane.

#![allow(dead_code)]

mod common;

use common::fake::{bounded, start};
#[path = "../examples/private_network.rs"]
mod private_network;

use createos_api::{CreateSandboxRequest, ErrorKind, NetworkCreateRequest, PaginationOptions};
use createos_fake::FakeOptions;
use futures::TryStreamExt as _;

#[tokio::test(flavor = "multi_thread")]
async fn attach_member_visible_detach_delete() {
    let (server, client) = start(FakeOptions::default()).await;
    let outcome = bounded(private_network::run(&client)).await.unwrap();
    assert_eq!(outcome.members.len(), 1, "{outcome:?}");
    let member = &outcome.members[0];
    assert_eq!(member.sandbox_id, outcome.sandbox_id);
    assert!(!member.ip_address.is_empty(), "{member:?}");
    assert!(!member.status.is_empty(), "{member:?}");
    assert_eq!(outcome.members_after_detach, 0);
    // Everything the example created is gone.
    let err = client
        .networks()
        .get(&outcome.network_id)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(server.stats().live, 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_member_counts_and_unknown_networks_are_not_found() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let sandbox = client
            .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb"))
            .await
            .unwrap();
        let networks = client.networks();
        let a = networks
            .create(&NetworkCreateRequest::new("mesh-a"))
            .await
            .unwrap();
        let b = networks
            .create(&NetworkCreateRequest::new("mesh-b"))
            .await
            .unwrap();
        sandbox.attach_network(&a.id).await.unwrap();
        let all: Vec<_> = networks
            .list(PaginationOptions::default())
            .try_collect()
            .await
            .unwrap();
        let count = |id: &str| all.iter().find(|n| n.id == id).map(|n| n.member_count);
        assert_eq!(count(&a.id), Some(1));
        assert_eq!(count(&b.id), Some(0));
        let err = sandbox
            .attach_network("net-does-not-exist")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        sandbox.detach_network(&a.id).await.unwrap();
        networks.delete(&a.id).await.unwrap();
        networks.delete(&b.id).await.unwrap();
        sandbox.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}
