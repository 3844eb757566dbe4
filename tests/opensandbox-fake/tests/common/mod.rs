//! Shared helpers for the fake's own tests: the real `opensandbox-fake` binary, started as a
//! child process on `--port 0`, and a plain `reqwest` client against it (no client crate of
//! the workspace). Stats, configuration and faults go through the binary's `/_fake/*` routes.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The key every test server is started with.
pub const KEY: &str = "k-test";

/// A running `opensandbox-fake` child process; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Bin {
    pub child: Child,
    /// `http://127.0.0.1:PORT` from the `listening on` line.
    pub url: String,
    pub http: reqwest::Client,
}

impl Bin {
    /// Spawns the fake with `--port 0 --api-key k-test --ping-ms 300` plus `args`.
    pub fn spawn(args: &[&str]) -> Bin {
        Self::spawn_raw(
            &[
                &["--port", "0", "--api-key", KEY, "--ping-ms", "300"][..],
                args,
            ]
            .concat(),
        )
    }

    /// Spawns the binary with exactly `args` and reads the `listening on` line.
    pub fn spawn_raw(args: &[&str]) -> Bin {
        let mut child = Command::new(env!("CARGO_BIN_EXE_opensandbox-fake"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn opensandbox-fake");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        out.read_line(&mut first).expect("first line");
        let Some(url) = first
            .trim()
            .strip_prefix("listening on ")
            .map(str::to_owned)
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("unexpected first line {first:?} (args {args:?})");
        };
        let mut second = String::new();
        out.read_line(&mut second).expect("second line");
        assert!(second.contains("gives NO isolation"), "{second:?}");
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
        });
        Bin {
            child,
            url,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
        }
    }

    /// A request with the API key.
    pub fn req(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .header("OPEN-SANDBOX-API-KEY", KEY)
    }

    /// Sends a request with the key and an optional JSON body; returns status and JSON (or
    /// `Value::String` for a non-JSON body, `Null` for an empty one).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self.req(method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        (status, parse(&text))
    }

    /// `POST /v1/sandboxes` with a valid body merged with `extra`; asserts 202 and returns the
    /// answer.
    pub async fn create(&self, extra: Value) -> Value {
        let mut body = json!({
            "image": {"uri": "python:3.12-slim"},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 600,
            "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        let (st, v) = self.call(Method::POST, "/v1/sandboxes", Some(body)).await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        v
    }

    /// Creates a sandbox and returns its id.
    pub async fn create_id(&self) -> String {
        self.create(json!({})).await["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    /// Runs `body` on execd through the server proxy and collects every frame until the stream
    /// ends.
    pub async fn exec(&self, id: &str, body: Value) -> Exec {
        let resp = self
            .http
            .post(format!(
                "{}/v1/sandboxes/{id}/proxy/44772/command",
                self.url
            ))
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        let raw = resp.bytes().await.expect("stream").to_vec();
        Exec::parse(&String::from_utf8(raw).expect("utf-8 stream"))
    }

    /// Runs a shell command and collects its frames.
    pub async fn sh(&self, id: &str, command: &str) -> Exec {
        self.exec(id, json!({"command": command})).await
    }

    /// `GET /_fake/stats`.
    pub async fn stats(&self) -> Value {
        let r = self
            .http
            .get(format!("{}/_fake/stats", self.url))
            .send()
            .await
            .expect("stats");
        r.json().await.expect("stats json")
    }

    /// `POST /_fake/config` with `fields`; asserts 200.
    pub async fn config(&self, fields: Value) {
        let r = self
            .http
            .post(format!("{}/_fake/config", self.url))
            .json(&fields)
            .send()
            .await
            .expect("config");
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "{}",
            r.text().await.unwrap_or_default()
        );
    }

    /// `PUT /_fake/faults`; asserts 200.
    pub async fn faults(&self, spec: &str) {
        let r = self
            .http
            .put(format!("{}/_fake/faults", self.url))
            .body(spec.to_owned())
            .send()
            .await
            .expect("faults");
        assert_eq!(r.status(), StatusCode::OK);
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Some(st);
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).ok()?);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Bin {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// A body as JSON, a string, or null when empty.
pub fn parse(text: &str) -> Value {
    if text.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// The frames of one command stream.
#[derive(Debug, Clone)]
pub struct Exec {
    pub frames: Vec<Value>,
}

impl Exec {
    /// Splits a raw stream into its bare-JSON frames, asserting the wire form: each frame a
    /// JSON object followed by a blank line, never an SSE `data:` prefix.
    pub fn parse(raw: &str) -> Exec {
        assert!(
            raw.is_empty() || raw.ends_with("\n\n"),
            "stream does not end a frame: {raw:?}"
        );
        let mut frames = Vec::new();
        for chunk in raw.split("\n\n").filter(|c| !c.is_empty()) {
            assert!(!chunk.starts_with("data:"), "SSE prefix in {chunk:?}");
            let v: Value = serde_json::from_str(chunk).unwrap_or_else(|e| panic!("{chunk:?}: {e}"));
            assert!(
                v["timestamp"]
                    .as_i64()
                    .is_some_and(|t| t > 1_600_000_000_000),
                "{v}"
            );
            frames.push(v);
        }
        Exec { frames }
    }

    /// Frames of `kind`.
    pub fn of(&self, kind: &str) -> Vec<&Value> {
        self.frames.iter().filter(|f| f["type"] == kind).collect()
    }

    /// The texts of the `stdout` frames.
    pub fn stdout(&self) -> Vec<String> {
        self.texts("stdout")
    }

    /// The texts of the `stderr` frames.
    pub fn stderr(&self) -> Vec<String> {
        self.texts("stderr")
    }

    fn texts(&self, kind: &str) -> Vec<String> {
        self.of(kind)
            .iter()
            .map(|f| f["text"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The exit code as the SDK derives it: the `error` frame's `evalue`, else 0 after
    /// `execution_complete`, else `None`.
    pub fn exit_code(&self) -> Option<i64> {
        if let Some(e) = self.of("error").first() {
            return e["error"]["evalue"].as_str().and_then(|v| v.parse().ok());
        }
        (!self.of("execution_complete").is_empty()).then_some(0)
    }

    /// The command id of the `init` frame.
    pub fn id(&self) -> String {
        let init = &self.frames[0];
        assert_eq!(init["type"], "init", "first frame {init}");
        init["text"].as_str().expect("init text").to_owned()
    }
}

/// Reads frames from a streaming response as they arrive.
pub struct FrameReader {
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl FrameReader {
    /// Wraps a response.
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            stream: resp.bytes_stream().boxed(),
            buf: String::new(),
        }
    }

    /// The next frame, `None` at the end of the stream, `Err(())` when nothing complete arrives
    /// within `within`.
    pub async fn next(&mut self, within: Duration) -> Result<Option<Value>, ()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let chunk: String = self.buf.drain(..pos + 2).collect();
                let frames = Exec::parse(&chunk).frames;
                return Ok(frames.into_iter().next());
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Err(_) => return Err(()),
                Ok(None) => return Ok(None),
                Ok(Some(Ok(b))) => self.buf.push_str(&String::from_utf8_lossy(&b)),
                Ok(Some(Err(e))) => panic!("stream error: {e}"),
            }
        }
    }
}

/// Whether a process with this pid exists.
pub fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Polls `f` every 50 ms until it is true or `within` passes.
pub async fn eventually<F: FnMut() -> bool>(within: Duration, mut f: F) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
