//! Hello world: create a sandbox, run one command, destroy it.
//!
//! ```text
//! CREATEOS_API_KEY=... cargo run -p createos-api --example hello_world
//! # against a local fake:
//! CREATEOS_SANDBOX_BASE_URL=http://127.0.0.1:8080 CREATEOS_API_KEY=test-key cargo run -p createos-api --example hello_world
//! ```

use std::time::Duration;

use createos_api::{Client, CreateSandboxRequest, ExecOptions, RequestOptions, RunCommandRequest};

/// The shape to use (`CREATEOS_SHAPE`, default `s-2vcpu-4gb`).
pub fn shape() -> String {
    std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned())
}

/// Create, greet, destroy; returns what the guest printed.
pub async fn run(client: &Client) -> createos_api::Result<String> {
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape()).rootfs("devbox:1"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    // Always destroy, whatever the command did.
    let greeting = sandbox
        .run_command(
            RunCommandRequest::new("sh")
                .args(["-c", r#"printf "Rust says hello from $(uname -m)\n""#]),
            ExecOptions::default(),
        )
        .await;
    sandbox.destroy().await?;
    Ok(greeting?.result.stdout)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    print!("{}", run(&client).await?);
    Ok(())
}
