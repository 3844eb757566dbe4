//! Custom template: build a root filesystem from a Dockerfile, follow its build log, wait until
//! it is ready, start a sandbox from the template id, then clean up (sandbox first).
//!
//! ```text
//! CREATEOS_API_KEY=... cargo run -p createos-api --example custom_template
//! # against a local fake:
//! CREATEOS_SANDBOX_BASE_URL=http://127.0.0.1:8080 CREATEOS_API_KEY=test-key cargo run -p createos-api --example custom_template
//! ```

use std::time::Duration;

use createos_api::{
    Client, CreateSandboxRequest, Error, ExecOptions, GetTemplateOptions, RequestOptions,
    RunCommandRequest, Template, TemplateCreateRequest, TemplateLogsOptions, TemplateStatus,
};
use futures::StreamExt as _;

/// The Dockerfile the example builds.
pub const DOCKERFILE: &str =
    "FROM nodeops/sandbox:debian\nRUN echo 'built by the custom template example' > /etc/motd\n";

/// What the workflow observed.
#[derive(Debug)]
pub struct Outcome {
    /// The template as last fetched.
    pub template: Template,
    /// The followed build log lines, in order.
    pub log_lines: Vec<String>,
    /// The status carried by the final log frame.
    pub final_status: Option<TemplateStatus>,
    /// What a command printed in a sandbox created from the template.
    pub sandbox_output: String,
}

/// Build, follow, wait (polling every `poll` for at most `budget`), use and delete a template.
pub async fn run(
    client: &Client,
    name: &str,
    dockerfile: &str,
    poll: Duration,
    budget: Duration,
) -> createos_api::Result<Outcome> {
    let templates = client.templates();
    let template = templates
        .create(&TemplateCreateRequest::new(name, dockerfile))
        .await?;
    let result = build_and_use(client, &template.id, poll, budget).await;
    templates.delete(&template.id).await?;
    result
}

async fn build_and_use(
    client: &Client,
    id: &str,
    poll: Duration,
    budget: Duration,
) -> createos_api::Result<Outcome> {
    let templates = client.templates();
    let mut log_lines = Vec::new();
    let mut final_status = None;
    let mut logs = templates
        .follow_logs(id, TemplateLogsOptions::default())
        .await?;
    while let Some(event) = logs.next().await {
        let event = event?;
        if !event.line.is_empty() {
            println!("build: {}", event.line);
            log_lines.push(event.line.clone());
        }
        if event.is_final {
            final_status = event.status;
            break;
        }
    }
    drop(logs);

    // The log stream says the build is over; confirm through the template itself.
    let deadline = tokio::time::Instant::now() + budget;
    let template = loop {
        let template = templates.get(id, GetTemplateOptions::default()).await?;
        if template.status.is_terminal() {
            break template;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::OperationTimeout {
                operation: format!("template {id} to finish building"),
                after: budget,
            });
        }
        tokio::time::sleep(poll).await;
    };
    if template.status != TemplateStatus::Ready {
        return Ok(Outcome {
            template,
            log_lines,
            final_status,
            sandbox_output: String::new(),
        });
    }

    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape).rootfs(template.id.clone()),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let output = sandbox
        .run_command(
            RunCommandRequest::new("sh").args(["-c", "echo running on a custom template"]),
            ExecOptions::default(),
        )
        .await;
    // Destroy the sandbox before the template goes away.
    sandbox.destroy().await?;
    Ok(Outcome {
        template,
        log_lines,
        final_status,
        sandbox_output: output?.result.stdout,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let outcome = run(
        &client,
        &format!("custom-template-{nanos:08x}"),
        DOCKERFILE,
        Duration::from_secs(2),
        Duration::from_secs(600),
    )
    .await?;
    println!(
        "template {} is {}; sandbox said: {}",
        outcome.template.id,
        outcome.template.status,
        outcome.sandbox_output.trim_end()
    );
    Ok(())
}
