//! Private overlay network: create a network, attach a running sandbox, inspect the membership,
//! then clean up in reverse order (detach before deleting the network).
//!
//! ```text
//! CREATEOS_API_KEY=... cargo run -p createos-api --example private_network
//! # against a local fake:
//! CREATEOS_SANDBOX_BASE_URL=http://127.0.0.1:8080 CREATEOS_API_KEY=test-key cargo run -p createos-api --example private_network
//! ```

use std::time::Duration;

use createos_api::{
    Client, CreateSandboxRequest, NetworkCreateRequest, NetworkMember, RequestOptions, Sandbox,
};

/// What the workflow observed.
#[derive(Debug)]
pub struct Outcome {
    /// The sandbox that joined the network.
    pub sandbox_id: String,
    /// The network's id.
    pub network_id: String,
    /// Members while the sandbox was attached.
    pub members: Vec<NetworkMember>,
    /// Number of members after the detach.
    pub members_after_detach: usize,
}

/// A network name that is unique enough for a demo account.
fn network_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("agent-mesh-{nanos:08x}")
}

/// Create sandbox and network, attach, inspect, detach, delete; always cleans up.
pub async fn run(client: &Client) -> createos_api::Result<Outcome> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape).rootfs("devbox:1"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let result = with_network(client, &sandbox).await;
    sandbox.destroy().await?;
    result
}

async fn with_network(client: &Client, sandbox: &Sandbox) -> createos_api::Result<Outcome> {
    let networks = client.networks();
    let network = networks
        .create(&NetworkCreateRequest::new(network_name()))
        .await?;
    let result = attached(client, sandbox, &network.id).await;
    // The sandbox has been detached by now (or never joined); the network can go.
    networks.delete(&network.id).await?;
    result
}

async fn attached(
    client: &Client,
    sandbox: &Sandbox,
    network_id: &str,
) -> createos_api::Result<Outcome> {
    sandbox.attach_network(network_id).await?;
    let connected = client.networks().get(network_id).await;
    let detached = sandbox.detach_network(network_id).await;
    let connected = connected?;
    detached?;
    for member in &connected.members {
        println!(
            "sandbox={} private-ip={} status={}",
            member.sandbox_id, member.ip_address, member.status
        );
    }
    let after = client.networks().get(network_id).await?;
    Ok(Outcome {
        sandbox_id: sandbox.id().to_owned(),
        network_id: network_id.to_owned(),
        members: connected.members,
        members_after_detach: after.members.len(),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    let outcome = run(&client).await?;
    println!(
        "network {} had {} member(s); {} after detach",
        outcome.network_id,
        outcome.members.len(),
        outcome.members_after_detach
    );
    Ok(())
}
