//! Against hostile or broken servers and settings: redirects, the key in echoes and cuts,
//! retries only where safe and inside their budget, plain http, escaping and bounds.

mod common;

use std::time::{Duration, Instant};

use common::{KEY, RawServer, SB, Step, assert_no_key, client, client_for, fast_retry};
use httpmock::prelude::*;
use opensandbox_api::{Client, CreateSandbox, ErrorKind, RetryPolicy};
use serde_json::json;

#[tokio::test]
async fn redirects_are_refused_and_never_followed() {
    let server = MockServer::start_async().await;
    let elsewhere = MockServer::start_async().await;
    let target = elsewhere
        .mock_async(|when, then| {
            when.any_request();
            then.status(200).json_body(json!({"id": "stolen"}));
        })
        .await;
    let location = format!("{}/v1/sandboxes/sb-1", elsewhere.base_url());
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(302).header("location", &location);
        })
        .await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(307).header("location", &location);
        })
        .await;
    let c = client(&server);
    let err = c.get_sandbox(SB).await.unwrap_err();
    assert!(err.is_redirect(), "{err}");
    assert_eq!(err.kind(), ErrorKind::Protocol);
    let err = c
        .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
        .await
        .unwrap_err();
    assert!(err.is_redirect());
    create.assert_calls_async(1).await;
    target.assert_calls_async(0).await;
}

#[tokio::test]
async fn an_echoed_key_never_reaches_an_error_or_debug() {
    let server = MockServer::start_async().await;
    let echo = format!("bad key {KEY} (header OPEN-SANDBOX-API-KEY: {KEY})");
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/echo");
            then.status(401)
                .header("x-request-id", format!("rid-{KEY}"))
                .json_body(json!({"code": format!("E_{KEY}"), "message": echo}));
        })
        .await;
    // A body longer than what is read of it, cut inside an echoed key.
    let cut_at = 64 * 1024;
    let mut long = "x".repeat(cut_at - 10);
    long.push_str(KEY);
    long.push_str(&"y".repeat(1000));
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/long");
            then.status(400).body(&long);
        })
        .await;
    // JSON-escaped in a decoding failure.
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/garbled");
            then.status(200).body(format!("{{\"id\": \"{KEY}\", oops"));
        })
        .await;
    let c = client(&server);
    for id in ["echo", "long", "garbled"] {
        let err = c.get_sandbox(id).await.unwrap_err();
        assert_no_key(&format!("{err}"));
        assert_no_key(&format!("{err:?}"));
        if let Some(api) = err.as_api() {
            assert_no_key(&api.snippet);
            assert_no_key(&api.request_id);
            assert_no_key(&api.code);
        }
    }
    let err = c.get_sandbox("long").await.unwrap_err();
    assert!(err.as_api().unwrap().body_truncated);
    assert!(
        err.as_api().unwrap().snippet.chars().count() <= opensandbox_api::MAX_SNIPPET_CHARS + 1
    );
    assert_no_key(&format!("{c:?}"));
    assert_no_key(&format!(
        "{:?}",
        Client::builder().api_key(KEY).domain("localhost:1")
    ));
}

#[tokio::test]
async fn transport_errors_show_no_key() {
    // Nothing listens on port 9 of loopback.
    let c = client_for("http://127.0.0.1:9");
    let err = c.get_sandbox(SB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport, "{err}");
    assert_no_key(&format!("{err} {err:?}"));
}

