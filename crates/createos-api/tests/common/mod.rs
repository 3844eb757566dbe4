//! Shared helpers for the mock-server tests.
#![allow(dead_code, clippy::needless_pass_by_value)]

pub mod fake;

use std::time::Duration;

use createos_api::{Client, RetryOptions};
use httpmock::MockServer;
use serde_json::{Value, json};

/// The key every mock test configures.
pub const KEY: &str = "sk_test_0123456789abcdef";

/// Fast retries so retry tests stay quick.
pub fn fast_retry() -> RetryOptions {
    RetryOptions {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

/// A client pointed at `server` with [`KEY`].
pub fn client(server: &MockServer) -> Client {
    Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .timeout(Duration::from_secs(10))
        .retry(fast_retry())
        .build()
        .expect("client builds")
}

/// `{"status":"success","data":data}`.
pub fn ok(data: Value) -> Value {
    json!({ "status": "success", "data": data })
}

/// A minimal sandbox projection.
pub fn sandbox_json(id: &str, status: &str) -> Value {
    json!({
        "id": id,
        "status": status,
        "name": "demo",
        "ip": "10.0.0.2",
        "vcpu": 2,
        "mem_mib": 4096,
        "disk_mib": 8192,
        "shape": "s-2vcpu-4gb",
        "rootfs": "devbox:1",
        "egress": ["240.0.0.0/4"],
        "envs": ["FOO"],
        "auto_pause_after_seconds": 300
    })
}

/// Run `fut` with a 20 s bound so a hung test fails instead of stalling CI.
pub async fn bounded<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("test step timed out")
}

/// A one-connection raw HTTP/1.1 server on 127.0.0.1 that answers with `head` and then
/// writes `chunks` using chunked encoding, forever when `repeat` is set. The returned
/// receiver yields the number of body bytes written once the client goes away or the
/// body is complete.
pub async fn chunked_server(
    status: u16,
    chunks: Vec<Vec<u8>>,
    repeat: bool,
) -> (String, tokio::sync::oneshot::Receiver<u64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok(Ok((mut sock, _))) =
            tokio::time::timeout(Duration::from_secs(20), listener.accept()).await
        else {
            return;
        };
        // Read the request head (bodies are small in these tests).
        let mut buf = vec![0u8; 64 * 1024];
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        if sock.write_all(head.as_bytes()).await.is_err() {
            let _ = tx.send(0);
            return;
        }
        let mut written = 0u64;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        'outer: loop {
            for c in &chunks {
                let frame = [
                    format!("{:x}\r\n", c.len()).into_bytes(),
                    c.clone(),
                    b"\r\n".to_vec(),
                ]
                .concat();
                if sock.write_all(&frame).await.is_err() || tokio::time::Instant::now() > deadline {
                    break 'outer;
                }
                written += c.len() as u64;
            }
            if !repeat {
                let _ = sock.write_all(b"0\r\n\r\n").await;
                break;
            }
        }
        let _ = tx.send(written);
    });
    (format!("http://{addr}"), rx)
}

/// A raw HTTP/1.1 server on 127.0.0.1 that answers every connection (retries included)
/// with the bytes of `reply` verbatim, then holds the socket open for `hold` before closing
/// it. Lets a test send headers and part of a body, then stall or cut the connection.
pub async fn scripted_server(reply: Vec<u8>, hold: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok(Ok((mut sock, _))) =
            tokio::time::timeout(Duration::from_secs(20), listener.accept()).await
        {
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = sock.write_all(&reply).await;
                tokio::time::sleep(hold).await;
            });
        }
    });
    format!("http://{addr}")
}

/// A client for `url` with [`KEY`], the given timeout and fast retries.
pub fn client_for(url: &str, timeout: Duration) -> Client {
    Client::builder()
        .api_key(KEY)
        .base_url(url)
        .timeout(timeout)
        .retry(fast_retry())
        .build()
        .expect("client builds")
}
