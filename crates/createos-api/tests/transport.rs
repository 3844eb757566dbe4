//! Transport behaviour: credentials, JSend decoding, errors, redirects, retries.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, client_for, fast_retry, ok};
use createos_api::{
    Client, Error, ErrorKind, HeaderMap, HeaderValue, RequestOptions, RetryOptions,
};
use futures::{StreamExt, TryStreamExt};
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn whoami_sends_the_key_accept_and_user_agent() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/whoami")
                .header("x-api-key", KEY)
                .header("accept", "application/json")
                .header_prefix("user-agent", "createos-rust/");
            then.status(200).json_body(ok(json!({
                "user_id": "u_1", "stats": {"running": 2, "paused": 1, "other": 0, "total": 3}
            })));
        })
        .await;
    let me = client(&server).whoami().await.unwrap();
    m.assert_async().await;
    assert_eq!(me.user_id, "u_1");
    assert_eq!(
        (me.stats.running, me.stats.paused, me.stats.total),
        (2, 1, 3)
    );
}

#[tokio::test]
async fn health_sends_no_key_but_whoami_does() {
    let server = MockServer::start_async().await;
    let health = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/healthz")
                .header_missing("x-api-key");
            then.status(200).json_body(ok(json!({"up": true})));
        })
        .await;
    assert!(client(&server).health().await.unwrap().up);
    health.assert_async().await;
}

#[tokio::test]
async fn missing_key_fails_before_any_request() {
    let server = MockServer::start_async().await;
    let any = server
        .mock_async(|when, then| {
            when.any_request();
            then.status(200).json_body(ok(json!({})));
        })
        .await;
    let c = Client::builder()
        .base_url(server.base_url())
        .build()
        .unwrap();
    assert!(!c.has_api_key());
    let err = c.whoami().await.unwrap_err();
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Auth);
    assert_eq!(any.calls_async().await, 0);
}

#[tokio::test]
async fn caller_credential_headers_are_stripped() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/whoami")
                .header("x-api-key", KEY)
                .is_true(|req| req.headers().get_all("x-api-key").iter().count() == 1)
                .header_missing("authorization")
                .header_missing("proxy-authorization")
                .header_missing("cookie")
                .header_missing("x-csrf-token")
                .header_missing("x-auth-token");
            then.status(200).json_body(ok(json!({"user_id": "u"})));
        })
        .await;
    let mut headers = HeaderMap::new();
    for (k, v) in [
        ("authorization", "Bearer other"),
        ("proxy-authorization", "Basic abc"),
        ("x-api-key", "foreign-key"),
        ("x-auth-token", "t"),
        ("cookie", "session=1"),
        ("x-csrf-token", "c"),
        ("x-trace", "kept"),
    ] {
        headers.insert(k, HeaderValue::from_static(v));
    }
    let c = client(&server);
    let opts = RequestOptions {
        headers,
        ..RequestOptions::default()
    };
    // whoami takes no options: the plain case. list_sandboxes carries caller headers.
    c.whoami().await.unwrap();
    m.assert_async().await;

    let list = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .header("x-api-key", KEY)
                .is_true(|req| req.headers().get_all("x-api-key").iter().count() == 1)
                .header_missing("authorization")
                .header_missing("cookie")
                .header("x-trace", "kept");
            then.status(200).json_body(ok(json!([])));
        })
        .await;
    let rows: Vec<_> = c
        .list_sandboxes(createos_api::ListSandboxesOptions {
            request: opts,
            ..Default::default()
        })
        .try_collect()
        .await
        .unwrap();
    assert!(rows.is_empty());
    list.assert_async().await;
}

#[tokio::test]
async fn injected_clients_that_could_leak_are_refused() {
    let follows = reqwest::Client::new();
    let err = Client::builder()
        .api_key(KEY)
        .base_url("https://x.test")
        .http_client(follows)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("redirect")),
        "{err}"
    );

    let mut defaults = reqwest::header::HeaderMap::new();
    defaults.insert("authorization", HeaderValue::from_static("Bearer leaked"));
    let with_auth = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(defaults)
        .build()
        .unwrap();
    let err = Client::builder()
        .api_key(KEY)
        .base_url("https://x.test")
        .http_client(with_auth)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("authorization")),
        "{err}"
    );
    assert!(!err.to_string().contains("leaked"));
}

