//! Egress read-back: create a deny-all sandbox with an allowlist, then ask the egress sidecar
//! what it enforces and refuse anything but `dns+nft`, a `deny` default and exactly the rules
//! sent. A 502 or 404 from `networkpolicy` means no sidecar: refused too. The sandbox is
//! deleted either way.
//!
//! ```text
//! OPEN_SANDBOX_DOMAIN=127.0.0.1:8080 OPEN_SANDBOX_API_KEY=... \
//!   cargo run -p opensandbox-api --example egress_readback -- pypi.org files.pythonhosted.org
//! ```

use std::time::Duration;

use opensandbox_api::{
    Client, CreateSandbox, EnforcementMode, ErrorKind, NetworkPolicy, PolicyAction,
};

/// Why the read-back does not match what was asked, if it does not.
async fn check(
    client: &Client,
    id: &str,
    wanted: &NetworkPolicy,
) -> opensandbox_api::Result<Option<String>> {
    let status = match client.get_network_policy(id).await {
        Ok(status) => status,
        Err(e)
            if e.kind() == ErrorKind::NotFound || e.status().is_some_and(|s| s.as_u16() == 502) =>
        {
            return Ok(Some(format!("no egress sidecar answers ({e})")));
        }
        Err(e) => return Err(e),
    };
    if status.enforcement_mode != EnforcementMode::DnsNft {
        return Ok(Some(format!(
            "the sidecar enforces with {:?}, not dns+nft: set [egress] mode = \"dns+nft\" on the server",
            status.enforcement_mode.as_str()
        )));
    }
    match status.policy {
        Some(p) if p.default_action == PolicyAction::Deny && p.egress == wanted.egress => Ok(None),
        other => Ok(Some(format!("the enforced policy differs: {other:?}"))),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    let policy = std::env::args()
        .skip(1)
        .fold(NetworkPolicy::deny_all(), NetworkPolicy::allow);
    let image = std::env::var("OPEN_SANDBOX_IMAGE").unwrap_or_else(|_| "python:3.11".into());
    let sandbox = client
        .create_sandbox(
            &CreateSandbox::from_image(image, ["tail", "-f", "/dev/null"])
                .resource("cpu", "500m")
                .resource("memory", "512Mi")
                .metadata("created-by", "opensandbox-api-example")
                .network_policy(policy.clone()),
        )
        .await?;
    let verdict = async {
        client
            .wait_until_running(
                &sandbox.id,
                Duration::from_secs(120),
                Duration::from_millis(500),
            )
            .await?;
        check(&client, &sandbox.id, &policy).await
    }
    .await;
    client.delete_sandbox(&sandbox.id).await?;
    match verdict? {
        None => println!(
            "egress enforced as asked (dns+nft, deny by default, {} rules)",
            policy.egress.len()
        ),
        Some(why) => return Err(format!("refused: {why}").into()),
    }
    Ok(())
}
