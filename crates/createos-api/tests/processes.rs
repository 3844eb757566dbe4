//! Managed processes: exact requests, typed results, and the connect stream decoder.

mod common;

use std::time::Duration;

use common::{KEY, bounded, client, ok};
use createos_api::{
    Error, ErrorKind, ManagedProcessCreateRequest, ManagedProcessDeleteOptions,
    ManagedProcessSignal, ManagedProcessWaitOptions, ManagedProcessWaitScope, ProcessEvent,
    ProcessFollowOptions, ProcessKind, ProcessState, ProcessStreamKind, PtySize,
};
use futures::StreamExt as _;
use httpmock::prelude::*;
use serde_json::{Value, json};

const BASE: &str = "/v1/sandboxes/sb-1/processes";

fn process_json(id: &str, kind: &str, state: &str) -> Value {
    json!({
        "process_id": id, "kind": kind, "pid": 4242, "state": state,
        "leader_exited": false, "tree_exited": false, "created_at": "2026-11-29T10:00:00Z",
        "cmd": "sh", "args": ["-c", "echo hi"], "cwd": "/root",
        "output": {"oldest_seq": 1, "newest_seq": 3, "bytes": 12}
    })
}

/// Matches when the request's query is exactly `pairs`, in order.
fn exact_query(
    pairs: &[(&str, &str)],
) -> impl Fn(&httpmock::HttpMockRequest) -> bool + Send + Sync + 'static {
    let want: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |req| req.query_params() == want
}

#[tokio::test]
async fn create_pipe_process_sends_omit_empty_body_with_owner_key() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(BASE)
                .header("x-api-key", KEY)
                .header("content-type", "application/json")
                .json_body(json!({
                    "cmd": "sh", "args": ["-c", "echo $DEMO"],
                    "env": {"DEMO": "override"}
                }));
            then.status(200)
                .json_body(ok(process_json("proc-1", "process", "running")));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    let req =
        ManagedProcessCreateRequest::command("sh", ["-c", "echo $DEMO"]).env("DEMO", "override");
    let p = sb.processes().create(&req).await.unwrap();
    m.assert_async().await;
    assert_eq!(p.process_id, "proc-1");
    assert_eq!(p.kind, ProcessKind::Process);
    assert_eq!(p.state, ProcessState::Running);
    assert_eq!(p.pid, 4242);
    assert_eq!(p.output.newest_seq, 3);
}

#[tokio::test]
async fn create_default_pty_serializes_an_empty_pty_object() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(BASE)
                .json_body(json!({"cwd": "/root", "pty": {}}));
            then.status(200)
                .json_body(ok(process_json("pty-1", "pty", "starting")));
        })
        .await;
    let sb = client(&server).sandbox_handle("sb-1");
    let p = sb
        .processes()
        .create(&ManagedProcessCreateRequest::shell_pty(PtySize::default()).cwd("/root"))
        .await
        .unwrap();
    m.assert_async().await;
    assert_eq!(p.kind, ProcessKind::Pty);
}

#[tokio::test]
async fn list_reads_the_processes_key_and_get_decodes_unknown_states() {
    let server = MockServer::start_async().await;
    let list = server
        .mock_async(|when, then| {
            when.method(GET).path(BASE);
            then.status(200).json_body(ok(json!({"processes": [
                process_json("a", "process", "exited"),
                process_json("b", "pty", "hibernating"),
            ]})));
        })
        .await;
    let get = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/p%2Fx"));
            then.status(200)
                .json_body(ok(process_json("p/x", "sidecar", "running")));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let all = procs.list().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].state, ProcessState::Exited);
    assert_eq!(all[1].state, ProcessState::Unknown("hibernating".into()));
    let one = procs.get("p/x").await.unwrap();
    assert_eq!(one.kind, ProcessKind::Unknown("sidecar".into()));
    list.assert_async().await;
    get.assert_async().await;
}

#[tokio::test]
async fn connect_parses_mixed_sse_and_ndjson_frames() {
    let server = MockServer::start_async().await;
    let body = concat!(
        ": keepalive\n",
        "event: output\n",
        "data: {\"type\":\"data\",\"seq\":6,\"stream\":\"stdout\",\"data_base64\":\"aGVsbG8K\"}\n",
        "\n",
        "{\"type\":\"heartbeat\"}\r\n",
        "{\"type\":\"data\",\"seq\":7,\"stream\":\"stderr\",\"data_base64\":\"\"}\n",
        "data: {\"type\":\"exit\",\"exit_code\":3,\"signal\":null}\n",
    );
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{BASE}/proc-1/connect"))
                .is_true(exact_query(&[("after", "5")]))
                .header("x-api-key", KEY);
            then.status(200)
                .header("content-type", "application/x-ndjson")
                .body(body);
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let events: Vec<ProcessEvent> = bounded(async {
        procs
            .connect("proc-1", 5)
            .await
            .unwrap()
            .map(Result::unwrap)
            .collect()
            .await
    })
    .await;
    m.assert_async().await;
    assert_eq!(
        events,
        vec![
            ProcessEvent::Data {
                seq: 6,
                stream: ProcessStreamKind::Stdout,
                data: bytes::Bytes::from_static(b"hello\n"),
            },
            ProcessEvent::Heartbeat,
            ProcessEvent::Data {
                seq: 7,
                stream: ProcessStreamKind::Stderr,
                data: bytes::Bytes::new(),
            },
            ProcessEvent::Exit {
                exit_code: Some(3),
                signal: None,
            },
        ]
    );
}

