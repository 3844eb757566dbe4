//! Command streaming: print a long-running command's output as it arrives.

use std::io::Write;
use std::time::Duration;

use createos_api::{
    Client, CreateSandboxRequest, ExecEvent, ExecOptions, RequestOptions, RunCommandRequest,
};
use futures::StreamExt;

/// Everything the stream delivered.
#[derive(Debug, Default)]
pub struct Transcript {
    /// Concatenated stdout chunks.
    pub stdout: String,
    /// Concatenated stderr chunks.
    pub stderr: String,
    /// The exit code, if the stream reported one.
    pub exit_code: Option<i64>,
}

/// Stream five numbered lines from a fresh sandbox, echoing them to `out` as they arrive.
pub async fn run(
    client: &Client,
    out: &mut (dyn Write + Send),
) -> createos_api::Result<Transcript> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape).rootfs("devbox:1"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let result = stream(&sandbox, out).await;
    sandbox.destroy().await?;
    result
}

async fn stream(
    sandbox: &createos_api::Sandbox,
    out: &mut (dyn Write + Send),
) -> createos_api::Result<Transcript> {
    let req = RunCommandRequest::new("sh").args([
        "-c",
        r#"for n in 1 2 3 4 5; do echo "step $n"; sleep 0.2; done; echo done >&2"#,
    ]);
    let mut events = sandbox.stream_command(req, ExecOptions::default()).await?;
    let mut t = Transcript::default();
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Stdout { data } => {
                let _ = write!(out, "{data}");
                t.stdout.push_str(&data);
            }
            ExecEvent::Stderr { data } => t.stderr.push_str(&data),
            ExecEvent::Exit { exit_code } => {
                let _ = writeln!(out, "exit code: {exit_code}");
                t.exit_code = Some(exit_code);
            }
            ExecEvent::Error { message } => {
                return Err(createos_api::Error::InvalidArgument(message));
            }
            _ => {} // heartbeats, and events added by later versions
        }
    }
    Ok(t)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    run(&client, &mut std::io::stdout()).await?;
    Ok(())
}
