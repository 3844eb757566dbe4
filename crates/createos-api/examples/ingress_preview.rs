//! Ingress preview: start a web server in the guest, wait for its port, print the preview URL.

use std::time::Duration;

use createos_api::{Client, CreateSandboxRequest, ExecOptions, RequestOptions, Sandbox};

/// Serve on `port` in a fresh ingress-enabled sandbox; returns the preview URL and what a
/// request from inside the guest received.
pub async fn run(client: &Client, port: u16) -> createos_api::Result<(String, String)> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape)
                .rootfs("devbox:1")
                .ingress_enabled(true),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let result = serve(&sandbox, port).await;
    sandbox.destroy().await?;
    result
}

async fn serve(sandbox: &Sandbox, port: u16) -> createos_api::Result<(String, String)> {
    sandbox
        .shell(
            format!(
                "mkdir -p /srv/site && echo 'hello from the sandbox' > /srv/site/index.html && \
                 cd /srv/site && (nohup python3 -m http.server {port} --bind 127.0.0.1 \
                 >/tmp/http.log 2>&1 &)"
            ),
            ExecOptions::default(),
        )
        .await?;
    sandbox
        .wait_for_port(port, "127.0.0.1", Duration::from_secs(15))
        .await?;
    let page = sandbox
        .shell(
            format!("exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3 | tail -n 1"),
            ExecOptions::default(),
        )
        .await?
        .result
        .stdout;
    let url = sandbox.preview_url(port)?;
    println!("preview: {url}");
    // Preview ingress uses a self-signed certificate: use `curl -k` from outside.
    Ok((url, page))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::var("PREVIEW_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8080);
    let client = Client::from_env()?;
    run(&client, port).await?;
    Ok(())
}
