//! Managed processes: a pipe process with a per-process env override, stdin echo, replay of
//! retained output from `last_seq - 1`, a PTY that gets resized, and termination of a whole
//! process tree with a grace period.
//!
//! ```text
//! CREATEOS_API_KEY=... cargo run -p createos-api --example managed_process
//! # against a local fake:
//! CREATEOS_SANDBOX_BASE_URL=http://127.0.0.1:8080 CREATEOS_API_KEY=test-key cargo run -p createos-api --example managed_process
//! ```

use std::time::Duration;

use createos_api::{
    Client, CreateSandboxRequest, ManagedProcess, ManagedProcessCreateRequest,
    ManagedProcessDeleteOptions, ManagedProcessWaitOptions, ManagedProcessWaitScope, ProcessEvent,
    Processes, PtySize, RequestOptions, Sandbox,
};
use futures::StreamExt as _;

/// The env key declared at sandbox creation and overridden per process.
pub const OVERRIDE_KEY: &str = "PROCESS_DEMO_OVERRIDE";

/// Output collected from a process's connect stream.
#[derive(Debug, Default)]
pub struct Collected {
    /// Every data frame's bytes, in order.
    pub output: Vec<u8>,
    /// Sequence numbers of the data frames.
    pub seqs: Vec<u64>,
    /// The exit code of the `exit` frame, if one arrived.
    pub exit_code: Option<i32>,
    /// Whether an `exit` frame arrived.
    pub exited: bool,
}

impl Collected {
    /// The output as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

/// What the workflow observed.
#[derive(Debug)]
pub struct Outcome {
    /// Output of the env-override process.
    pub env_output: Collected,
    /// Output of `cat` after writing to and closing its stdin.
    pub echo_output: Collected,
    /// The replay of the env process from `last_seq - 1`.
    pub replayed: Collected,
    /// The PTY process after its resize.
    pub pty: ManagedProcess,
    /// The tree process as returned by its DELETE.
    pub terminated: ManagedProcess,
}

/// Reads a process's stream from `after` until its `exit` frame (or the end of the stream).
pub async fn collect(
    processes: &Processes,
    pid: &str,
    after: u64,
) -> createos_api::Result<Collected> {
    let mut collected = Collected::default();
    let mut stream = processes.connect(pid, after).await?;
    while let Some(event) = stream.next().await {
        match event? {
            ProcessEvent::Data { seq, data, .. } => {
                collected.seqs.push(seq);
                collected.output.extend_from_slice(&data);
            }
            ProcessEvent::Exit { exit_code, .. } => {
                collected.exit_code = exit_code;
                collected.exited = true;
                break;
            }
            _ => {}
        }
    }
    Ok(collected)
}

fn tree_wait() -> ManagedProcessWaitOptions {
    ManagedProcessWaitOptions {
        scope: Some(ManagedProcessWaitScope::Tree),
        timeout: Some(Duration::from_secs(30)),
    }
}

/// Runs the whole managed-process tour in a fresh sandbox and destroys it.
pub async fn run(client: &Client) -> createos_api::Result<Outcome> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape)
                .rootfs("devbox:1")
                .env(OVERRIDE_KEY, "declared-at-create"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let result = tour(&sandbox).await;
    sandbox.destroy().await?;
    result
}

async fn tour(sandbox: &Sandbox) -> createos_api::Result<Outcome> {
    let processes = sandbox.processes();

    // 1. A pipe process whose env overrides the value declared at create.
    let env_proc = processes
        .create(
            &ManagedProcessCreateRequest::command(
                "sh",
                [
                    "-c",
                    "echo \"override=$PROCESS_DEMO_OVERRIDE\"; echo done >&2",
                ],
            )
            .env(OVERRIDE_KEY, "set-per-process"),
        )
        .await?;
    processes.wait(&env_proc.process_id, tree_wait()).await?;
    let env_output = collect(&processes, &env_proc.process_id, 0).await?;
    println!("env process printed {:?}", env_output.text());

    // 2. Echo through stdin.
    let cat = processes
        .create(&ManagedProcessCreateRequest::command(
            "cat",
            Vec::<String>::new(),
        ))
        .await?;
    processes
        .input(&cat.process_id, "hello through stdin\n")
        .await?;
    processes.close_stdin(&cat.process_id).await?;
    processes.wait(&cat.process_id, tree_wait()).await?;
    let echo_output = collect(&processes, &cat.process_id, 0).await?;
    println!("cat echoed {:?}", echo_output.text());

    // 3. Rewind: replay what is retained after `last_seq - 1`.
    let last_seq = env_output.seqs.last().copied().unwrap_or(0);
    let replayed = collect(&processes, &env_proc.process_id, last_seq.saturating_sub(1)).await?;
    println!(
        "replayed from seq {}: {:?}",
        last_seq.saturating_sub(1),
        replayed.text()
    );

    // 4. A PTY with the default shell, resized after start.
    let pty = processes
        .create(&ManagedProcessCreateRequest::shell_pty(PtySize::new(24, 80)).cwd("/root"))
        .await?;
    processes
        .resize(&pty.process_id, PtySize::new(40, 120))
        .await?;
    let pty_now = processes.get(&pty.process_id).await?;
    processes
        .delete(&pty.process_id, ManagedProcessDeleteOptions::default())
        .await?;

    // 5. A tree that ignores SIGTERM: DELETE waits the grace period, then kills the tree.
    let tree = processes
        .create(&ManagedProcessCreateRequest::command(
            "sh",
            ["-c", "trap '' TERM; sleep 300 & sleep 300 & wait"],
        ))
        .await?;
    let terminated = processes
        .delete(
            &tree.process_id,
            ManagedProcessDeleteOptions {
                grace: Some(Duration::from_millis(500)),
            },
        )
        .await?;
    println!(
        "tree deleted: leader_exited={} tree_exited={}",
        terminated.leader_exited, terminated.tree_exited
    );

    Ok(Outcome {
        env_output,
        echo_output,
        replayed,
        pty: pty_now,
        terminated,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    run(&client).await?;
    Ok(())
}
