//! Shared helpers for the fake's own tests: a raw-JSON HTTP client against a started server.
#![allow(dead_code)]

use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// A started fake plus a client.
pub struct Fx {
    pub server: FakeServer,
    pub http: reqwest::Client,
    pub url: String,
    pub key: String,
}

/// A response reduced to what tests look at.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Resp {
    /// `data` of a success envelope (asserts it is one).
    pub fn data(&self) -> &Value {
        assert_eq!(self.status, 200, "expected 200, got {self:?}");
        assert_eq!(
            self.body["status"], "success",
            "not a success envelope: {self:?}"
        );
        &self.body["data"]
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Fast options for tests.
pub fn fast() -> FakeOptions {
    FakeOptions {
        resume_delay: Duration::from_millis(150),
        destroy_delay: Duration::from_millis(100),
        heartbeat: Duration::from_millis(200),
        ..FakeOptions::default()
    }
}

impl Fx {
    pub async fn new() -> Fx {
        Fx::with(fast()).await
    }

    pub async fn with(opts: FakeOptions) -> Fx {
        let server = FakeServer::start(opts).await.expect("start fake");
        let url = server.url();
        let key = server.api_key().to_owned();
        Fx {
            server,
            http: client(),
            url,
            key,
        }
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Resp {
        let mut rb = self.http.request(method, format!("{}{}", self.url, path));
        if let Some(k) = key {
            rb = rb.header("X-Api-Key", k);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            body,
            text,
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(reqwest::Method::GET, path, Some(&self.key), None)
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> Resp {
        self.send(reqwest::Method::POST, path, Some(&self.key), Some(body))
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> Resp {
        self.send(reqwest::Method::PUT, path, Some(&self.key), Some(body))
            .await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Resp {
        self.send(reqwest::Method::PATCH, path, Some(&self.key), Some(body))
            .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(reqwest::Method::DELETE, path, Some(&self.key), None)
            .await
    }

    /// Creates a sandbox and returns its id.
    pub async fn create(&self, extra: Value) -> String {
        let mut body = json!({"shape": "s-1vcpu-256mb"});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        let r = self.post("/v1/sandboxes", body).await;
        r.data()["id"].as_str().expect("id").to_owned()
    }

    /// Buffered exec; returns `data.result`.
    pub async fn exec(&self, id: &str, cmd: &str, args: &[&str]) -> Value {
        let r = self
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"cmd": cmd, "args": args}),
            )
            .await;
        r.data()["result"].clone()
    }

    pub async fn upload(&self, id: &str, path: &str, bytes: Vec<u8>) -> Resp {
        let resp = self
            .http
            .put(format!("{}/v1/sandboxes/{id}/files", self.url))
            .query(&[("path", path)])
            .header("X-Api-Key", &self.key)
            .header("Content-Type", "application/octet-stream")
            .body(bytes)
            .send()
            .await
            .expect("upload");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        Resp {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// Polls GET until the status is `want` (bounded).
    pub async fn wait_status(&self, id: &str, want: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = self.get(&format!("/v1/sandboxes/{id}")).await;
            if r.data()["status"] == want {
                return r.data().clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sandbox {id} never became {want}: {:?}",
                r.body
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Reads NDJSON / SSE frames from a streaming response until EOF (bounded by the client timeout).
pub async fn read_frames(resp: reqwest::Response) -> Vec<Value> {
    let text = resp.text().await.expect("stream body");
    parse_frames(&text)
}

pub fn parse_frames(text: &str) -> Vec<Value> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(':'))
        .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad frame {l:?}: {e}")))
        .collect()
}

/// Whether a process with this pid is alive (and not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits (bounded) until `f` holds.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
