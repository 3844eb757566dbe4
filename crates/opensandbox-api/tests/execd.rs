//! execd through the proxy: `/ping`, the command stream (both framings, pings, exit codes,
//! the idle clock, the deadline, bounds, dropping), interrupt and status.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{KEY, RawServer, SB, Step, chunk, chunked_head, client, end, proxied};
use futures::StreamExt;
use httpmock::prelude::*;
use opensandbox_api::{ErrorKind, ExecEvent, ExitStatus, FrameLimits, RunCommand, StreamOptions};
use serde_json::json;

const BARE: &str = "{\"type\":\"init\",\"text\":\"cmd-1\",\"timestamp\":1}\n\n\
{\"type\":\"ping\",\"timestamp\":2}\n\n\
{\"type\":\"stdout\",\"text\":\"hello\",\"timestamp\":3}\n\n\
{\"type\":\"stderr\",\"text\":\"warn\",\"timestamp\":4}\n\n\
{\"type\":\"status\",\"text\":\"whatever\"}\n\n\
{\"type\":\"error\",\"error\":{\"ename\":\"CommandExecError\",\"evalue\":\"3\",\"traceback\":[]}}\n\n\
{\"type\":\"execution_complete\",\"execution_time\":42}\n\n";

fn idle(ms: u64) -> StreamOptions {
    StreamOptions {
        idle_timeout: Duration::from_millis(ms),
        ..StreamOptions::default()
    }
}

#[tokio::test]
async fn ping_goes_through_the_proxy_with_the_key() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/ping"))
                .header("open-sandbox-api-key", KEY);
            then.status(200);
        })
        .await;
    client(&server).execd(SB).ping().await.unwrap();
    m.assert_async().await;
}

#[tokio::test]
async fn wait_until_ready_polls_through_502s_and_stops_on_404() {
    let server = MockServer::start_async().await;
    let not_yet = server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/ping"));
            then.status(502)
                .json_body(json!({"code": "BACKEND_CONNECTION_FAILED", "message": "refused"}));
        })
        .await;
    not_yet.up_to_n_times_async(3).await;
    let up = server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/ping"));
            then.status(200);
        })
        .await;
    let gone = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/gone/proxy/44772/ping");
            then.status(404)
                .json_body(json!({"code": "SANDBOX_NOT_FOUND", "message": "no"}));
        })
        .await;
    let c = client(&server);
    c.execd(SB)
        .wait_until_ready(Duration::from_secs(5), Duration::from_millis(5))
        .await
        .unwrap();
    not_yet.assert_calls_async(3).await;
    up.assert_calls_async(1).await;
    let err = c
        .execd("gone")
        .wait_until_ready(Duration::from_secs(5), Duration::from_millis(5))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    gone.assert_calls_async(1).await;
}

#[tokio::test]
async fn wait_until_ready_gives_up_with_the_last_error() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/ping"));
            then.status(502)
                .json_body(json!({"code": "BACKEND_CONNECTION_FAILED", "message": "refused"}));
        })
        .await;
    let err = client(&server)
        .execd(SB)
        .wait_until_ready(Duration::from_millis(200), Duration::from_millis(20))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Wait);
    assert!(
        err.to_string().contains("BACKEND_CONNECTION_FAILED"),
        "{err}"
    );
}

#[tokio::test]
async fn a_command_streams_bare_json_frames_and_derives_the_exit_code() {
    let server = MockServer::start_async().await;
    let run = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(proxied("/command"))
                .header("open-sandbox-api-key", KEY)
                .header("accept", "text/event-stream")
                .json_body(json!({
                    "command": "echo hello; exit 3",
                    "cwd": "/workspace",
                    "timeout": 60000,
                    "envs": {"A": "1"},
                    "background": false
                }));
            then.status(200)
                .header("content-type", "text/event-stream")
                .body(BARE);
        })
        .await;
    let cmd = RunCommand::shell("echo hello; exit 3")
        .cwd("/workspace")
        .timeout(Duration::from_secs(60))
        .env("A", "1");
    let mut stream = client(&server)
        .execd(SB)
        .run(&cmd, StreamOptions::default())
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e.unwrap());
    }
    run.assert_calls_async(1).await;
    assert_eq!(
        events[0],
        ExecEvent::Init {
            command_id: "cmd-1".into()
        }
    );
    assert_eq!(events[1], ExecEvent::Ping);
    assert!(
        matches!(&events[2], ExecEvent::Stdout { text, timestamp: Some(3) } if text == "hello")
    );
    assert!(matches!(&events[3], ExecEvent::Stderr { text, .. } if text == "warn"));
    assert!(matches!(&events[4], ExecEvent::Other { kind, .. } if kind == "status"));
    assert!(
        matches!(&events[5], ExecEvent::Error(e) if e.name == "CommandExecError" && e.value == "3")
    );
    assert_eq!(
        events[6],
        ExecEvent::Complete {
            execution_time_ms: Some(42)
        }
    );
    assert_eq!(stream.exit_status(), ExitStatus::Code(3));
    assert_eq!(stream.command_id(), Some("cmd-1"));
}

