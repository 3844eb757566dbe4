//! Shared helpers: a client for a mock server, and a scripted raw HTTP/1.1 server for what
//! httpmock cannot do (stalls mid-body, trickled frames, chunked bodies, dropped connections).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opensandbox_api::{Client, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The key every test configures; no error or `Debug` may show it.
pub const KEY: &str = "osk_test_7f3a9c1e5b2d4f60";

/// A sandbox id.
pub const SB: &str = "sb-1";

/// Quick retries, so retry tests stay fast.
pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        budget: Duration::from_secs(5),
    }
}

/// A client for `base` (`http://127.0.0.1:port`) with [`KEY`].
pub fn client_for(base: &str) -> Client {
    Client::builder()
        .domain(base)
        .api_key(KEY)
        .timeout(Duration::from_secs(5))
        .retry(fast_retry())
        .build()
        .expect("client builds")
}

/// A client for an httpmock server.
pub fn client(server: &httpmock::MockServer) -> Client {
    client_for(&server.base_url())
}

/// The execd proxy path of [`SB`] for `tail` (`/ping`).
pub fn proxied(tail: &str) -> String {
    format!("/v1/sandboxes/{SB}/proxy/44772{tail}")
}

/// Asserts that no piece of [`KEY`] (8 bytes or more) is in `text`.
pub fn assert_no_key(text: &str) {
    for i in 0..=KEY.len() - 8 {
        assert!(
            !text.contains(&KEY[i..i + 8]),
            "key fragment {:?} in {text}",
            &KEY[i..i + 8]
        );
    }
}

/// What a scripted connection does after reading a request.
#[derive(Clone, Debug)]
pub enum Step {
    /// Write these bytes.
    Write(Vec<u8>),
    /// Wait.
    Sleep(Duration),
}

/// `HTTP/1.1 200` head with a chunked body of `content_type`.
pub fn chunked_head(status: &str, content_type: &str) -> Step {
    Step::Write(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        .into_bytes(),
    )
}

/// One chunk of a chunked body.
pub fn chunk(data: &[u8]) -> Step {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    Step::Write(out)
}

/// The last chunk.
pub fn end() -> Step {
    Step::Write(b"0\r\n\r\n".to_vec())
}

/// A server that answers every connection with the steps `script(n)` gives for the n-th
/// request (0-based), then closes the connection. Requests are kept as received.
pub struct RawServer {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Connections whose client went away while the script was still writing.
    pub hung_up: Arc<std::sync::atomic::AtomicUsize>,
}

impl RawServer {
    pub async fn start<F>(script: F) -> RawServer
    where
        F: Fn(usize) -> Vec<Step> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let hung_up = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hangups = Arc::clone(&hung_up);
        let script = Arc::new(script);
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&seen);
                let script = Arc::clone(&script);
                let hangups = Arc::clone(&hangups);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut piece = [0u8; 4096];
                    // Read the head, then as much body as Content-Length says.
                    let head_end = loop {
                        let Ok(n) = sock.read(&mut piece).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&piece[..n]);
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        let Ok(n) = sock.read(&mut piece).await else {
                            return;
                        };
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&piece[..n]);
                    }
                    let index = {
                        let mut all = seen.lock().unwrap();
                        all.push(buf.clone());
                        all.len() - 1
                    };
                    for step in script(index) {
                        match step {
                            Step::Write(bytes) => {
                                if sock.write_all(&bytes).await.is_err()
                                    || sock.flush().await.is_err()
                                {
                                    hangups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    return;
                                }
                            }
                            Step::Sleep(d) => tokio::time::sleep(d).await,
                        }
                    }
                });
            }
        });
        RawServer {
            base,
            requests,
            hung_up,
        }
    }

    pub fn client(&self) -> Client {
        client_for(&self.base)
    }

    pub fn hits(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// Request `i` as received: its head as text and its body as bytes.
    pub fn request(&self, i: usize) -> (String, Vec<u8>) {
        let raw = self.requests.lock().unwrap()[i].clone();
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        (
            String::from_utf8_lossy(&raw[..split]).into_owned(),
            raw[split..].to_vec(),
        )
    }
}
