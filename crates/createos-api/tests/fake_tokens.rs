//! Access-token delegation against the fake control plane.

mod common;

use common::fake::{bounded, start};

use createos_api::{
    Client, CreateSandboxRequest, ErrorKind, ExecOptions, PaginationOptions, RunCommandRequest,
};
use createos_fake::FakeOptions;
use futures::TryStreamExt as _;
use secrecy::ExposeSecret as _;

async fn echo(sandbox: &createos_api::Sandbox, text: &str) -> createos_api::Result<String> {
    Ok(sandbox
        .run_command(
            RunCommandRequest::new("echo").arg(text),
            ExecOptions::default(),
        )
        .await?
        .result
        .stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn delegate_rotate_and_disable() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let owner = client
            .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb"))
            .await
            .unwrap();
        let other = client
            .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb"))
            .await
            .unwrap();

        let created = owner.create_access_token().await.unwrap();
        assert!(created.token.expose_secret().starts_with("skp_sb_"));
        assert!(created.enabled);
        let err = owner.create_access_token().await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Conflict,
            "a second enabled token: {err}"
        );

        // The worker operates its own sandbox with the token.
        let worker = owner.with_access_token(created.token.clone()).unwrap();
        assert_eq!(echo(&worker, "hello").await.unwrap(), "hello\n");
        assert!(worker.processes().list().await.unwrap().is_empty());
        worker.refresh().await.unwrap();

        // ... but cannot manage tokens, reach another sandbox, or list account resources.
        let err = worker.get_access_token().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        let stranger = other.with_access_token(created.token.clone()).unwrap();
        let err = echo(&stranger, "nope").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        let as_account = Client::builder()
            .api_key(created.token.clone())
            .base_url(server.url())
            .build()
            .unwrap();
        let err = as_account
            .networks()
            .list(PaginationOptions::default())
            .try_next()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        assert!(!format!("{err} {err:?}").contains(created.token.expose_secret()));

        // The owner sees only a hint.
        let meta = owner.get_access_token().await.unwrap();
        assert!(meta.enabled);
        let hint = meta.token_hint.unwrap_or_default();
        assert_ne!(hint, created.token.expose_secret());

        // Rotation: the old token stops working, the new one works.
        let rotated = owner.rotate_access_token().await.unwrap();
        assert_ne!(rotated.token.expose_secret(), created.token.expose_secret());
        assert!(rotated.rotated_at.is_some());
        let err = echo(&worker, "old").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        let worker = owner.with_access_token(rotated.token.clone()).unwrap();
        assert_eq!(echo(&worker, "new").await.unwrap(), "new\n");

        // Disabling is idempotent and revokes the token.
        assert!(!owner.disable_access_token().await.unwrap().enabled);
        assert!(!owner.disable_access_token().await.unwrap().enabled);
        let err = echo(&worker, "revoked").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        let err = owner.rotate_access_token().await.unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::NotFound | ErrorKind::Conflict),
            "rotating a disabled token: {err}"
        );

        owner.destroy().await.unwrap();
        other.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}