#[tokio::test]
async fn standard_sse_reads_the_same_and_collects_output() {
    let server = MockServer::start_async().await;
    let sse = ": hello\r\n\r\nevent: message\r\ndata: {\"type\":\"init\",\"text\":\"cmd-2\"}\r\n\r\n\
data: {\"type\":\"stdout\",\r\ndata: \"text\":\"out\"}\r\n\r\n\
data: {\"type\":\"ping\"}\r\n\r\n\
data: {\"type\":\"execution_complete\",\"execution_time\":7}\r\n\r\n";
    server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/command"));
            then.status(200).body(sse);
        })
        .await;
    let out = client(&server)
        .execd(SB)
        .run(&RunCommand::argv(["true"]), StreamOptions::default())
        .await
        .unwrap()
        .collect_output(1024)
        .await
        .unwrap();
    assert_eq!(out.stdout, "out");
    assert_eq!(out.exit, ExitStatus::Code(0));
    assert_eq!(out.command_id.as_deref(), Some("cmd-2"));
    assert_eq!(out.execution_time_ms, Some(7));
}

#[tokio::test]
async fn collected_lines_keep_their_line_breaks() {
    // execd's log tailer sends a frame per line without its line end (the real server's
    // proxy passes them as they are); chunks that carry their own line ends are kept as sent.
    let frames = [
        ("stdout", "out1"),
        ("stderr", "err1"),
        ("stdout", "out2"),
        ("stdout", "chunk\n"),
        ("stdout", "tail"),
        ("stderr", "err2"),
    ];
    let mut body = String::from("{\"type\":\"init\",\"text\":\"c\"}\n\n");
    for (kind, text) in frames {
        body.push_str(&json!({"type": kind, "text": text}).to_string());
        body.push_str("\n\n");
    }
    body.push_str("{\"type\":\"execution_complete\"}\n\n");
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/command"));
            then.status(200).body(body);
        })
        .await;
    let run = || async {
        client(&server)
            .execd(SB)
            .run(&RunCommand::shell("x"), StreamOptions::default())
            .await
            .unwrap()
    };
    let out = run().await.collect_output(1024).await.unwrap();
    assert_eq!(out.stdout, "out1\nout2\nchunk\ntail");
    assert_eq!(out.stderr, "err1\nerr2");
    assert!(!out.truncated);
    // The separator counts against the cap (both streams together) like any other byte.
    let out = run().await.collect_output(10).await.unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("out1\no", "err1")
    );
    assert!(out.truncated);
}

#[tokio::test]
async fn a_stream_that_ends_early_has_no_exit_code_and_exec_is_never_repeated() {
    let server = MockServer::start_async().await;
    let run = server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/command"));
            then.status(200).body(
                "{\"type\":\"init\",\"text\":\"c\"}\n\n{\"type\":\"stdout\",\"text\":\"x\"}\n\n",
            );
        })
        .await;
    let failing = server
        .mock_async(|when, then| {
            when.method(POST)
                .path("/v1/sandboxes/sick/proxy/44772/command");
            then.status(503)
                .json_body(json!({"code": "X", "message": "busy"}));
        })
        .await;
    let c = client(&server);
    let out = c
        .execd(SB)
        .run(&RunCommand::shell("x"), StreamOptions::default())
        .await
        .unwrap()
        .collect_output(1024)
        .await
        .unwrap();
    assert_eq!(out.exit, ExitStatus::Unknown);
    run.assert_calls_async(1).await;
    let err = c
        .execd("sick")
        .run(&RunCommand::shell("x"), StreamOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    failing.assert_calls_async(1).await;
}

#[tokio::test]
async fn an_exec_into_a_paused_sandbox_ends_with_idle() {
    // A paused sandbox: no answer at all.
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/command"));
            then.status(200).delay(Duration::from_secs(10)).body("");
        })
        .await;
    let started = Instant::now();
    let err = client(&server)
        .execd(SB)
        .run(&RunCommand::shell("sleep 1"), idle(300))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Idle, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_stream_that_stops_sending_frames_ends_with_idle() {
    let server = RawServer::start(|_| {
        vec![
            chunked_head("200 OK", "text/event-stream"),
            chunk(b"{\"type\":\"init\",\"text\":\"c\"}\n\n"),
            chunk(b"{\"type\":\"ping\"}\n\n"),
            Step::Sleep(Duration::from_secs(10)),
        ]
    })
    .await;
    let mut stream = server
        .client()
        .execd(SB)
        .run(&RunCommand::shell("x"), idle(300))
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Ok(ExecEvent::Init { .. }))
    ));
    assert!(matches!(stream.next().await, Some(Ok(ExecEvent::Ping))));
    let started = Instant::now();
    let err = stream.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Idle, "{err}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        stream.next().await.is_none(),
        "the stream ends after an error"
    );
}

