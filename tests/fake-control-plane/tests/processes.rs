//! Managed processes: sequenced output, reconnect, input, signals, wait, delete, PTYs.

mod common;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use common::{Fx, fast, parse_frames};
use createos_fake::FakeOptions;
use serde_json::{Value, json};

async fn connect(fx: &Fx, id: &str, pid: &str, after: u64) -> Vec<Value> {
    let resp = fx
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/processes/{pid}/connect?after={after}",
            fx.url
        ))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    parse_frames(&resp.text().await.unwrap())
}

fn decoded(frames: &[Value], stream: &str) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == "data" && f["stream"] == stream)
        .map(|f| {
            String::from_utf8(B64.decode(f["data_base64"].as_str().unwrap()).unwrap()).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pipe_process_input_wait_connect_and_replay() {
    let fx = Fx::new().await;
    let id = fx.create(json!({"envs": {"DEMO": "declared"}})).await;
    let created = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "sh", "args": ["-c", "read line; echo got:$line:$DEMO; echo warn >&2; echo last"], "cwd": "/tmp", "env": {"DEMO": "overridden"}}),
        )
        .await;
    let p = created.data().clone();
    let pid = p["process_id"].as_str().unwrap().to_owned();
    assert_eq!(p["kind"], "process");
    assert_eq!(p["state"], "running");
    assert!(p["pid"].as_i64().unwrap() > 0);
    let list = fx.get(&format!("/v1/sandboxes/{id}/processes")).await;
    assert_eq!(list.data()["processes"][0]["process_id"], pid.as_str());
    let inp = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{pid}/input"),
            json!({"data_base64": B64.encode("hello\n")}),
        )
        .await;
    assert_eq!(inp.data()["input_seq"], 1);
    let waited = fx
        .get(&format!(
            "/v1/sandboxes/{id}/processes/{pid}/wait?scope=tree&timeout_ms=10000"
        ))
        .await;
    let w = waited.data().clone();
    assert_eq!(w["leader_exited"], true);
    assert_eq!(w["tree_exited"], true);
    assert_eq!(w["exit_code"], 0);
    assert_eq!(w["state"], "exited");
    let newest = w["output"]["newest_seq"].as_u64().unwrap();
    assert!(newest >= 2);
    assert_eq!(w["output"]["oldest_seq"], 1);
    let frames = connect(&fx, &id, &pid, 0).await;
    assert_eq!(decoded(&frames, "stdout"), "got:hello:overridden\nlast\n");
    assert_eq!(decoded(&frames, "stderr"), "warn\n");
    let seqs: Vec<u64> = frames.iter().filter_map(|f| f["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "increasing seq: {seqs:?}"
    );
    assert_eq!(frames.last().unwrap()["type"], "exit");
    assert_eq!(frames.last().unwrap()["exit_code"], 0);
    // Reconnect after the second-to-last seq replays only the last chunk.
    let replay = connect(&fx, &id, &pid, newest - 1).await;
    let data: Vec<&Value> = replay.iter().filter(|f| f["type"] == "data").collect();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["seq"], newest);
    assert_eq!(replay.last().unwrap()["type"], "exit");
    // Undeclared env keys are refused.
    let bad = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "true", "env": {"NOPE": "1"}}),
        )
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_window_reports_the_oldest_available_seq() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let p = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "sh", "args": ["-c", "i=0; while [ $i -lt 300 ]; do head -c 8192 /dev/zero | tr '\\0' a; i=$((i+1)); done"]}),
        )
        .await;
    let pid = p.data()["process_id"].as_str().unwrap().to_owned();
    let w = fx
        .get(&format!(
            "/v1/sandboxes/{id}/processes/{pid}/wait?scope=tree&timeout_ms=20000"
        ))
        .await;
    let out = w.data()["output"].clone();
    let oldest = out["oldest_seq"].as_u64().unwrap();
    assert!(oldest > 1, "older output was dropped: {out}");
    assert!(out["bytes"].as_u64().unwrap() <= 1024 * 1024 + 16 * 1024);
    let frames = connect(&fx, &id, &pid, 0).await;
    assert_eq!(frames.len(), 1, "only an error frame");
    assert_eq!(frames[0]["type"], "error");
    assert_eq!(frames[0]["oldest_available_seq"], oldest);
    let ok = connect(&fx, &id, &pid, oldest - 1).await;
    assert_eq!(ok[0]["seq"], oldest);
    assert_eq!(ok.last().unwrap()["type"], "exit");
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_close_signal_and_delete_with_grace() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let cat = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "cat"}),
        )
        .await;
    let cat_id = cat.data()["process_id"].as_str().unwrap().to_owned();
    let rz = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{cat_id}/resize"),
            json!({"rows": 10, "cols": 20}),
        )
        .await;
    assert_eq!(rz.status, 400, "resize is for PTYs");
    let close = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{cat_id}/stdin/close"),
            json!({}),
        )
        .await;
    assert_eq!(close.data()["ok"], true);
    let w = fx
        .get(&format!(
            "/v1/sandboxes/{id}/processes/{cat_id}/wait?scope=leader&timeout_ms=10000"
        ))
        .await;
    assert_eq!(w.data()["exit_code"], 0, "cat ends at EOF");

    let sleeper = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "sleep", "args": ["30"]}),
        )
        .await;
    let sid = sleeper.data()["process_id"].as_str().unwrap().to_owned();
    let sig = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{sid}/signal"),
            json!({"signal": "SIGTERM"}),
        )
        .await;
    assert_eq!(sig.status, 200);
    let w = fx
        .get(&format!(
            "/v1/sandboxes/{id}/processes/{sid}/wait?scope=leader&timeout_ms=10000"
        ))
        .await;
    assert_eq!(w.data()["signal"], "SIGTERM");
    assert_eq!(w.data()["exit_code"], 143);
    let bad = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{sid}/signal"),
            json!({"signal": "SIGNOPE"}),
        )
        .await;
    assert_eq!(bad.status, 400);
    // A wait that times out returns the still-running process.
    let stubborn = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "sh", "args": ["-c", "trap '' TERM; sleep 30 & wait"]}),
        )
        .await;
    let tid = stubborn.data()["process_id"].as_str().unwrap().to_owned();
    let w = fx
        .get(&format!(
            "/v1/sandboxes/{id}/processes/{tid}/wait?timeout_ms=50"
        ))
        .await;
    assert_eq!(w.data()["leader_exited"], false);
    let d = fx
        .delete(&format!("/v1/sandboxes/{id}/processes/{tid}?grace_ms=100"))
        .await;
    assert_eq!(d.data()["leader_exited"], true);
    assert_eq!(d.data()["tree_exited"], true);
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}/processes/{tid}"))
            .await
            .status,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pty_processes_use_a_terminal() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let p = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "sh", "args": ["-c", "test -t 0 && test -t 1 && echo is-a-tty"], "pty": {"rows": 30, "cols": 100}}),
        )
        .await;
    let pid = p.data()["process_id"].as_str().unwrap().to_owned();
    assert_eq!(p.data()["kind"], "pty");
    let close = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{pid}/stdin/close"),
            json!({}),
        )
        .await;
    assert_eq!(close.status, 400, "PTYs reject stdin/close");
    let rz = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes/{pid}/resize"),
            json!({"rows": 40, "cols": 120}),
        )
        .await;
    assert_eq!(rz.status, 200);
    fx.get(&format!(
        "/v1/sandboxes/{id}/processes/{pid}/wait?scope=tree&timeout_ms=10000"
    ))
    .await
    .data();
    let frames = connect(&fx, &id, &pid, 0).await;
    assert!(decoded(&frames, "pty").contains("is-a-tty"), "{frames:?}");
    assert_eq!(frames.last().unwrap()["exit_code"], 0);
    // A PTY without cmd gets the default shell, which reads its input.
    let sh = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"pty": {}, "cwd": "/workspace"}),
        )
        .await;
    let shid = sh.data()["process_id"].as_str().unwrap().to_owned();
    fx.post(
        &format!("/v1/sandboxes/{id}/processes/{shid}/input"),
        json!({"data_base64": B64.encode("echo from-$((40+2)); exit\n")}),
    )
    .await
    .data();
    fx.get(&format!(
        "/v1/sandboxes/{id}/processes/{shid}/wait?scope=tree&timeout_ms=10000"
    ))
    .await
    .data();
    let frames = connect(&fx, &id, &shid, 0).await;
    assert!(decoded(&frames, "pty").contains("from-42"), "{frames:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_connect_stream_mixes_keep_alive_comments_and_data_lines() {
    let fx = Fx::with(FakeOptions {
        sse: true,
        heartbeat: std::time::Duration::from_millis(50),
        ..fast()
    })
    .await;
    let id = fx.create(json!({})).await;
    let created = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "sh", "args": ["-c", "sleep 0.4; echo late"]}),
        )
        .await;
    let pid = created.data()["process_id"].as_str().unwrap().to_owned();
    let text = fx
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/processes/{pid}/connect?after=0",
            fx.url
        ))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("data: ") || *l == ": keep-alive"),
        "{text}"
    );
    assert!(lines.contains(&": keep-alive"), "{text}");
    let frames = parse_frames(&text);
    assert!(frames.iter().any(|f| f["type"] == "heartbeat"), "{text}");
    assert_eq!(decoded(&frames, "stdout"), "late\n");
    assert_eq!(frames.last().unwrap()["type"], "exit");
}