#[tokio::test]
async fn reads_are_repeated_on_5xx_and_dropped_connections_but_creates_never() {
    let server = MockServer::start_async().await;
    let busy = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(503)
                .json_body(json!({"code": "BUSY", "message": "later"}));
        })
        .await;
    busy.up_to_n_times_async(2).await;
    let fine = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(200)
                .json_body(json!({"id": SB, "status": {"state": "Running"}}));
        })
        .await;
    let bad = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/bad-request");
            then.status(400)
                .json_body(json!({"code": "INVALID", "message": "no"}));
        })
        .await;
    let c = client(&server);
    assert_eq!(c.get_sandbox(SB).await.unwrap().id, SB);
    busy.assert_calls_async(2).await;
    fine.assert_calls_async(1).await;
    assert_eq!(
        c.get_sandbox("bad-request").await.unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
    bad.assert_calls_async(1).await;

    // A connection closed before any answer: repeated for a read, not for a create.
    let dropping = RawServer::start(|n| {
        if n == 0 {
            vec![]
        } else {
            vec![Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"id\":\"s\"}\n".to_vec(),
            )]
        }
    })
    .await;
    assert_eq!(dropping.client().get_sandbox("s").await.unwrap().id, "s");
    assert_eq!(dropping.hits(), 2);
    let creating = RawServer::start(|_| vec![]).await;
    let err = creating
        .client()
        .create_sandbox(&CreateSandbox::from_image("img", ["sh"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport, "{err}");
    assert!(
        err.is_retryable(),
        "the caller decides, with find_by_metadata"
    );
    assert_eq!(creating.hits(), 1);
}

#[tokio::test]
async fn retries_stop_at_their_budget() {
    let server = MockServer::start_async().await;
    let busy = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(429)
                .header("retry-after", "1")
                .json_body(json!({"code": "SLOW", "message": "down"}));
        })
        .await;
    let c = Client::builder()
        .domain(server.base_url())
        .api_key(KEY)
        .retry(RetryPolicy {
            max_retries: 10,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(2),
            budget: Duration::from_millis(500),
        })
        .build()
        .unwrap();
    let started = Instant::now();
    let err = c.get_sandbox(SB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(
        err.as_api().unwrap().retry_after,
        Some(Duration::from_secs(1))
    );
    // Retry-After: 1 s does not fit a 500 ms budget: no second attempt.
    busy.assert_calls_async(1).await;
    assert!(started.elapsed() < Duration::from_millis(900));

    let limited = MockServer::start_async().await;
    let m = limited
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(502);
        })
        .await;
    let err = client(&limited).get_sandbox(SB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    m.assert_calls_async(fast_retry().max_retries as usize + 1)
        .await;
}

#[test]
fn plain_http_only_to_loopback_unless_opted_in() {
    let build = |domain: &str, insecure: bool| {
        Client::builder()
            .domain(domain)
            .api_key(KEY)
            .allow_insecure_http(insecure)
            .build()
    };
    for ok in [
        "localhost:8080",
        "127.0.0.1:8080",
        "http://[::1]:8080",
        "https://sb.example.com",
    ] {
        assert!(build(ok, false).is_ok(), "{ok}");
    }
    for refused in [
        "sandbox.internal:8080",
        "http://10.0.0.5:8080",
        "http://a.localhost:8080",
    ] {
        let err = build(refused, false).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        let msg = err.to_string();
        assert!(
            msg.contains("allow_insecure_http") && msg.contains("OPEN_SANDBOX_DOMAIN"),
            "{msg}"
        );
        assert!(build(refused, true).is_ok(), "{refused} with the opt-in");
    }
    let err = build("https://user:pw@sb.example.com", false).unwrap_err();
    assert!(!err.to_string().contains("pw@"), "{err}");
}

#[test]
fn settings_come_from_the_sdk_variables() {
    let c = Client::builder()
        .env_lookup(|name| match name {
            "OPEN_SANDBOX_DOMAIN" => Some("https://sb.example.com:8443/api".into()),
            "OPEN_SANDBOX_API_KEY" => Some(format!("  {KEY}\n")),
            _ => None,
        })
        .build()
        .unwrap();
    assert_eq!(c.base_url(), "https://sb.example.com:8443/api/v1");
    let c = Client::builder()
        .env_lookup(|name| (name == "OPEN_SANDBOX_API_KEY").then(|| KEY.to_owned()))
        .build()
        .unwrap();
    assert_eq!(
        c.base_url(),
        "http://localhost:8080/v1",
        "the SDK's default domain"
    );
    let err = Client::builder()
        .env_lookup(|name| (name == "OPEN_SANDBOX_API_KEY").then(|| "   ".to_owned()))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("OPEN_SANDBOX_API_KEY"), "{err}");
    let err = Client::builder()
        .env_lookup(|_| None)
        .api_key(KEY)
        .timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}