#[tokio::test]
async fn pings_keep_a_quiet_command_alive() {
    let server = RawServer::start(|_| {
        let mut steps = vec![
            chunked_head("200 OK", "text/event-stream"),
            chunk(b"{\"type\":\"init\",\"text\":\"c\"}\n\n"),
        ];
        for _ in 0..8 {
            steps.push(Step::Sleep(Duration::from_millis(100)));
            steps.push(chunk(b"{\"type\":\"ping\"}\n\n"));
        }
        steps.push(chunk(b"{\"type\":\"execution_complete\"}\n\n"));
        steps.push(end());
        steps
    })
    .await;
    // 800 ms of silence but for pings, with an idle period of 400 ms.
    let out = server
        .client()
        .execd(SB)
        .run(&RunCommand::shell("sleep 1"), idle(400))
        .await
        .unwrap()
        .collect_output(64)
        .await
        .unwrap();
    assert_eq!(out.exit, ExitStatus::Code(0));
}

#[tokio::test]
async fn frames_cut_into_single_bytes_on_the_wire_decode() {
    let server = RawServer::start(|_| {
        let mut steps = vec![chunked_head("200 OK", "text/event-stream")];
        steps.extend(BARE.as_bytes().iter().map(|b| chunk(&[*b])));
        steps.push(end());
        steps
    })
    .await;
    let out = server
        .client()
        .execd(SB)
        .run(&RunCommand::shell("x"), StreamOptions::default())
        .await
        .unwrap()
        .collect_output(1024)
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("hello", "warn")
    );
    assert_eq!(out.exit, ExitStatus::Code(3));
}

#[tokio::test]
async fn the_deadline_ends_a_lively_stream() {
    let server = RawServer::start(|_| {
        let mut steps = vec![chunked_head("200 OK", "text/event-stream")];
        for _ in 0..100 {
            steps.push(chunk(b"{\"type\":\"ping\"}\n\n"));
            steps.push(Step::Sleep(Duration::from_millis(50)));
        }
        steps
    })
    .await;
    let options = StreamOptions {
        idle_timeout: Duration::from_secs(5),
        deadline: Some(Duration::from_millis(400)),
        ..StreamOptions::default()
    };
    let started = Instant::now();
    let err = server
        .client()
        .execd(SB)
        .run(&RunCommand::shell("x"), options)
        .await
        .unwrap()
        .collect_output(64)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn an_oversize_frame_fails_the_stream() {
    let server = RawServer::start(|_| {
        let big = format!(
            "{{\"type\":\"stdout\",\"text\":\"{}\"}}\n\n",
            "x".repeat(5000)
        );
        vec![
            chunked_head("200 OK", "text/event-stream"),
            chunk(b"{\"type\":\"init\",\"text\":\"c\"}\n\n"),
            chunk(big.as_bytes()),
            end(),
        ]
    })
    .await;
    let options = StreamOptions {
        limits: FrameLimits {
            max_line: 4096,
            max_frame: 4096,
        },
        ..StreamOptions::default()
    };
    let mut stream = server
        .client()
        .execd(SB)
        .run(&RunCommand::shell("x"), options)
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Ok(ExecEvent::Init { .. }))
    ));
    let err = stream.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
}

#[tokio::test]
async fn a_frame_that_is_not_json_is_a_protocol_error_without_the_key() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/command"));
            then.status(200)
                .body(format!("{{\"type\":\"stdout\",\"text\":{KEY}}}\n\n"));
        })
        .await;
    let err = client(&server)
        .execd(SB)
        .run(&RunCommand::shell("x"), StreamOptions::default())
        .await
        .unwrap()
        .collect_output(64)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    common::assert_no_key(&format!("{err} {err:?}"));
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    let server = RawServer::start(|_| {
        let mut steps = vec![
            chunked_head("200 OK", "text/event-stream"),
            chunk(b"{\"type\":\"init\",\"text\":\"c\"}\n\n"),
        ];
        for _ in 0..200 {
            steps.push(Step::Sleep(Duration::from_millis(20)));
            steps.push(chunk(b"{\"type\":\"ping\"}\n\n"));
        }
        steps
    })
    .await;
    let mut stream = server
        .client()
        .execd(SB)
        .run(&RunCommand::shell("sleep 100"), StreamOptions::default())
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Ok(ExecEvent::Init { .. }))
    ));
    drop(stream);
    let started = Instant::now();
    while server.hung_up.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the server kept writing to a dropped stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn interrupt_and_status() {
    let server = MockServer::start_async().await;
    let interrupt = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(proxied("/command"))
                .query_param("id", "cmd-1")
                .header("open-sandbox-api-key", KEY);
            then.status(200);
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/command/status/cmd-1"));
            then.status(200).json_body(json!({
                "id": "cmd-1", "content": "sleep 9", "running": false, "exit_code": 137,
                "started_at": "2026-12-04T10:00:00Z", "finished_at": null, "pid": 12
            }));
        })
        .await;
    let execd = client(&server).execd(SB);
    execd.interrupt("cmd-1").await.unwrap();
    interrupt.assert_async().await;
    let status = execd.command_status("cmd-1").await.unwrap();
    assert!(!status.running);
    assert_eq!(status.exit_code, Some(137));
    assert_eq!(status.finished_at, None);
    assert_eq!(status.extra["pid"], json!(12));
}
