//! Shared setup for the tests that run against the fake control plane.

use std::time::Duration;

use createos_api::{Client, RetryOptions};
use createos_fake::{FakeOptions, FakeServer};

/// Starts a fake on a free port and returns it with a client for it (30 s timeout, quick
/// retries).
pub async fn start(opts: FakeOptions) -> (FakeServer, Client) {
    let server = FakeServer::start(opts).await.expect("fake starts");
    let client = Client::builder()
        .api_key(server.api_key().to_owned())
        .base_url(server.url())
        .timeout(Duration::from_secs(30))
        .retry(RetryOptions {
            max_retries: 2,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(50),
        })
        .build()
        .expect("client builds");
    (server, client)
}

/// Runs a whole workflow with a 60 s bound, so a hung one fails instead of stalling CI.
pub async fn bounded<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("workflow timed out")
}
