//! Files and snapshots: upload and download, then pause, fork, resume and show that the
//! two sandboxes' filesystems diverge.

use std::time::Duration;

use createos_api::{
    Client, CreateSandboxRequest, DownloadOptions, ExecOptions, ForkSandboxRequest, RequestOptions,
    Sandbox, WaitOptions,
};

/// What the workflow observed.
#[derive(Debug)]
pub struct Outcome {
    /// The config file as downloaded right after upload.
    pub downloaded: Vec<u8>,
    /// `/workspace/state.txt` in the source after both sides wrote to it.
    pub source_state: String,
    /// `/workspace/state.txt` in the fork after both sides wrote to it.
    pub fork_state: String,
    /// The fork's `forked_from`.
    pub forked_from: Option<String>,
}

/// Upload, download, pause, fork, resume, diverge; destroys both sandboxes.
pub async fn run(client: &Client) -> createos_api::Result<Outcome> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let source = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape).rootfs("devbox:1"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let mut fork = None;
    let result = workflow(&source, &mut fork).await;
    if let Some(f) = fork {
        f.destroy().await?;
    }
    source.destroy().await?;
    result
}

async fn read(sandbox: &Sandbox, path: &str) -> createos_api::Result<String> {
    let bytes = sandbox
        .files()
        .download(path, DownloadOptions::max_bytes(1 << 20))
        .await?
        .bytes()
        .await?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

async fn workflow(
    source: &Sandbox,
    fork_slot: &mut Option<Sandbox>,
) -> createos_api::Result<Outcome> {
    let files = source.files();
    files
        .upload("/workspace/config.json", r#"{"mode":"production"}"#)
        .await?;
    let downloaded = files
        .download("/workspace/config.json", DownloadOptions::default())
        .await?
        .bytes()
        .await?
        .to_vec();
    println!("downloaded {} bytes", downloaded.len());
    source
        .shell(
            "echo before-snapshot > /workspace/state.txt",
            ExecOptions::default(),
        )
        .await?;

    source.pause().await?;
    source.wait_until_paused(WaitOptions::default()).await?;
    let fork = source.fork(ForkSandboxRequest::start_paused(true)).await?;
    *fork_slot = Some(fork.clone());
    println!("forked {} from {}", fork.id(), source.id());

    source.resume().await?;
    source.wait_until_running(WaitOptions::default()).await?;
    fork.resume().await?;
    fork.wait_until_running(WaitOptions::default()).await?;

    source
        .shell(
            "echo source-after >> /workspace/state.txt",
            ExecOptions::default(),
        )
        .await?;
    fork.shell(
        "echo fork-after >> /workspace/state.txt",
        ExecOptions::default(),
    )
    .await?;
    let source_state = read(source, "/workspace/state.txt").await?;
    let fork_state = read(&fork, "/workspace/state.txt").await?;
    println!("source: {source_state:?}\nfork:   {fork_state:?}");
    Ok(Outcome {
        downloaded,
        source_state,
        fork_state,
        forked_from: fork.info().forked_from,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    run(&client).await?;
    Ok(())
}
