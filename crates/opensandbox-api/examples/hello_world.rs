//! Hello world: create a sandbox (with a nonce, so a lost answer cannot leak it), wait for
//! execd, run a command and stream its output, upload a file, download it back, delete.
//!
//! ```text
//! OPEN_SANDBOX_DOMAIN=127.0.0.1:8080 OPEN_SANDBOX_API_KEY=... \
//!   cargo run -p opensandbox-api --example hello_world
//! ```
//!
//! `OPEN_SANDBOX_IMAGE` picks the image (default `python:3.11`; it must have `bash`).

use std::time::Duration;

use futures::StreamExt;
use opensandbox_api::{
    Client, CreateSandbox, Deletion, DownloadOptions, ExecEvent, Lifetime, RunCommand, SandboxInfo,
    StreamOptions, UploadFile,
};

/// Creates a sandbox tagged with a fresh nonce. When the create fails in a way that may have
/// reached the server, whatever carries the nonce is deleted before the error is returned.
pub async fn create(
    client: &Client,
    request: CreateSandbox,
) -> opensandbox_api::Result<SandboxInfo> {
    let nonce = format!("{:016x}", rand::random::<u64>());
    let request = request.metadata("example-nonce", nonce.as_str());
    match client.create_sandbox(&request).await {
        Ok(info) => Ok(info),
        Err(e) if e.is_retryable() => {
            for orphan in client.find_by_metadata("example-nonce", &nonce).await? {
                client.delete_sandbox(&orphan.id).await?;
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// What the example does inside the sandbox; returns what it printed.
pub async fn work(client: &Client, id: &str) -> opensandbox_api::Result<String> {
    // Kubernetes answers a create with Pending; Docker with Running. Either way execd may
    // still be starting.
    client
        .wait_until_running(id, Duration::from_secs(120), Duration::from_millis(500))
        .await?;
    let execd = client.execd(id);
    execd
        .wait_until_ready(Duration::from_secs(60), Duration::from_millis(250))
        .await?;

    let mut printed = String::new();
    let command = RunCommand::shell(
        r#"for i in 1 2 3; do echo "hello $i from $(uname -m)"; sleep 0.2; done"#,
    )
    .timeout(Duration::from_secs(30));
    let mut events = execd.run(&command, StreamOptions::default()).await?;
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Stdout { text, .. } => {
                println!("stdout: {text}");
                printed.push_str(&text);
            }
            ExecEvent::Stderr { text, .. } => eprintln!("stderr: {text}"),
            _ => {}
        }
    }
    println!("exit: {:?}", events.exit_status());

    execd
        .upload(&[UploadFile::new("/tmp/hello/greeting.txt", "hello from Rust").mode(0o644)])
        .await?;
    let back = execd
        .download("/tmp/hello/greeting.txt", DownloadOptions::capped(1 << 20))
        .await?
        .bytes()
        .await?;
    println!("downloaded: {}", String::from_utf8_lossy(&back));
    Ok(printed)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    let image = std::env::var("OPEN_SANDBOX_IMAGE").unwrap_or_else(|_| "python:3.11".into());
    let request = CreateSandbox::from_image(image, ["tail", "-f", "/dev/null"])
        .lifetime(Lifetime::After(Duration::from_secs(600)))
        .resource("cpu", "500m")
        .resource("memory", "512Mi")
        .metadata("created-by", "opensandbox-api-example");
    let sandbox = create(&client, request).await?;
    println!("created {} ({})", sandbox.id, sandbox.status.state);
    // Always delete, whatever the work did.
    let outcome = work(&client, &sandbox.id).await;
    match client.delete_sandbox(&sandbox.id).await? {
        Deletion::Deleted => println!("deleted {}", sandbox.id),
        Deletion::AlreadyGone => println!("{} was already gone", sandbox.id),
    }
    outcome?;
    Ok(())
}
