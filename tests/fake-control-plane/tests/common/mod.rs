//! Shared helpers for the fake's own tests: the real `createos-fake` binary, started as a child
//! process on `--port 0`, and a raw-JSON HTTP client against it. Stats, the clock, faults and
//! reset go through the binary's `/_fake/*` HTTP routes, so the suite exercises exactly what a
//! script or another crate's test sees over HTTP.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use createos_fake::{FakeOptions, Stats};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// A running `createos-fake` child process; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Bin {
    pub child: Child,
    /// The URL from the `listening on` line (includes the base path).
    pub url: String,
    /// Everything the binary printed on stdout after the first line (read until it exits).
    pub rest: Option<std::thread::JoinHandle<String>>,
}

impl Bin {
    /// Spawns the binary with `--port 0` plus `args` and reads the `listening on` line.
    pub fn spawn(args: &[String]) -> Bin {
        let mut child = Command::new(env!("CARGO_BIN_EXE_createos-fake"))
            .args(["--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn createos-fake");
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
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let rest = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        });
        Bin {
            child,
            url,
            rest: Some(rest),
        }
    }

    /// `http://127.0.0.1:PORT`, without the base path (control routes answer there too).
    pub fn root(&self) -> String {
        let after_scheme = &self.url["http://".len()..];
        let host_end = after_scheme.find('/').unwrap_or(after_scheme.len());
        format!("http://{}", &after_scheme[..host_end])
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
        None
    }
}

impl Drop for Bin {
    fn drop(&mut self) {
        // SIGTERM first so the fake kills its guest processes and removes its temporary state;
        // SIGKILL if it does not exit in time. Either way no orphan is left behind.
        if self.terminate().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Command-line flags that start the binary with `opts`. Every `FakeOptions` field is
/// destructured, so a new option cannot be added without a flag here (and in the binary).
pub fn cli_args(opts: &FakeOptions) -> Vec<String> {
    let FakeOptions {
        api_key,
        base_path,
        latency,
        faults,
        guest_path,
        resume_delay,
        destroy_delay,
        create_delay,
        pause_delay,
        fork_delay,
        heartbeat,
        sse,
        state_dir,
        max_live,
        enforce_egress,
        egress_uplink_netns,
        request_log,
    } = opts;
    let ms = |d: &Duration| d.as_millis().to_string();
    let mut a: Vec<String> = vec![
        "--api-key".into(),
        api_key.clone(),
        "--latency-ms".into(),
        ms(latency),
        "--resume-delay-ms".into(),
        ms(resume_delay),
        "--destroy-delay-ms".into(),
        ms(destroy_delay),
        "--create-delay-ms".into(),
        ms(create_delay),
        "--pause-delay-ms".into(),
        ms(pause_delay),
        "--fork-delay-ms".into(),
        ms(fork_delay),
        "--heartbeat-ms".into(),
        ms(heartbeat),
        "--max-live".into(),
        max_live.to_string(),
    ];
    if !base_path.is_empty() {
        a.extend(["--base-path".into(), base_path.clone()]);
    }
    if !faults.is_empty() {
        a.extend(["--faults".into(), faults.clone()]);
    }
    if !guest_path.is_empty() {
        let joined = std::env::join_paths(guest_path).expect("guest path joins");
        a.extend(["--guest-path".into(), joined.to_string_lossy().into_owned()]);
    }
    if *sse {
        a.push("--sse".into());
    }
    if let Some(d) = state_dir {
        a.extend(["--state-dir".into(), d.to_string_lossy().into_owned()]);
    }
    if *enforce_egress {
        a.push("--enforce-egress".into());
    }
    if let Some(ns) = egress_uplink_netns {
        a.extend(["--egress-uplink-netns".into(), ns.clone()]);
    }
    if let Some(f) = request_log {
        a.extend(["--request-log".into(), f.to_string_lossy().into_owned()]);
    }
    a
}

/// A started fake binary plus a client.
pub struct Fx {
    pub bin: Bin,
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

    /// Starts the binary with the flags equivalent to `opts`.
    pub async fn with(opts: FakeOptions) -> Fx {
        let key = opts.api_key.clone();
        let args = cli_args(&opts);
        let bin = tokio::task::spawn_blocking(move || Bin::spawn(&args))
            .await
            .expect("spawn task");
        let url = bin.url.clone();
        Fx {
            bin,
            http: client(),
            url,
            key,
        }
    }

    /// A control route (`/_fake/...`) at the server root.
    pub fn control(&self, path: &str) -> String {
        format!("{}/_fake/{path}", self.bin.root())
    }

    /// `GET /_fake/stats`.
    pub async fn stats(&self) -> Stats {
        let v: Value = self
            .http
            .get(self.control("stats"))
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("stats body");
        assert_eq!(v["status"], "success", "{v}");
        serde_json::from_value(v["data"].clone()).expect("stats shape")
    }

    /// `POST /_fake/clock/advance?seconds=N` (runs the auto-pause sweep).
    pub async fn advance_clock(&self, by: Duration) {
        let r = self
            .http
            .post(self.control("clock/advance"))
            .query(&[("seconds", by.as_secs_f64().to_string())])
            .send()
            .await
            .expect("advance");
        assert_eq!(r.status().as_u16(), 200);
    }

    /// `PUT /_fake/faults`; `Err` carries the 400 body for a bad spec.
    pub async fn set_faults(&self, spec: &str) -> Result<(), String> {
        let r = self
            .http
            .put(self.control("faults"))
            .body(spec.to_owned())
            .send()
            .await
            .expect("faults");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        if status == 200 { Ok(()) } else { Err(text) }
    }

    /// `POST /_fake/reset`.
    pub async fn reset(&self) {
        let r = self
            .http
            .post(self.control("reset"))
            .send()
            .await
            .expect("reset");
        assert_eq!(r.status().as_u16(), 200);
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

/// Waits (bounded) until the async check `f` holds.
pub async fn eventually_async<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
