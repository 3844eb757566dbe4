//! Exec: buffered, shell, streaming (NDJSON + SSE), `wait_for_port`.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, ok};
use createos_api::{Client, Error, ErrorKind, ExecEvent, ExecOptions, RunCommandRequest};
use futures::{StreamExt, TryStreamExt};
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn run_command_sends_the_exact_body_and_decodes_the_result() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .header("x-api-key", KEY)
                .json_body(json!({"cmd": "sh", "args": ["-c", "echo hi"], "stdin": "in", "env": {"FOO": "override"}}));
            then.status(200).json_body(ok(json!({"result": {"stdout": "hi\n", "stderr": "", "exit_code": 0}, "exec_ms": 12.5})));
        })
        .await;
    let sb = client(&server).sandbox_handle("s");
    let req = RunCommandRequest::new("sh")
        .args(["-c", "echo hi"])
        .env("FOO", "from-request");
    let opts = ExecOptions {
        stdin: Some("in".into()),
        env: Some([("FOO".to_owned(), "override".to_owned())].into()),
        ..ExecOptions::default()
    };
    let out = sb.run_command(req, opts).await.unwrap();
    m.assert_async().await;
    assert_eq!(out.result.stdout, "hi\n");
    assert_eq!(out.result.exit_code, 0);
    assert_eq!(out.exec_ms, Some(12.5));
    assert!(out.success());
}

#[tokio::test]
async fn a_minimal_exec_body_omits_empty_fields_and_nonzero_exit_is_not_an_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .json_body(json!({"cmd": "false"}));
            then.status(200).json_body(ok(
                json!({"result": {"stdout": "", "stderr": "", "exit_code": 1}}),
            ));
        })
        .await;
    let out = client(&server)
        .sandbox_handle("s")
        .run_command(RunCommandRequest::new("false"), ExecOptions::default())
        .await
        .unwrap();
    assert_eq!(out.result.exit_code, 1);
    assert!(!out.success());
}

#[tokio::test]
async fn shell_wraps_in_bash_and_raises_on_failure() {
    let server = MockServer::start_async().await;
    let long_stderr = format!("{}END", "e".repeat(5000));
    server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .json_body(json!({"cmd": "bash", "args": ["-lc", "exit 3"]}));
            then.status(200).json_body(ok(
                json!({"result": {"stdout": "", "stderr": long_stderr, "exit_code": 3}}),
            ));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .json_body(json!({"cmd": "bash", "args": ["-lc", "true"]}));
            then.status(200).json_body(ok(
                json!({"result": {"stdout": "ok", "stderr": "", "exit_code": 0}}),
            ));
        })
        .await;
    let sb = client(&server).sandbox_handle("s");
    assert_eq!(
        sb.shell("true", ExecOptions::default())
            .await
            .unwrap()
            .result
            .stdout,
        "ok"
    );
    let err = sb
        .shell("exit 3", ExecOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CommandFailed);
    let Error::CommandFailed(f) = err else {
        unreachable!()
    };
    assert_eq!(f.exit_code, Some(3));
    assert_eq!(f.stderr_tail.chars().count(), 2000);
    assert!(f.stderr_tail.ends_with("END"));
}

#[tokio::test]
async fn an_agent_error_fails_shell() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/exec");
            then.status(200).json_body(ok(json!({"result": {"stdout": "", "stderr": "", "exit_code": 0, "error": "exec: not found"}})));
        })
        .await;
    let err = client(&server)
        .sandbox_handle("s")
        .shell("x", ExecOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("exec: not found"), "{err}");
}

#[tokio::test]
async fn paused_sandbox_exec_is_a_conflict() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/exec");
            then.status(409).json_body(json!({"status": "error", "message": "sandbox is paused; resume it before accessing files"}));
        })
        .await;
    let err = client(&server)
        .sandbox_handle("s")
        .run_command(RunCommandRequest::new("true"), ExecOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    m.assert_calls_async(1).await;
}

#[tokio::test]
async fn stream_parses_mixed_sse_and_ndjson() {
    let server = MockServer::start_async().await;
    let body = ": keepalive\ndata: {\"stdout\":\"hi\",\"stderr\":\"warn\"}\n{\"exit_code\":0}\n";
    let m = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .query_param("stream", "true")
                .json_body(json!({"cmd": "sh", "args": ["-c", "x"], "stream": true}));
            then.status(200)
                .header("content-type", "text/event-stream")
                .body(body);
        })
        .await;
    let sb = client(&server).sandbox_handle("s");
    let events: Vec<ExecEvent> = sb
        .stream_command(
            RunCommandRequest::new("sh").args(["-c", "x"]),
            ExecOptions::default(),
        )
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    m.assert_async().await;
    assert_eq!(
        events,
        [
            ExecEvent::Stdout { data: "hi".into() },
            ExecEvent::Stderr {
                data: "warn".into()
            },
            ExecEvent::Exit { exit_code: 0 }
        ]
    );
}

#[tokio::test]
async fn stream_frames_expand_in_the_fixed_order_with_every_line_ending() {
    let server = MockServer::start_async().await;
    let body = "event: output\r\nid: 1\r\nretry: 5\rdata:\n\n{\"hb\":true}\r{\"exit_code\":7,\"error\":\"agent\",\"stderr\":\"e\",\"stdout\":\"o\",\"hb\":1}\r\n{\"unrelated\":1}\n  data:   {\"stdout\":\"last\"}  ";
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/exec");
            then.status(200).body(body);
        })
        .await;
    let events: Vec<ExecEvent> = client(&server)
        .sandbox_handle("s")
        .stream_command(RunCommandRequest::new("x"), ExecOptions::default())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        events,
        [
            ExecEvent::Heartbeat,
            ExecEvent::Heartbeat,
            ExecEvent::Stdout { data: "o".into() },
            ExecEvent::Stderr { data: "e".into() },
            ExecEvent::Error {
                message: "agent".into()
            },
            ExecEvent::Exit { exit_code: 7 },
            ExecEvent::Stdout {
                data: "last".into()
            },
        ]
    );
}

