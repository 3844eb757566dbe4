//! Exec (buffered, streaming, SSE), guest paths, timeout(1) and files, over HTTP.

mod common;

use common::{Fx, eventually, fast, parse_frames, pid_alive, read_frames};
use createos_fake::FakeOptions;
use futures::StreamExt;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn buffered_exec_runs_python_and_reports_exit_codes() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"cmd": "python3", "args": ["-c", "print(1)"]}),
        )
        .await;
    assert_eq!(r.data()["result"]["stdout"], "1\n");
    assert_eq!(r.data()["result"]["exit_code"], 0);
    assert!(r.data()["exec_ms"].is_number());
    let fail = fx.exec(&id, "sh", &["-c", "echo oops >&2; exit 3"]).await;
    assert_eq!(fail["exit_code"], 3);
    assert_eq!(fail["stderr"], "oops\n");
    let missing = fx.exec(&id, "definitely-not-a-command-xyz", &[]).await;
    assert!(
        missing["error"].as_str().unwrap().contains("not found"),
        "{missing}"
    );
    assert_eq!(missing["exit_code"], 127);
    // No shell unless the command is one: metacharacters are literal arguments.
    let literal = fx.exec(&id, "echo", &["a", "&&", "$HOME"]).await;
    assert_eq!(literal["stdout"], "a && $HOME\n");
    // stdin is delivered.
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"cmd": "cat", "stdin": "from stdin"}),
        )
        .await;
    assert_eq!(r.data()["result"]["stdout"], "from stdin");
    let bad = fx
        .post(&format!("/v1/sandboxes/{id}/exec"), json!({"args": ["x"]}))
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn guest_paths_map_into_the_guest_directory() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let up = fx
        .upload(
            &id,
            "/workspace/main.py",
            b"print('hello from main')\n".to_vec(),
        )
        .await;
    assert_eq!(up.status, 200);
    let r = fx.exec(&id, "python3", &["/workspace/main.py"]).await;
    assert_eq!(r["stdout"], "hello from main\n");
    let r = fx
        .exec(
            &id,
            "sh",
            &["-c", "cat /workspace/main.py >/tmp/copy && cat '/tmp/copy'"],
        )
        .await;
    assert_eq!(r["stdout"], "print('hello from main')\n");
    let r = fx
        .exec(&id, "sh", &["-c", "pwd; echo $HOME; echo $TMPDIR"])
        .await;
    let out = r["stdout"].as_str().unwrap().to_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].ends_with("/workspace"), "{out}");
    assert!(lines[1].ends_with("/root"), "{out}");
    assert!(lines[2].ends_with("/tmp"), "{out}");
    assert!(
        lines[0].contains(&id),
        "cwd is inside this guest's directory: {out}"
    );
    // Two guests do not share files.
    let other = fx.create(json!({})).await;
    let r = fx.exec(&other, "cat", &["/workspace/main.py"]).await;
    assert_ne!(r["exit_code"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn env_must_be_declared_at_create() {
    let fx = Fx::new().await;
    let id = fx
        .create(json!({"envs": {"GREETING": "hi", "OTHER": "o"}}))
        .await;
    let r = fx.exec(&id, "sh", &["-c", "echo $GREETING-$OTHER"]).await;
    assert_eq!(r["stdout"], "hi-o\n");
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"cmd": "sh", "args": ["-c", "echo $GREETING"], "env": {"GREETING": "override"}}),
        )
        .await;
    assert_eq!(r.data()["result"]["stdout"], "override\n");
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"cmd": "true", "env": {"NEW_KEY": "x"}}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["status"], "fail");
    assert!(r.text.contains("NEW_KEY"));
}