#[tokio::test]
async fn connect_always_sends_after_zero_and_reports_error_frames() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{BASE}/proc-1/connect"))
                .is_true(exact_query(&[("after", "0")]));
            then.status(200).body(
                "{\"type\":\"error\",\"error\":\"requested output is no longer retained\",\"oldest_available_seq\":40}\n",
            );
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let mut stream = procs.connect("proc-1", 0).await.unwrap();
    let first = bounded(stream.next()).await.unwrap().unwrap();
    assert_eq!(
        first,
        ProcessEvent::Error {
            message: "requested output is no longer retained".into(),
            oldest_available_seq: Some(40),
        }
    );
}

#[tokio::test]
async fn connect_rejects_non_canonical_base64_and_bad_frames() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/bad64/connect"));
            then.status(200).body(
                "{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data_base64\":\"aGVsbG8\"}\n",
            );
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/notype/connect"));
            then.status(200).body("{\"seq\":1}\n");
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/notjson/connect"));
            then.status(200).body("data: [1,2]\n");
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    for pid in ["bad64", "notype", "notjson"] {
        let mut stream = procs.connect(pid, 0).await.unwrap();
        let err = bounded(stream.next()).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol, "{pid}: {err}");
    }
}

#[tokio::test]
async fn connect_to_a_missing_process_is_an_api_error_before_any_frame() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/gone/connect"));
            then.status(404)
                .header("x-request-id", "req-9")
                .json_body(json!({"status": "fail", "data": "process not found"}));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let Err(err) = procs.connect("gone", 0).await else {
        panic!("connect to a missing process must fail");
    };
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.request_id(), Some("req-9"));
    assert!(err.to_string().contains("process not found"), "{err}");
}

#[tokio::test]
async fn input_close_resize_and_signal_send_the_documented_bodies() {
    let server = MockServer::start_async().await;
    let text = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{BASE}/p1/input"))
                .json_body(json!({"data_base64": "cGluZwo="}));
            then.status(200).json_body(ok(json!({"input_seq": 1})));
        })
        .await;
    let raw = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{BASE}/p1/input"))
                .json_body(json!({"data_base64": "AP8Q"}));
            then.status(200).json_body(ok(json!({"input_seq": 2})));
        })
        .await;
    let close = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{BASE}/p1/stdin/close"))
                .body("");
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let resize = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{BASE}/p1/resize"))
                .json_body(json!({"rows": 40, "cols": 120}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let resize_cols = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{BASE}/p1/resize"))
                .json_body(json!({"cols": 90}));
            then.status(200).json_body(ok(Value::Null));
        })
        .await;
    let signal = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(format!("{BASE}/p1/signal"))
                .json_body(json!({"signal": "SIGUSR2"}));
            then.status(200).json_body(ok(json!({"ok": true})));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    assert_eq!(procs.input("p1", "ping\n").await.unwrap(), 1);
    assert_eq!(procs.input_bytes("p1", &[0, 255, 16]).await.unwrap(), 2);
    procs.close_stdin("p1").await.unwrap();
    procs.resize("p1", PtySize::new(40, 120)).await.unwrap();
    procs.resize("p1", PtySize::new(0, 90)).await.unwrap();
    procs
        .signal("p1", ManagedProcessSignal::Usr2)
        .await
        .unwrap();
    for m in [&text, &raw, &close, &resize, &resize_cols, &signal] {
        m.assert_async().await;
    }
}