#[tokio::test]
async fn a_safe_injected_client_is_used() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/whoami")
                .header("x-api-key", KEY)
                .header("x-custom-default", "1");
            then.status(200).json_body(ok(json!({"user_id": "u"})));
        })
        .await;
    let mut defaults = reqwest::header::HeaderMap::new();
    defaults.insert("x-custom-default", HeaderValue::from_static("1"));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(defaults)
        .build()
        .unwrap();
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .http_client(http)
        .build()
        .unwrap();
    c.whoami().await.unwrap();
    m.assert_async().await;
}

#[tokio::test]
async fn key_is_never_in_debug_or_display() {
    let c = Client::builder()
        .api_key(KEY)
        .base_url("https://x.test")
        .build()
        .unwrap();
    assert!(!format!("{c:?}").contains(KEY));
    let b = Client::builder().api_key(KEY);
    assert!(!format!("{b:?}").contains(KEY));
    let s = c.sandbox_handle("sb-1");
    assert!(!format!("{s:?}").contains(KEY));
}

#[tokio::test]
async fn plain_http_to_a_remote_host_needs_an_opt_in() {
    let err = Client::builder()
        .api_key(KEY)
        .base_url("http://api.example.test")
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("plain http")),
        "{err}"
    );
    assert!(!err.to_string().contains(KEY));
    Client::builder()
        .api_key(KEY)
        .base_url("http://api.example.test")
        .allow_insecure_http(true)
        .build()
        .unwrap();
    Client::builder()
        .api_key(KEY)
        .base_url("http://localhost:8080")
        .build()
        .unwrap();
    Client::builder()
        .api_key(KEY)
        .base_url("http://[::1]:8080")
        .build()
        .unwrap();
    // Without a key nothing secret can leak, so building is fine.
    Client::builder()
        .base_url("http://api.example.test")
        .build()
        .unwrap();
}

#[tokio::test]
async fn base_url_validation() {
    for bad in [
        "ftp://x.test",
        "https://user:pw@x.test",
        "https://x.test/?a=1",
        "https://x.test/#f",
        "not a url",
    ] {
        let err = Client::builder().base_url(bad).build().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad}");
    }
    let err = Client::builder()
        .api_key("   ")
        .base_url("https://x.test")
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let err = Client::builder()
        .retry(RetryOptions {
            max_retries: 1,
            base_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(1),
        })
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let c = Client::builder()
        .base_url("https://x.test/api/")
        .build()
        .unwrap();
    assert_eq!(c.base_url(), "https://x.test/api");
}

#[tokio::test]
async fn path_prefix_is_kept() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET).path("/api/v1/whoami");
            then.status(200).json_body(ok(json!({"user_id": "u"})));
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.url("/api/"))
        .build()
        .unwrap();
    c.whoami().await.unwrap();
    m.assert_async().await;
}

#[tokio::test]
async fn api_error_is_inspectable() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/missing");
            then.status(404)
                .header("x-request-id", "req-42")
                .json_body(json!({"status": "error", "message": "sandbox not found", "code": 42}));
        })
        .await;
    let err = client(&server).get_sandbox("missing").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.status().map(|s| s.as_u16()), Some(404));
    assert_eq!(err.request_id(), Some("req-42"));
    assert!(!err.is_retryable());
    let api = err.as_api().unwrap();
    assert_eq!(api.code, 42);
    assert_eq!(api.message, "sandbox not found");
    assert_eq!(api.endpoint, "/v1/sandboxes/missing");
    assert_eq!(
        err.to_string(),
        "GET /v1/sandboxes/missing: HTTP 404: sandbox not found"
    );
}

#[tokio::test]
async fn fail_envelopes_render_their_data() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(422).json_body(
                json!({"status": "fail", "data": {"shape": "unknown", "name": "too long"}}),
            );
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/x/access-token");
            then.status(409)
                .json_body(json!({"status": "fail", "data": "token exists"}));
        })
        .await;
    let c = client(&server);
    let err = c
        .create_sandbox(createos_api::CreateSandboxRequest::new("s"))
        .await
        .unwrap_err();
    assert_eq!(
        err.as_api().unwrap().message,
        "name: too long; shape: unknown"
    );
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[tokio::test]
async fn non_json_error_bodies_are_tolerated() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(503).body("no capacity");
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .retry(RetryOptions::none())
        .build()
        .unwrap();
    let err = c
        .create_sandbox(createos_api::CreateSandboxRequest::new("s"))
        .await
        .unwrap_err();
    let api = err.as_api().unwrap();
    assert_eq!(api.code, 0);
    assert_eq!(api.message, "request failed");
    assert_eq!(api.body_text(), "no capacity");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.is_retryable());
}