#[tokio::test]
async fn a_bad_frame_ends_the_stream_with_a_protocol_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/exec");
            then.status(200).body(format!(
                "{{\"stdout\":\"a\"}}\n[1,2]\n{{\"stdout\":\"b\"}}\nnot json {KEY}\n"
            ));
        })
        .await;
    let mut s = client(&server)
        .sandbox_handle("s")
        .stream_command(RunCommandRequest::new("x"), ExecOptions::default())
        .await
        .unwrap();
    assert_eq!(
        s.next().await.unwrap().unwrap(),
        ExecEvent::Stdout { data: "a".into() }
    );
    let err = s.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(
        s.next().await.is_none(),
        "the stream closes after a protocol error"
    );

    // An invalid line that reflects the key is redacted in the error.
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/t/exec");
            then.status(200).body(format!("not json {KEY}\n"));
        })
        .await;
    let mut s = client(&server)
        .sandbox_handle("t")
        .stream_command(RunCommandRequest::new("x"), ExecOptions::default())
        .await
        .unwrap();
    let err = s.next().await.unwrap().unwrap_err();
    assert!(!err.to_string().contains(KEY), "{err}");
}

#[tokio::test]
async fn stream_errors_before_the_body_are_api_errors_and_not_retried() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/exec");
            then.status(503).body("no capacity");
        })
        .await;
    let err = client(&server)
        .sandbox_handle("s")
        .stream_command(RunCommandRequest::new("x"), ExecOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    m.assert_calls_async(1).await;
}

#[tokio::test]
async fn an_endless_line_is_a_protocol_error_not_unbounded_growth() {
    let chunk = vec![b'x'; 1024 * 1024];
    let (url, written) = chunked_server(200, vec![chunk], true).await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(url)
        .build()
        .unwrap();
    let mut s = bounded(
        c.sandbox_handle("s")
            .stream_command(RunCommandRequest::new("x"), ExecOptions::default()),
    )
    .await
    .unwrap();
    let err = bounded(s.next()).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(err.to_string().contains("longer than"), "{err}");
    drop(s);
    let n = bounded(written).await.unwrap();
    assert!(
        n < 64 * 1024 * 1024,
        "the server kept sending {n} bytes after the error"
    );
}

#[tokio::test]
async fn dropping_a_stream_stops_the_transfer() {
    let frame = b"{\"stdout\":\"tick\"}\n".repeat(1000);
    let (url, written) = chunked_server(200, vec![frame], true).await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(url)
        .build()
        .unwrap();
    let mut s = bounded(
        c.sandbox_handle("s")
            .stream_command(RunCommandRequest::new("x"), ExecOptions::default()),
    )
    .await
    .unwrap();
    assert_eq!(
        bounded(s.next()).await.unwrap().unwrap(),
        ExecEvent::Stdout {
            data: "tick".into()
        }
    );
    drop(s);
    // The server notices the closed connection and stops (bounded, or the test fails).
    let n = bounded(written).await.unwrap();
    assert!(n > 0);
}

#[tokio::test]
async fn projected_events_use_camel_case_aliases() {
    let exit = ExecEvent::Exit { exit_code: 3 };
    assert_eq!(
        serde_json::to_value(&exit).unwrap(),
        json!({"type": "exit", "exitCode": 3})
    );
    let err = ExecEvent::Error {
        message: "m".into(),
    };
    assert_eq!(
        serde_json::to_value(&err).unwrap(),
        json!({"type": "error", "message": "m"})
    );
    let back: ExecEvent = serde_json::from_value(json!({"type": "stdout", "data": "x"})).unwrap();
    assert_eq!(back, ExecEvent::Stdout { data: "x".into() });
    let hb: ExecEvent = serde_json::from_value(json!({"type": "heartbeat"})).unwrap();
    assert_eq!(hb, ExecEvent::Heartbeat);
}

#[tokio::test]
async fn wait_for_port_sends_the_probe_and_maps_failure_to_a_timeout() {
    let server = MockServer::start_async().await;
    let script = "timeout 3 bash -c 'until (echo > /dev/tcp/127.0.0.1/8080) 2>/dev/null; do sleep 0.25; done'";
    let ok_probe = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .json_body(json!({"cmd": "bash", "args": ["-c", script]}));
            then.status(200).json_body(ok(
                json!({"result": {"stdout": "", "stderr": "", "exit_code": 0}}),
            ));
        })
        .await;
    let sb = client(&server).sandbox_handle("s");
    sb.wait_for_port(8080, "127.0.0.1", Duration::from_millis(2500))
        .await
        .unwrap();
    ok_probe.assert_async().await;

    server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/s/exec")
                .body_includes("/9090");
            then.status(200).json_body(ok(
                json!({"result": {"stdout": "", "stderr": "", "exit_code": 124}}),
            ));
        })
        .await;
    let err = sb
        .wait_for_port(9090, "localhost", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OperationTimeout);
    for (port, host) in [
        (0, "127.0.0.1"),
        (80, "a..b"),
        (80, "x; rm -rf /"),
        (80, ""),
    ] {
        assert_eq!(
            sb.wait_for_port(port, host, Duration::from_secs(1))
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        );
    }
}