#[tokio::test(flavor = "multi_thread")]
async fn gnu_timeout_behaves_as_on_createos() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let r = fx
        .exec(
            &id,
            "timeout",
            &["--signal=KILL", "0.3", "sh", "-c", "echo partial; sleep 5"],
        )
        .await;
    assert_eq!(r["exit_code"], 137);
    assert_eq!(r["stdout"], "partial\n", "partial output is kept");
    let r = fx.exec(&id, "timeout", &["0.3", "sleep", "5"]).await;
    assert_eq!(r["exit_code"], 124);
    fx.upload(
        &id,
        "/workspace/stubborn.py",
        b"import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('x', flush=True)\ntime.sleep(5)\n".to_vec(),
    )
    .await;
    let r = fx
        .exec(
            &id,
            "timeout",
            &[
                "--signal=TERM",
                "--kill-after=0.5",
                "1.5",
                "python3",
                "/workspace/stubborn.py",
            ],
        )
        .await;
    assert_eq!(r["exit_code"], 137);
    assert_eq!(r["stdout"], "x\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_exec_forwards_output_as_it_arrives() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    // The command prints, then waits for a file the test writes only after seeing the first frame.
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec?stream=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"cmd": "sh", "args": ["-c", "echo first; while [ ! -f /workspace/go ]; do sleep 0.02; done; echo second; echo err >&2; exit 7"], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.headers().contains_key("x-request-id"));
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    while !buf.contains("first") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), body.next())
            .await
            .expect("first frame arrives before the command ends")
            .expect("stream open")
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
    fx.upload(&id, "/workspace/go", b"go".to_vec()).await;
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let frames = parse_frames(&buf);
    let stdout: String = frames.iter().filter_map(|f| f["stdout"].as_str()).collect();
    let stderr: String = frames.iter().filter_map(|f| f["stderr"].as_str()).collect();
    assert_eq!(stdout, "first\nsecond\n");
    assert_eq!(stderr, "err\n");
    assert_eq!(
        frames.last().unwrap(),
        &json!({"exit_code": 7}),
        "exit frame last"
    );
    // The body flag alone also selects streaming.
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"cmd": "echo", "args": ["x"], "stream": true}))
        .send()
        .await
        .unwrap();
    let frames = read_frames(resp).await;
    assert_eq!(
        frames,
        vec![json!({"stdout": "x\n"}), json!({"exit_code": 0})]
    );
    assert_eq!(fx.stats().await.requests.get("exec_stream"), Some(&2));
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_sends_heartbeats_and_sse_framing() {
    let fx = Fx::with(FakeOptions {
        sse: true,
        heartbeat: std::time::Duration::from_millis(50),
        ..fast()
    })
    .await;
    let id = fx.create(json!({})).await;
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec?stream=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"cmd": "sh", "args": ["-c", "sleep 0.4; echo done"], "stream": true}))
        .send()
        .await
        .unwrap();
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("event-stream")
    );
    let text = resp.text().await.unwrap();
    // Contract §5.1 item 16: SSE mode mixes `data:` lines and `:` comment lines.
    assert!(
        text.lines()
            .filter(|l| !l.is_empty())
            .all(|l| l.starts_with("data: ") || l.starts_with(": ")),
        "{text}"
    );
    let comments: Vec<&str> = text.lines().filter(|l| l.starts_with(':')).collect();
    assert!(!comments.is_empty(), "no ':' comment line: {text}");
    assert!(comments.iter().all(|l| *l == ": keep-alive"), "{text}");
    // Each keep-alive comment comes with a `data: {"hb":true}` frame in the same event.
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with(':') {
            let next: Value = serde_json::from_str(
                lines[i + 1]
                    .strip_prefix("data: ")
                    .expect("data after a comment"),
            )
            .unwrap();
            assert_eq!(next, json!({"hb": true}), "{text}");
        }
    }
    let frames = parse_frames(&text);
    assert!(
        frames.iter().any(|f| f["hb"] == true),
        "a heartbeat while the command is quiet"
    );
    assert_eq!(frames.last().unwrap()["exit_code"], 0);
    assert!(frames.iter().any(|f| f["stdout"] == "done\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnecting_a_stream_kills_the_guest_process() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec?stream=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"cmd": "sh", "args": ["-c", "sleep 30 & echo $!; wait"], "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let frame: Value = serde_json::from_slice(chunk.trim_ascii()).unwrap();
    let pid: i32 = frame["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(pid_alive(pid));
    drop(body);
    eventually("the grandchild to be killed with its process group", || {
        !pid_alive(pid)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn peak_concurrent_execs_is_counted() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let script = "touch /workspace/n$$; while [ $(ls /workspace | grep -c '^n') -lt 3 ]; do sleep 0.02; done";
    let args = ["-c", script];
    let runs = (0..3).map(|_| fx.exec(&id, "sh", &args));
    for r in futures::future::join_all(runs).await {
        assert_eq!(r["exit_code"], 0);
    }
    assert!(fx.stats().await.peak_concurrent_execs >= 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn files_upload_and_download() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let data: Vec<u8> = (0..200_000_u32).map(|i| (i % 251) as u8).collect();
    let up = fx
        .upload(&id, "/workspace/deep/er/blob.bin", data.clone())
        .await;
    assert_eq!(up.data()["bytes"], 200_000);
    assert_eq!(up.data()["path"], "/workspace/deep/er/blob.bin");
    let resp = fx
        .http
        .get(format!("{}/v1/sandboxes/{id}/files", fx.url))
        .query(&[("path", "/workspace/deep/er/blob.bin")])
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-length"], "200000");
    assert_eq!(resp.bytes().await.unwrap().to_vec(), data);
    // A guest command sees the file at its guest path.
    let r = fx
        .exec(&id, "wc", &["-c", "/workspace/deep/er/blob.bin"])
        .await;
    assert!(r["stdout"].as_str().unwrap().starts_with("200000"));
    let missing = fx
        .get(&format!("/v1/sandboxes/{id}/files?path=/workspace/nope"))
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body["status"], "fail");
    let escape = fx
        .get(&format!(
            "/v1/sandboxes/{id}/files?path=/workspace/../../etc/passwd"
        ))
        .await;
    assert_eq!(escape.status, 400);
    let no_path = fx.get(&format!("/v1/sandboxes/{id}/files")).await;
    assert_eq!(no_path.status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_guests_refuse_exec_and_files_with_the_live_message() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    fx.upload(&id, "/workspace/a.txt", b"a".to_vec()).await;
    let p = fx
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(p.data()["status"], "paused");
    let msg = "sandbox is paused; resume it before accessing files";
    let r = fx
        .post(&format!("/v1/sandboxes/{id}/exec"), json!({"cmd": "true"}))
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(
        r.body,
        json!({"status": "error", "message": msg, "code": 409})
    );
    let r = fx
        .get(&format!("/v1/sandboxes/{id}/files?path=/workspace/a.txt"))
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(r.body["message"], msg);
    let r = fx.upload(&id, "/workspace/b.txt", b"b".to_vec()).await;
    assert_eq!(r.status, 409);
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(r.status, 409);
}

#[tokio::test(flavor = "multi_thread")]
async fn guest_path_directories_come_first() {
    let bin = tempfile::tempdir().unwrap();
    let shim = bin.path().join("python3");
    std::fs::write(&shim, "#!/bin/sh\necho guest-python \"$@\"\n").unwrap();
    let mut perms = std::fs::metadata(&shim).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&shim, perms).unwrap();
    let fx = Fx::with(FakeOptions {
        guest_path: vec![bin.path().to_path_buf()],
        ..fast()
    })
    .await;
    let id = fx.create(json!({})).await;
    let r = fx.exec(&id, "python3", &["-c", "print(1)"]).await;
    assert_eq!(r["stdout"], "guest-python -c print(1)\n");
    // timeout(1) resolves its command through the same PATH.
    let r = fx.exec(&id, "timeout", &["5", "python3", "x"]).await;
    assert_eq!(r["stdout"], "guest-python x\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn ndjson_heartbeats_are_bare_hb_frames_without_comments() {
    let fx = Fx::with(FakeOptions {
        heartbeat: std::time::Duration::from_millis(50),
        ..fast()
    })
    .await;
    let id = fx.create(json!({})).await;
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec?stream=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"cmd": "sh", "args": ["-c", "sleep 0.3; echo done"], "stream": true}))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(
        text.lines()
            .filter(|l| !l.is_empty())
            .all(|l| l.starts_with('{')),
        "NDJSON only: {text}"
    );
    assert!(text.lines().any(|l| l == r#"{"hb":true}"#), "{text}");
    assert_eq!(text.lines().last(), Some(r#"{"exit_code":0}"#));
}