#[tokio::test]
async fn malformed_success_bodies_are_protocol_errors() {
    let server = MockServer::start_async().await;
    let cases = [
        ("/v1/whoami", "not json"),
        ("/v1/rootfs", "[1,2]"),
        ("/healthz", r#"{"data": {"up": true}}"#),
        ("/v1/shapes", r#"{"status": "fail", "message": "odd"}"#),
    ];
    for (path, body) in cases {
        server
            .mock_async(|when, then| {
                when.path(path);
                then.status(200).body(body);
            })
            .await;
    }
    let c = client(&server);
    for err in [
        c.whoami().await.unwrap_err(),
        c.list_root_file_systems().await.unwrap_err(),
        c.health().await.unwrap_err(),
        c.list_shapes().await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    }
}

#[tokio::test]
async fn wrong_types_in_data_are_protocol_errors_not_panics() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes/s1");
            then.status(200).json_body(ok(json!({"id": "s1"})));
        })
        .await;
    let err = client(&server).get_sandbox("s1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(err.to_string().contains("status"), "{err}");
}

#[tokio::test]
async fn redirects_are_refused() {
    let server = MockServer::start_async().await;
    let cross = server
        .mock_async(|when, then| {
            when.path("/v1/whoami");
            then.status(302)
                .header("location", "https://evil.example/steal");
        })
        .await;
    let same = server
        .mock_async(|when, then| {
            when.path("/v1/rootfs");
            then.status(307).header("location", "/v1/elsewhere");
        })
        .await;
    let target = server
        .mock_async(|when, then| {
            when.path("/v1/elsewhere");
            then.status(200).json_body(ok(json!({})));
        })
        .await;
    let c = client(&server);
    let err = c.whoami().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("refusing redirect to non-base origin"),
        "{err}"
    );
    let err = c.list_root_file_systems().await.unwrap_err();
    assert!(
        err.to_string().contains("unexpected redirect response"),
        "{err}"
    );
    cross.assert_calls_async(1).await;
    same.assert_calls_async(1).await;
    target.assert_calls_async(0).await;
}

#[tokio::test]
async fn a_reflected_key_is_redacted_everywhere() {
    let server = MockServer::start_async().await;
    let reflected = format!("invalid key {KEY}");
    server
        .mock_async(|when, then| {
            when.path("/v1/whoami");
            then.status(401)
                .header("x-echo", KEY)
                .json_body(json!({"status": "error", "message": reflected, "code": 7}));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes/s1");
            then.status(200)
                .json_body(ok(json!({"id": "s1", "status": "running", "vcpu": KEY})));
        })
        .await;
    let c = client(&server);
    let err = c.whoami().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth);
    let api = err.as_api().unwrap();
    for text in [
        err.to_string(),
        format!("{err:?}"),
        api.body_text(),
        api.message.clone(),
        format!("{:?}", api.headers),
    ] {
        assert!(!text.contains(KEY), "leaked in {text}");
    }
    assert!(api.message.contains("[REDACTED]"));
    // A decode error that quotes the offending value must not carry the key either.
    let err = c.get_sandbox("s1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(!err.to_string().contains(KEY), "{err}");
    assert!(!format!("{err:?}").contains(KEY));
}

#[tokio::test]
async fn error_bodies_are_capped_at_4_mib() {
    let server = MockServer::start_async().await;
    let big = vec![b'x'; 8 * 1024 * 1024];
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes/big");
            then.status(404).body(big);
        })
        .await;
    let err = bounded(client(&server).get_sandbox("big"))
        .await
        .unwrap_err();
    let api = err.as_api().unwrap();
    // Read to the cap; the cut then loses a fixed amount (the key's length less one byte),
    // whatever it holds, so no start of a key can remain there.
    assert_eq!(
        api.body.len(),
        createos_api::MAX_ERROR_BODY - (KEY.len() - 1)
    );
    assert_eq!(createos_api::MAX_ERROR_BODY, 4 * 1024 * 1024);
    assert!(api.body_truncated);
    assert_eq!(api.message, "request failed");
}

