//! The managed-process example, and the process API's edge cases, against the fake.

#![allow(dead_code)]

mod common;

use common::fake::{bounded, start};
#[path = "../examples/managed_process.rs"]
mod managed_process;

use std::time::Duration;

use createos_api::{
    Client, CreateSandboxRequest, ErrorKind, ManagedProcessCreateRequest,
    ManagedProcessDeleteOptions, ManagedProcessSignal, ManagedProcessWaitOptions,
    ManagedProcessWaitScope, ProcessEvent, ProcessKind, ProcessState, ProcessStreamKind, PtySize,
    Sandbox,
};
use createos_fake::FakeOptions;
use futures::StreamExt as _;

async fn sandbox(client: &Client) -> Sandbox {
    client
        .create_sandbox(
            CreateSandboxRequest::new("s-1vcpu-1gb").env(managed_process::OVERRIDE_KEY, "x"),
        )
        .await
        .unwrap()
}

fn tree_wait() -> ManagedProcessWaitOptions {
    ManagedProcessWaitOptions {
        scope: Some(ManagedProcessWaitScope::Tree),
        timeout: Some(Duration::from_secs(20)),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_lifecycle_in_ndjson_and_sse() {
    for sse in [false, true] {
        let (server, client) = start(FakeOptions {
            sse,
            ..FakeOptions::default()
        })
        .await;
        let outcome = bounded(managed_process::run(&client)).await.unwrap();

        // Env override: the per-process value wins over the one declared at create.
        let env_text = outcome.env_output.text();
        assert!(
            env_text.contains("override=set-per-process\n"),
            "sse={sse}: {env_text:?}"
        );
        assert!(outcome.env_output.exited);
        assert_eq!(outcome.env_output.exit_code, Some(0));
        let seqs = &outcome.env_output.seqs;
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "seq must increase: {seqs:?}"
        );

        // Stdin echo.
        assert_eq!(outcome.echo_output.text(), "hello through stdin\n");
        assert_eq!(outcome.echo_output.exit_code, Some(0));

        // Replay from last_seq - 1 yields exactly the last data frame, then exit.
        let last = *seqs.last().unwrap();
        assert_eq!(outcome.replayed.seqs, vec![last]);
        assert!(outcome.replayed.exited);
        assert!(env_text.ends_with(&outcome.replayed.text()));

        // PTY.
        assert_eq!(outcome.pty.kind, ProcessKind::Pty);

        // Tree termination: the grace period ran out and the whole tree is gone.
        assert!(outcome.terminated.leader_exited, "{:?}", outcome.terminated);
        assert!(outcome.terminated.tree_exited, "{:?}", outcome.terminated);
        assert_eq!(server.stats().live, 0);
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_and_stderr_stay_separate_and_pty_output_is_on_the_pty_stream() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let sb = sandbox(&client).await;
        let procs = sb.processes();
        let p = procs
            .create(&ManagedProcessCreateRequest::command(
                "sh",
                ["-c", "echo out; echo err >&2; exit 3"],
            ))
            .await
            .unwrap();
        procs.wait(&p.process_id, tree_wait()).await.unwrap();
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut exit = None;
        let mut stream = procs.connect(&p.process_id, 0).await.unwrap();
        while let Some(event) = stream.next().await {
            match event.unwrap() {
                ProcessEvent::Data {
                    stream: ProcessStreamKind::Stdout,
                    data,
                    ..
                } => out.extend_from_slice(&data),
                ProcessEvent::Data {
                    stream: ProcessStreamKind::Stderr,
                    data,
                    ..
                } => err.extend_from_slice(&data),
                ProcessEvent::Exit { exit_code, .. } => {
                    exit = exit_code;
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(out, b"out\n");
        assert_eq!(err, b"err\n");
        assert_eq!(exit, Some(3));
        let done = procs.get(&p.process_id).await.unwrap();
        assert_eq!(done.state, ProcessState::Exited);
        assert_eq!(done.exit_code, Some(3));

        let pty = procs
            .create(
                &ManagedProcessCreateRequest::command(
                    "sh",
                    ["-c", "printf 'tty:'; test -t 1 && echo yes"],
                )
                .pty(PtySize::default()),
            )
            .await
            .unwrap();
        procs.wait(&pty.process_id, tree_wait()).await.unwrap();
        let mut text = Vec::new();
        let mut stream = procs.connect(&pty.process_id, 0).await.unwrap();
        while let Some(event) = stream.next().await {
            match event.unwrap() {
                ProcessEvent::Data { stream, data, .. } => {
                    assert_eq!(stream, ProcessStreamKind::Pty);
                    text.extend_from_slice(&data);
                }
                ProcessEvent::Exit { .. } => break,
                _ => {}
            }
        }
        let text = String::from_utf8_lossy(&text);
        assert!(text.contains("tty:yes"), "{text:?}");
        sb.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn follow_streams_live_output_and_list_input_signal_work() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let sb = sandbox(&client).await;
        let procs = sb.processes();
        let p = procs
            .create(&ManagedProcessCreateRequest::command(
                "sh",
                ["-c", "while read line; do echo \"got $line\"; done"],
            ))
            .await
            .unwrap();
        assert!(
            procs
                .list()
                .await
                .unwrap()
                .iter()
                .any(|x| x.process_id == p.process_id)
        );
        let mut follow = procs.follow(&p.process_id, 0);
        let first = procs.input(&p.process_id, "one\n").await.unwrap();
        let second = procs.input_bytes(&p.process_id, b"two\n").await.unwrap();
        assert!(
            second > first,
            "input_seq must increase: {first} then {second}"
        );
        let mut text = String::new();
        while !text.contains("got two\n") {
            match follow.next().await.unwrap().unwrap() {
                ProcessEvent::Data { data, .. } => text.push_str(&String::from_utf8_lossy(&data)),
                ProcessEvent::Heartbeat => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(text, "got one\ngot two\n");
        procs
            .signal(&p.process_id, ManagedProcessSignal::Kill)
            .await
            .unwrap();
        loop {
            match follow.next().await {
                Some(Ok(ProcessEvent::Exit { signal, .. })) => {
                    assert!(signal.is_some_and(|s| s.contains("KILL")));
                    break;
                }
                Some(Ok(_)) => {}
                other => panic!("expected the exit frame, got {other:?}"),
            }
        }
        assert!(follow.next().await.is_none(), "follow ends after exit");
        sb.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pipe_and_pty_reject_each_others_operations() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let sb = sandbox(&client).await;
        let procs = sb.processes();
        let pipe = procs
            .create(&ManagedProcessCreateRequest::command("sleep", ["30"]))
            .await
            .unwrap();
        let err = procs
            .resize(&pipe.process_id, PtySize::new(10, 10))
            .await
            .unwrap_err();
        assert!(
            err.as_api().is_some_and(|a| a.status.is_client_error()),
            "{err}"
        );
        let pty = procs
            .create(&ManagedProcessCreateRequest::shell_pty(PtySize::new(
                24, 80,
            )))
            .await
            .unwrap();
        let err = procs.close_stdin(&pty.process_id).await.unwrap_err();
        assert!(
            err.as_api().is_some_and(|a| a.status.is_client_error()),
            "{err}"
        );
        for pid in [&pipe.process_id, &pty.process_id] {
            let gone = procs
                .delete(
                    pid,
                    ManagedProcessDeleteOptions {
                        grace: Some(Duration::from_millis(100)),
                    },
                )
                .await
                .unwrap();
            assert!(gone.tree_exited, "{gone:?}");
        }
        let err = procs.get(&pipe.process_id).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        sb.destroy().await.unwrap();
    })
    .await;
    server.shutdown().await;
}
