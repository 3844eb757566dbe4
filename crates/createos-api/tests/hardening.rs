//! Hardening against hostile or broken servers and settings: `Retry-After` floors, typed
//! redirects, key fragments at cuts, proxies, URLs with credentials, trickling answers and
//! endless pagination.

mod common;

use std::time::{Duration, Instant};

use common::{KEY, bounded, ok};
use createos_api::{Client, ErrorKind, RetryOptions};
use httpmock::prelude::*;
use serde_json::json;

/// Every 8-character window of `secret`; none may appear in text shown to a user.
fn fragments(secret: &str) -> Vec<&str> {
    (0..=secret.len() - 8).map(|i| &secret[i..i + 8]).collect()
}

fn assert_no_fragment(text: &str, secret: &str, context: &str) {
    for f in fragments(secret) {
        assert!(
            !text.contains(f),
            "{context}: key fragment {f:?} leaked in {text}"
        );
    }
}

// ---------------------------------------------------------------- 1. Retry-After floor

#[tokio::test]
async fn retry_after_zero_forever_cannot_shorten_the_backoff() {
    let server = MockServer::start_async().await;
    let limited = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/whoami");
            then.status(429)
                .header("retry-after", "0")
                .json_body(json!({"status": "error", "message": "slow down"}));
        })
        .await;
    let retry = RetryOptions {
        max_retries: 3,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(2),
    };
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .retry(retry)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = bounded(c.whoami()).await.unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    limited.assert_calls_async(4).await; // max_retries + 1, not a tight loop
    // The smallest backoffs are base * 2^n: 100 + 200 + 400 ms.
    assert!(
        elapsed >= Duration::from_millis(700),
        "Retry-After: 0 shortened the backoff: {elapsed:?}"
    );
}

#[tokio::test]
async fn garbage_and_negative_retry_after_fall_back_to_the_backoff() {
    for value in ["soon", "-30", "Wed, 21 Oct 2015 07:28:00 GMT"] {
        let server = MockServer::start_async().await;
        let busy = server
            .mock_async(|when, then| {
                when.method(GET).path("/v1/whoami");
                then.status(503).header("retry-after", value).body("busy");
            })
            .await;
        let c = Client::builder()
            .api_key(KEY)
            .base_url(server.base_url())
            .retry(RetryOptions {
                max_retries: 2,
                base_delay: Duration::from_millis(100),
                max_delay: Duration::from_secs(1),
            })
            .build()
            .unwrap();
        let started = Instant::now();
        bounded(c.whoami()).await.unwrap_err();
        let elapsed = started.elapsed();
        busy.assert_calls_async(3).await;
        assert!(
            elapsed >= Duration::from_millis(300),
            "Retry-After {value:?} shortened the backoff: {elapsed:?}"
        );
    }
}

#[test]
fn retry_delay_is_the_larger_of_backoff_and_a_capped_retry_after() {
    let r = RetryOptions {
        max_retries: 3,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
    };
    for _ in 0..20 {
        assert!(r.delay(0, Some(Duration::ZERO)) >= Duration::from_millis(100));
        assert!(r.delay(2, None) >= Duration::from_millis(400));
        assert_eq!(r.delay(0, Some(Duration::from_secs(5))), Duration::from_secs(5));
        assert_eq!(
            r.delay(0, Some(Duration::from_secs(86_400))),
            createos_api::MAX_RETRY_AFTER
        );
    }
    let long = RetryOptions {
        max_delay: Duration::from_secs(300),
        ..r
    };
    assert_eq!(
        long.delay(0, Some(Duration::from_secs(86_400))),
        Duration::from_secs(300),
        "a longer max_delay raises the Retry-After cap"
    );
    let _ = ok(json!({}));
}

// ---------------------------------------------------------------- 2. typed redirect

#[tokio::test]
async fn a_refused_redirect_is_recognisable_without_reading_the_message() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.path("/v1/whoami");
            then.status(302)
                .header("location", "https://evil.example/steal?token=abc");
        })
        .await;
    server
        .mock_async(|when, then| {
            when.path("/v1/rootfs");
            then.status(308).header("location", "/v1/elsewhere");
        })
        .await;
    // A protocol error whose message happens to say "redirect" is not one.
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes/s1");
            then.status(200)
                .json_body(json!({"status": "weird", "message": "please redirect elsewhere"}));
        })
        .await;
    let c = common::client(&server);
    let cross = c.whoami().await.unwrap_err();
    assert!(cross.is_redirect(), "{cross:?}");
    assert_eq!(cross.kind(), ErrorKind::Protocol);
    let d = cross.redirect_details().unwrap();
    assert_eq!(d.status.map(|s| s.as_u16()), Some(302));
    assert!(d.cross_origin);
    assert!(!format!("{cross:?}").contains("token=abc"));
    let same = c.list_root_file_systems().await.unwrap_err();
    assert!(same.is_redirect());
    assert!(!same.redirect_details().unwrap().cross_origin);
    let worded = c.get_sandbox("s1").await.unwrap_err();
    assert_eq!(worded.kind(), ErrorKind::Protocol);
    assert!(worded.to_string().contains("redirect"), "{worded}");
    assert!(!worded.is_redirect(), "matched a word, not the error: {worded:?}");
}

// ---------------------------------------------------------------- 3. key fragments at cuts

/// A 500-byte text with the key reflected at `offset`.
fn reflected_at(offset: usize) -> String {
    let mut body = "x".repeat(offset);
    body.push_str(KEY);
    body.push_str(&"y".repeat(500 - body.len()));
    body
}

#[tokio::test]
async fn a_key_reflected_across_the_snippet_cut_leaves_no_fragment() {
    let server = MockServer::start_async().await;
    for offset in 150..250 {
        let body = reflected_at(offset);
        server
            .mock_async(|when, then| {
                when.method(GET).path(format!("/v1/sandboxes/o{offset}"));
                then.status(200).body(body);
            })
            .await;
    }
    let c = common::client(&server);
    for offset in 150..250 {
        let err = c.get_sandbox(&format!("o{offset}")).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
        assert!(err.to_string().contains("body starts with"), "{err}");
        assert_no_fragment(&err.to_string(), KEY, &format!("Display, offset {offset}"));
        assert_no_fragment(&format!("{err:?}"), KEY, &format!("Debug, offset {offset}"));
    }
}

#[tokio::test]
async fn a_key_reflected_across_a_stream_frame_cut_leaves_no_fragment() {
    let server = MockServer::start_async().await;
    for offset in 150..250 {
        let body = format!("{{\"stdout\":\"ok\"}}\n{}\n", reflected_at(offset));
        server
            .mock_async(|when, then| {
                when.method(POST).path(format!("/v1/sandboxes/o{offset}/exec"));
                then.status(200).body(body);
            })
            .await;
    }
    let c = common::client(&server);
    for offset in 150..250 {
        let mut events = c
            .sandbox_handle(format!("o{offset}"))
            .stream_command(
                createos_api::RunCommandRequest::new("x"),
                createos_api::ExecOptions::default(),
            )
            .await
            .unwrap();
        use futures::StreamExt;
        assert!(events.next().await.unwrap().is_ok());
        let err = events.next().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("invalid stream frame"), "{err}");
        assert_no_fragment(&err.to_string(), KEY, &format!("Display, offset {offset}"));
        assert_no_fragment(&format!("{err:?}"), KEY, &format!("Debug, offset {offset}"));
    }
}