#[tokio::test]
async fn a_key_cut_by_the_cap_leaves_no_prefix() {
    let server = MockServer::start_async().await;
    let mut body = vec![b'x'; 4 * 1024 * 1024 - 8];
    body.extend_from_slice(KEY.as_bytes());
    body.extend_from_slice(b"tail");
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes/cut");
            then.status(500).body(body);
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .retry(RetryOptions::none())
        .build()
        .unwrap();
    let err = c.get_sandbox("cut").await.unwrap_err();
    let text = err.as_api().unwrap().body_text();
    assert!(!text.contains(&KEY[..8]), "a key prefix survived the cut");
}

#[tokio::test]
async fn status_retries_follow_the_method_rules() {
    let server = MockServer::start_async().await;
    // 429 and 503 are retried for POST.
    let limited = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes");
            then.status(429)
                .header("retry-after", "0")
                .json_body(json!({"status": "error", "message": "slow down"}));
        })
        .await;
    let c = client(&server);
    let err = c
        .create_sandbox(createos_api::CreateSandboxRequest::new("s"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.as_api().unwrap().retry_after, Some(Duration::ZERO));
    limited.assert_calls_async(3).await; // 1 + max_retries(2)

    // 500 is not retried for POST ...
    let post500 = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/a/pause");
            then.status(500)
                .json_body(json!({"status": "error", "message": "boom"}));
        })
        .await;
    c.sandbox_handle("a").pause().await.unwrap_err();
    post500.assert_calls_async(1).await;

    // ... but is for GET, up to the limit.
    let get500 = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/a");
            then.status(502).body("bad gateway");
        })
        .await;
    c.sandbox_handle("a").refresh().await.unwrap_err();
    get500.assert_calls_async(3).await;

    // 404 is never retried.
    let missing = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/b");
            then.status(404)
                .json_body(json!({"status": "fail", "data": "not found"}));
        })
        .await;
    c.sandbox_handle("b").refresh().await.unwrap_err();
    missing.assert_calls_async(1).await;
}

#[tokio::test]
async fn a_retry_that_then_succeeds_returns_the_success() {
    let server = MockServer::start_async().await;
    let failing = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/whoami");
            then.status(503)
                .up_to_n_times(2)
                .header("retry-after", "0")
                .body("busy");
        })
        .await;
    let good = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/whoami");
            then.status(200).json_body(ok(json!({"user_id": "u_ok"})));
        })
        .await;
    assert_eq!(client(&server).whoami().await.unwrap().user_id, "u_ok");
    failing.assert_calls_async(2).await;
    good.assert_calls_async(1).await;
}

#[tokio::test]
async fn retry_after_lengthens_the_backoff_but_never_shortens_it() {
    // The backoff is ~10 ms; the server asks for 1 s once, then answers.
    let server = MockServer::start_async().await;
    let busy = server
        .mock_async(|when, then| {
            when.path("/v1/whoami");
            then.status(503)
                .up_to_n_times(1)
                .header("retry-after", "1")
                .body("busy");
        })
        .await;
    server
        .mock_async(|when, then| {
            when.path("/v1/whoami");
            then.status(200).json_body(ok(json!({"user_id": "u"})));
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .retry(RetryOptions {
            max_retries: 1,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(20),
        })
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    bounded(c.whoami()).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was not honoured ({:?})",
        started.elapsed()
    );
    busy.assert_calls_async(1).await;
}

#[tokio::test]
async fn a_sandbox_handle_can_carry_its_own_retry_policy() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/pause");
            then.status(503).body("busy");
        })
        .await;
    let c = client(&server);
    let handle = c.sandbox_handle("s");
    let once = handle.with_retry(RetryOptions::none()).unwrap();
    assert_eq!(
        bounded(once.pause()).await.unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    m.assert_calls_async(1).await;
    // The original handle keeps the client's policy (2 retries).
    assert_eq!(
        bounded(handle.pause()).await.unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    m.assert_calls_async(4).await;
    let bad = RetryOptions {
        base_delay: Duration::ZERO,
        ..RetryOptions::default()
    };
    assert_eq!(
        handle.with_retry(bad).unwrap_err().kind(),
        ErrorKind::Config
    );
}

#[tokio::test]
async fn disable_retry_and_per_request_retry() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes");
            then.status(503).body("busy");
        })
        .await;
    let c = client(&server);
    let opts = createos_api::ListSandboxesOptions {
        request: RequestOptions {
            disable_retry: true,
            ..RequestOptions::default()
        },
        ..Default::default()
    };
    let first = c.list_sandboxes(opts).next().await.unwrap();
    assert_eq!(first.unwrap_err().kind(), ErrorKind::Unavailable);
    m.assert_calls_async(1).await;

    let opts = createos_api::ListSandboxesOptions {
        request: RequestOptions {
            retry: Some(RetryOptions {
                max_retries: 4,
                ..fast_retry()
            }),
            ..RequestOptions::default()
        },
        ..Default::default()
    };
    c.list_sandboxes(opts).next().await.unwrap().unwrap_err();
    m.assert_calls_async(1 + 5).await;
}