#[tokio::test]
async fn a_conflict_on_resize_surfaces_as_an_api_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(format!("{BASE}/p1/resize"));
            then.status(409).json_body(json!({
                "status": "error", "message": "resize is only supported for pty processes", "code": 7
            }));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let err = procs.resize("p1", PtySize::new(1, 1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    let api = err.as_api().unwrap();
    assert_eq!(api.code, 7);
    assert_eq!(api.message, "resize is only supported for pty processes");
}

#[tokio::test]
async fn wait_and_delete_convert_durations_to_milliseconds() {
    let server = MockServer::start_async().await;
    let wait = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{BASE}/p1/wait"))
                .is_true(exact_query(&[("scope", "tree"), ("timeout_ms", "30000")]));
            then.status(200).json_body(ok(json!({
                "process_id": "p1", "state": "exited", "leader_exited": true,
                "tree_exited": true, "exit_code": 0
            })));
        })
        .await;
    let bare_wait = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{BASE}/p2/wait"))
                .is_true(exact_query(&[]));
            then.status(200)
                .json_body(ok(process_json("p2", "process", "running")));
        })
        .await;
    let delete = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(format!("{BASE}/p1"))
                .is_true(exact_query(&[("grace_ms", "2500")]));
            then.status(200).json_body(ok(json!({
                "process_id": "p1", "state": "exited", "leader_exited": true,
                "tree_exited": true, "signal": "SIGTERM"
            })));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let done = procs
        .wait(
            "p1",
            ManagedProcessWaitOptions {
                scope: Some(ManagedProcessWaitScope::Tree),
                timeout: Some(Duration::from_secs(30)),
            },
        )
        .await
        .unwrap();
    assert!(done.tree_exited && done.leader_exited);
    assert_eq!(done.exit_code, Some(0));
    procs
        .wait("p2", ManagedProcessWaitOptions::default())
        .await
        .unwrap();
    let deleted = procs
        .delete(
            "p1",
            ManagedProcessDeleteOptions {
                grace: Some(Duration::from_millis(2500)),
            },
        )
        .await
        .unwrap();
    assert_eq!(deleted.signal.as_deref(), Some("SIGTERM"));
    wait.assert_async().await;
    bare_wait.assert_async().await;
    delete.assert_async().await;
}

#[tokio::test]
async fn follow_reconnects_from_the_largest_seq_after_a_dropped_connection() {
    let server = MockServer::start_async().await;
    // The first connection delivers seq 1..2 and then ends without an exit frame.
    let first = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{BASE}/p1/connect"))
                .is_true(exact_query(&[("after", "0")]));
            then.status(200).body(concat!(
                "{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data_base64\":\"YQ==\"}\n",
                "{\"type\":\"data\",\"seq\":2,\"stream\":\"stdout\",\"data_base64\":\"Yg==\"}\n",
            ));
        })
        .await;
    // The reconnect asks for seq > 2; the server repeats seq 2 (must be skipped), then 3.
    let second = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("{BASE}/p1/connect"))
                .is_true(exact_query(&[("after", "2")]));
            then.status(200).body(concat!(
                "{\"type\":\"data\",\"seq\":2,\"stream\":\"stdout\",\"data_base64\":\"Yg==\"}\n",
                "{\"type\":\"data\",\"seq\":3,\"stream\":\"stdout\",\"data_base64\":\"Yw==\"}\n",
                "{\"type\":\"exit\",\"exit_code\":0}\n",
                "{\"type\":\"data\",\"seq\":4,\"stream\":\"stdout\",\"data_base64\":\"ZA==\"}\n",
            ));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let opts = ProcessFollowOptions {
        max_reconnects: 2,
        reconnect_delay: Duration::from_millis(1),
    };
    let events: Vec<ProcessEvent> = bounded(
        procs
            .follow_with("p1", 0, opts)
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
    )
    .await;
    let mut text = Vec::new();
    let mut seqs = Vec::new();
    for e in &events {
        if let ProcessEvent::Data { seq, data, .. } = e {
            seqs.push(*seq);
            text.extend_from_slice(data);
        }
    }
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(text, b"abc");
    assert_eq!(
        events.last(),
        Some(&ProcessEvent::Exit {
            exit_code: Some(0),
            signal: None
        }),
        "nothing after the exit frame"
    );
    first.assert_calls_async(1).await;
    second.assert_calls_async(1).await;
}

#[tokio::test]
async fn follow_gives_up_after_max_reconnects_and_does_not_reconnect_on_api_errors() {
    let server = MockServer::start_async().await;
    let empty = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/quiet/connect"));
            then.status(200).body("");
        })
        .await;
    let missing = server
        .mock_async(|when, then| {
            when.method(GET).path(format!("{BASE}/gone/connect"));
            then.status(404)
                .json_body(json!({"status": "fail", "data": "no such process"}));
        })
        .await;
    let procs = client(&server).sandbox_handle("sb-1").processes();
    let opts = ProcessFollowOptions {
        max_reconnects: 2,
        reconnect_delay: Duration::from_millis(1),
    };
    let results: Vec<_> = bounded(procs.follow_with("quiet", 0, opts).collect::<Vec<_>>()).await;
    assert_eq!(results.len(), 1);
    assert!(matches!(results[0], Err(Error::Protocol { .. })));
    empty.assert_calls_async(3).await;

    let results: Vec<_> = bounded(procs.follow_with("gone", 0, opts).collect::<Vec<_>>()).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].as_ref().unwrap_err().kind(), ErrorKind::NotFound);
    missing.assert_calls_async(1).await;
}