#[tokio::test]
async fn server_text_is_escaped_onto_one_line_and_capped() {
    let server = MockServer::start_async().await;
    let nasty = format!("line1\nline2\r\u{202e}reversed\u{2028}{}", "z".repeat(2000));
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/sb-1");
            then.status(500)
                .json_body(json!({"code": "X\nY", "message": nasty}));
        })
        .await;
    let err = Client::builder()
        .domain(server.base_url())
        .api_key(KEY)
        .retry(RetryPolicy::none())
        .build()
        .unwrap()
        .get_sandbox(SB)
        .await
        .unwrap_err();
    let shown = err.to_string();
    assert!(
        !shown.contains(['\n', '\r', '\u{202e}', '\u{2028}']),
        "{shown}"
    );
    assert!(
        shown.contains("line1\\nline2\\r\\u{202e}reversed\\u{2028}"),
        "{shown}"
    );
    let api = err.as_api().unwrap();
    assert_eq!(api.code, "X\\nY");
    assert!(api.message.chars().count() <= opensandbox_api::MAX_SNIPPET_CHARS + 1);
}

#[tokio::test]
async fn an_oversize_json_answer_is_refused() {
    let server = RawServer::start(|_| {
        vec![Step::Write(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                64 << 20
            )
            .into_bytes(),
        )]
    })
    .await;
    let err = server.client().get_sandbox(SB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
}

#[tokio::test]
async fn a_key_cut_by_a_bound_leaves_no_fragment() {
    // An invalid frame is quoted from its first 256 bytes: with two-byte characters first,
    // that cut falls inside an echoed key while the quote is still short enough to show it.
    let frame = format!(
        "{{\"type\":\"stdout\",\"text\":\"{}{KEY} and more",
        "é".repeat(107)
    );
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(common::proxied("/command"));
            then.status(200).body(format!("{frame}\n\n"));
        })
        .await;
    let err = client(&server)
        .execd(SB)
        .run(
            &opensandbox_api::RunCommand::shell("x"),
            opensandbox_api::StreamOptions::default(),
        )
        .await
        .unwrap()
        .collect_output(64)
        .await
        .unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("ééé"), "{shown}");
    // A fixed amount goes at the cut, whatever it holds: no part of the key is left there,
    // and nothing in the quote says whether those bytes were a key's (issue 45).
    assert!(!shown.contains("osk_"), "{shown}");
    assert_no_key(&shown);
}

#[tokio::test]
async fn secret_env_values_are_scrubbed_from_the_errors_of_their_call() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(422).json_body(json!({"detail": [{
                "msg": "bad env", "input": {"env": {"GATEWAY_TOKEN": "gw-credential-4411"}}
            }]}));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST).path(common::proxied("/command"));
            then.status(400)
                .json_body(json!({"code": "INVALID_REQUEST_BODY", "message": "bad envs TOKEN=cmd-credential-8822"}));
        })
        .await;
    let c = client(&server);
    let err = c
        .create_sandbox(
            &CreateSandbox::from_image("img", ["sh"])
                .secret_env("GATEWAY_TOKEN", "gw-credential-4411"),
        )
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("gw-credential") && shown.contains("[REDACTED]"),
        "{shown}"
    );
    let command =
        opensandbox_api::RunCommand::shell("x").secret_env("TOKEN", "cmd-credential-8822");
    let err = c
        .execd(SB)
        .run(&command, opensandbox_api::StreamOptions::default())
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?} {command:?}");
    assert!(
        !shown.contains("cmd-credential") && shown.contains("[REDACTED]"),
        "{shown}"
    );
}