#[tokio::test]
async fn transport_errors_are_retried_for_get_only() {
    // Nothing listens on this port: connection refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let c = Client::builder()
        .api_key(KEY)
        .base_url(format!("http://{addr}"))
        .retry(fast_retry())
        .build()
        .unwrap();
    let err = c.whoami().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport, "{err:?}");
    assert!(err.is_retryable());
    assert!(!err.to_string().contains(KEY));
}

#[tokio::test]
async fn per_request_timeout_is_applied() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.path("/v1/sandboxes");
            then.status(200)
                .delay(Duration::from_secs(5))
                .json_body(ok(json!([])));
        })
        .await;
    let c = client(&server);
    let opts = createos_api::ListSandboxesOptions {
        request: RequestOptions {
            timeout: Some(Duration::from_millis(200)),
            disable_retry: true,
            ..RequestOptions::default()
        },
        ..Default::default()
    };
    let err = bounded(c.list_sandboxes(opts).next())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err:?}");
    assert!(matches!(err, Error::Timeout { after, .. } if after == Duration::from_millis(200)));
}

#[tokio::test]
async fn with_timeout_applies_to_every_call_of_a_handle() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/sandboxes/s/pause");
            then.status(200)
                .delay(Duration::from_secs(5))
                .json_body(ok(json!({"id": "s", "status": "paused"})));
        })
        .await;
    let c = client(&server);
    let quick = c
        .sandbox_handle("s")
        .with_timeout(Duration::from_millis(200));
    let err = bounded(quick.pause()).await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout { after, .. } if after == Duration::from_millis(200)),
        "{err:?}"
    );
    let err = bounded(
        c.with_timeout(Duration::from_millis(150))
            .sandbox_handle("s")
            .pause(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { after, .. } if after == Duration::from_millis(150)),
        "{err:?}"
    );
    assert_eq!(
        c.with_retry(RetryOptions {
            base_delay: Duration::ZERO,
            ..RetryOptions::default()
        })
        .unwrap_err()
        .kind(),
        ErrorKind::Config
    );
}

#[tokio::test]
async fn json_success_bodies_are_capped_while_reading() {
    // An endless chunked 200: the cap must end the read, not the end of the body.
    let (url, written) = chunked_server(200, vec![vec![b' '; 256 * 1024]], true).await;
    let err = bounded(client_for(&url, Duration::from_secs(15)).whoami())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err:?}");
    assert!(err.to_string().contains("67108864"), "{err}");
    let sent = bounded(written).await.unwrap();
    assert!(sent < 128 << 20, "{sent} bytes sent");
}

#[tokio::test]
async fn a_declared_json_length_over_the_cap_is_refused_before_reading() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 8192];
        let _ = sock.read(&mut buf).await;
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n{")
            .await;
        tokio::time::sleep(Duration::from_secs(15)).await;
    });
    let err = bounded(client_for(&format!("http://{addr}"), Duration::from_secs(10)).whoami())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err:?}");
    assert!(err.to_string().contains("67108864"), "{err}");
}

#[tokio::test]
async fn per_call_retry_options_are_validated_like_the_builder_does() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes");
            then.status(200).json_body(ok(json!([])));
        })
        .await;
    for bad in [
        RetryOptions {
            base_delay: Duration::ZERO,
            ..RetryOptions::default()
        },
        RetryOptions {
            base_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(1),
            ..RetryOptions::default()
        },
    ] {
        let opts = createos_api::ListSandboxesOptions {
            request: RequestOptions {
                retry: Some(bad),
                ..RequestOptions::default()
            },
            ..Default::default()
        };
        let err = client(&server)
            .list_sandboxes(opts)
            .next()
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err:?}");
    }
    m.assert_calls_async(0).await;
}

#[tokio::test]
async fn a_408_is_a_retryable_timeout_kind() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/whoami");
            then.status(408).body("request timeout");
        })
        .await;
    let err = client(&server).whoami().await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(408));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.is_retryable());
    // Retried for a GET, like the other transient statuses.
    m.assert_calls_async(3).await;
}
