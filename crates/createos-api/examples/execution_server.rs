//! An HTTP execution server: `POST /run` with `{"code": "<python>", "timeoutSeconds": 30}` runs
//! the code in a fresh sandbox and answers `{stdout, stderr, exitCode, executionMilliseconds}`.
//! Invalid bodies get 400 and never create a sandbox; every sandbox is destroyed afterwards.
//!
//! ```text
//! EXEC_SERVER_ADDR=127.0.0.1:3000 cargo run -p createos-api --example execution_server
//! curl -s localhost:3000/run -d '{"code":"print(6*7)"}'
//! ```

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use createos_api::{Client, CreateSandboxRequest, ExecOptions, RequestOptions, RunCommandRequest};
use serde_json::{Value, json};

/// The largest accepted program (64 KiB).
pub const MAX_CODE: usize = 64 * 1024;

/// The server's routes, sharing one client.
pub fn router(client: Client) -> Router {
    Router::new().route("/run", post(run)).with_state(client)
}

fn bad_request(msg: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": msg }))).into_response()
}

/// Validate the request: `code` is a non-empty string, `timeoutSeconds` an integer 1..=300.
fn parse(body: &[u8]) -> Result<(String, u64), &'static str> {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
        return Err("body must be a JSON object");
    };
    let code = match obj.get("code") {
        Some(Value::String(c)) if !c.trim().is_empty() && c.len() <= MAX_CODE => c.clone(),
        _ => return Err("`code` must be a non-empty string of at most 64 KiB"),
    };
    let timeout = match obj.get("timeoutSeconds") {
        None | Some(Value::Null) => 30,
        Some(v) => match v.as_u64() {
            Some(t @ 1..=300) => t,
            _ => return Err("`timeoutSeconds` must be an integer from 1 to 300"),
        },
    };
    Ok((code, timeout))
}

async fn run(State(client): State<Client>, body: Bytes) -> Response {
    let (code, timeout) = match parse(&body) {
        Ok(x) => x,
        Err(msg) => return bad_request(msg),
    };
    match execute(&client, &code, timeout).await {
        Ok(v) => (StatusCode::OK, Json(v)).into_response(),
        Err(e) => {
            let status = if e.is_retryable() {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::BAD_GATEWAY
            };
            (status, Json(json!({ "error": e.to_string() }))).into_response()
        }
    }
}

async fn execute(client: &Client, code: &str, timeout: u64) -> createos_api::Result<Value> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape).rootfs("devbox:1"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let outcome = async {
        sandbox
            .files()
            .upload("/workspace/main.py", code.to_owned())
            .await?;
        let started = Instant::now();
        let req = RunCommandRequest::new("timeout").args([
            "--signal=KILL".to_owned(),
            timeout.to_string(),
            "python3".to_owned(),
            "/workspace/main.py".to_owned(),
        ]);
        let out = sandbox
            .run_command(req, ExecOptions::timeout(Duration::from_secs(timeout + 15)))
            .await?;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        Ok::<_, createos_api::Error>(json!({
            "stdout": out.result.stdout,
            "stderr": out.result.stderr,
            "exitCode": out.result.exit_code,
            "timedOut": out.result.exit_code == 124,
            "executionMilliseconds": out.exec_ms.unwrap_or(elapsed_ms),
        }))
    }
    .await;
    // Destroy whatever happened; a destroy failure only matters if the run succeeded.
    let destroyed = sandbox.destroy().await;
    let value = outcome?;
    destroyed?;
    Ok(value)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    let addr = std::env::var("EXEC_SERVER_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(client)).await?;
    Ok(())
}
