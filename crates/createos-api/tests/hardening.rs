//! Hardening against hostile or broken servers and settings: `Retry-After` floors, typed
//! redirects, key fragments at cuts, proxies, URLs with credentials, trickling answers and
//! endless pagination.

mod common;

use std::time::{Duration, Instant};

use common::{KEY, bounded, ok};
use createos_api::{Client, ErrorKind, RetryOptions};
use futures::StreamExt;
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
        assert_eq!(
            r.delay(0, Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
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
    assert!(
        !worded.is_redirect(),
        "matched a word, not the error: {worded:?}"
    );
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
                when.method(POST)
                    .path(format!("/v1/sandboxes/o{offset}/exec"));
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
        assert!(events.next().await.unwrap().is_ok());
        let err = events.next().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("invalid stream frame"), "{err}");
        assert_no_fragment(&err.to_string(), KEY, &format!("Display, offset {offset}"));
        assert_no_fragment(&format!("{err:?}"), KEY, &format!("Debug, offset {offset}"));
    }
}

// ---------------------------------------------------------------- 4. proxies

fn env_map(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> + Send + Sync {
    move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fake_counts_what_reaches_it_as_a_proxy() {
    // The detector the next tests rely on: a client that does send through the fake as a
    // plain-HTTP proxy is seen, key included.
    let proxy = createos_fake::FakeServer::start(createos_fake::FakeOptions::default())
        .await
        .unwrap();
    let http = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(proxy.url()).unwrap())
        .build()
        .unwrap();
    let resp = http
        .get("http://127.0.0.1:9/v1/whoami")
        .header("x-api-key", "leaked")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 502);
    let stats = proxy.stats();
    assert_eq!((stats.proxied_requests, stats.proxied_with_api_key), (1, 1));
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plain_http_base_url_is_never_sent_through_a_proxy() {
    let target = createos_fake::FakeServer::start(createos_fake::FakeOptions::default())
        .await
        .unwrap();
    let proxy = createos_fake::FakeServer::start(createos_fake::FakeOptions::default())
        .await
        .unwrap();
    let p = proxy.url();
    let env = env_map(vec![
        ("HTTP_PROXY", p.clone()),
        ("http_proxy", p.clone()),
        ("ALL_PROXY", p.clone()),
        ("all_proxy", p.clone()),
        ("HTTPS_PROXY", p.clone()),
    ]);
    let c = Client::builder()
        .api_key(target.api_key().to_owned())
        .base_url(target.url())
        .env_lookup(env)
        .build()
        .unwrap();
    assert_eq!(c.proxy(), None);
    bounded(c.whoami()).await.unwrap();
    let seen = proxy.stats();
    assert!(seen.requests.is_empty(), "{seen:?}");
    assert_eq!(
        (
            seen.proxied_requests,
            seen.proxied_with_api_key,
            seen.connect_requests
        ),
        (0, 0, 0)
    );
    assert_eq!(target.stats().requests.get("whoami"), Some(&1));
    target.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_base_url_tunnels_through_https_proxy_and_never_shows_the_key() {
    let proxy = createos_fake::FakeServer::start(createos_fake::FakeOptions::default())
        .await
        .unwrap();
    let with_creds = proxy
        .url()
        .replacen("http://", "http://proxyuser:proxy-pw-secret@", 1);
    for var in ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
        let before = proxy.stats().connect_requests;
        let c = Client::builder()
            .api_key(KEY)
            .base_url("https://127.0.0.1:9")
            .retry(RetryOptions::none())
            .env_lookup(env_map(vec![(var, with_creds.clone())]))
            .build()
            .unwrap();
        let shown = c.proxy().unwrap().to_owned();
        assert!(shown.ends_with(&proxy.addr().to_string()), "{var}: {shown}");
        assert!(!shown.contains("proxy-pw-secret"), "{shown}");
        assert!(!format!("{c:?}").contains("proxy-pw-secret"));
        let err = bounded(c.whoami()).await.unwrap_err();
        assert!(!err.to_string().contains("proxy-pw-secret"), "{err}");
        let seen = proxy.stats();
        assert_eq!(seen.connect_requests, before + 1, "{var}: {seen:?}");
        assert_eq!((seen.proxied_requests, seen.proxied_with_api_key), (0, 0));
        assert!(seen.requests.is_empty(), "{seen:?}");
    }
    // NO_PROXY excludes the host: no proxy at all.
    let c = Client::builder()
        .api_key(KEY)
        .base_url("https://127.0.0.1:9")
        .env_lookup(env_map(vec![
            ("HTTPS_PROXY", proxy.url()),
            ("NO_PROXY", "localhost,127.0.0.0/8".into()),
        ]))
        .build()
        .unwrap();
    assert_eq!(c.proxy(), None);
    proxy.shutdown().await;
}

/// Run only as a child of `process_proxy_variables_never_carry_a_plain_http_request`, with
/// the proxy variables set in its own environment: a client built the ordinary way (no
/// `env_lookup`) calls the target named by `HARDENING_TARGET_URL`.
#[tokio::test]
#[ignore = "child process of process_proxy_variables_never_carry_a_plain_http_request"]
async fn child_plain_http_call_under_process_proxy_variables() {
    let (Ok(url), Ok(key)) = (
        std::env::var("HARDENING_TARGET_URL"),
        std::env::var("HARDENING_TARGET_KEY"),
    ) else {
        return;
    };
    let c = Client::builder()
        .api_key(key)
        .base_url(url)
        .retry(RetryOptions::none())
        .build()
        .unwrap();
    assert_eq!(c.proxy(), None);
    assert!(createos_api::proxy_for(c.base_url()).is_none());
    bounded(c.whoami()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn process_proxy_variables_never_carry_a_plain_http_request() {
    let target = createos_fake::FakeServer::start(createos_fake::FakeOptions::default())
        .await
        .unwrap();
    let proxy = createos_fake::FakeServer::start(createos_fake::FakeOptions::default())
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = tokio::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "child_plain_http_call_under_process_proxy_variables",
            "--nocapture",
        ])
        .env("HARDENING_TARGET_URL", target.url())
        .env("HARDENING_TARGET_KEY", target.api_key())
        .env("HTTP_PROXY", proxy.url())
        .env("http_proxy", proxy.url())
        .env("ALL_PROXY", proxy.url())
        .env("all_proxy", proxy.url())
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env_remove("REQUEST_METHOD")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("child test finished")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = proxy.stats();
    assert_eq!(
        (seen.proxied_requests, seen.proxied_with_api_key),
        (0, 0),
        "{seen:?}"
    );
    assert_eq!(target.stats().requests.get("whoami"), Some(&1));
    target.shutdown().await;
    proxy.shutdown().await;
}

// ---------------------------------------------------------------- 5. URLs with credentials

/// Base URLs whose secret parts (`pw-secret`, `tok-secret`, `frag-secret`) must never show.
const HOSTILE_URLS: [&str; 7] = [
    "https://user:pw-secret@/x",
    "https://user:pw-secret@host.test:99999",
    "https://user:pw-secret@host.test/api",
    "https://host.test/api?token=tok-secret",
    "https://host.test/api#frag-secret",
    "http://u:pw-secret@127.0.0.1:1/?token=tok-secret",
    "https://u:p/w-secret@host.test",
];

#[test]
fn hostile_base_urls_are_refused_without_echoing_their_secrets() {
    for url in HOSTILE_URLS {
        let builder = Client::builder().api_key(KEY).base_url(url);
        let shown = format!("{builder:?}");
        let result = builder.build();
        let mut texts = vec![shown];
        match &result {
            Err(e) => texts.extend([e.to_string(), format!("{e:?}")]),
            Ok(c) => texts.extend([format!("{c:?}"), c.base_url().to_owned()]),
        }
        for text in texts {
            for secret in ["pw-secret", "tok-secret", "frag-secret", "w-secret"] {
                assert!(!text.contains(secret), "{url}: {secret} in {text}");
            }
        }
        assert!(result.is_err(), "{url} was accepted");
    }
    assert_eq!(
        createos_api::redact_url("https://user:pw-secret@host.test:99999/a?token=t"),
        "https://***@host.test:99999/a"
    );
}

#[test]
fn only_localhost_and_loopback_addresses_count_as_loopback_for_plain_http() {
    for ok_url in ["http://localhost:1", "http://127.0.0.2:1", "http://[::1]:1"] {
        Client::builder()
            .api_key(KEY)
            .base_url(ok_url)
            .build()
            .unwrap();
    }
    for bad in [
        "http://evil.localhost:1",
        "http://localhost.evil.test:1",
        "http://10.0.0.1:1",
    ] {
        let e = Client::builder()
            .api_key(KEY)
            .base_url(bad)
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
    }
}

// ---------------------------------------------------------------- 6. trickling upload answers

/// A one-connection HTTP/1.1 server on 127.0.0.1 that reads a whole request (head and a
/// `Content-Length` body), then answers 200 with a 200-byte JSON body: the head at once when
/// `head_at_once`, and every other byte one per 200 ms. Returns its URL.
async fn trickling_server(head_at_once: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok(Ok((mut sock, _))) =
            tokio::time::timeout(Duration::from_secs(30), listener.accept()).await
        else {
            return;
        };
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let head_end = loop {
            if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while seen.len() < head_end + len {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let mut body =
            br#"{"status":"success","data":{"bytes":5,"path":"/workspace/f"},"pad":""#.to_vec();
        body.resize(198, b'x');
        body.extend_from_slice(b"\"}");
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let mut rest = body;
        if head_at_once {
            if sock.write_all(head.as_bytes()).await.is_err() {
                return;
            }
        } else {
            rest = [head.into_bytes(), rest].concat();
        }
        for b in rest {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if sock.write_all(&[b]).await.is_err() {
                return;
            }
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_upload_whose_answer_trickles_times_out() {
    for head_at_once in [true, false] {
        let url = trickling_server(head_at_once).await;
        let c = common::client_for(&url, Duration::from_secs(1));
        let files = c.sandbox_handle("s").files();
        // Without a total deadline the answer takes 40 s; the bound below is far shorter.
        let err = tokio::time::timeout(Duration::from_secs(15), async {
            let stream = futures::stream::iter([Ok::<_, std::io::Error>(
                bytes::Bytes::from_static(b"hello"),
            )]);
            files
                .upload("/workspace/f", createos_api::UploadBody::stream(stream))
                .await
        })
        .await
        .expect("a trickling answer held the upload past its timeout")
        .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Timeout,
            "head at once {head_at_once}: {err:?}"
        );
    }
}

// ---------------------------------------------------------------- 7. pagination ends

fn row(i: u64) -> serde_json::Value {
    json!({"id": format!("sb-{i}"), "status": "running"})
}

#[tokio::test]
async fn a_total_that_is_never_reached_does_not_keep_a_list_going() {
    use futures::TryStreamExt;
    let server = MockServer::start_async().await;
    // Empty pages with a huge total.
    let empty = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("status", "paused");
            then.status(200)
                .json_body(ok(json!({"data": [], "pagination": {"total": 10_000}})));
        })
        .await;
    // A short page (1 row when 2 were asked) with a huge total.
    let short = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("status", "running");
            then.status(200).json_body(ok(
                json!({"data": [row(1)], "pagination": {"total": 10_000}}),
            ));
        })
        .await;
    // The same full page forever, whatever the offset.
    let same = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes")
                .query_param("status", "creating");
            then.status(200).json_body(ok(
                json!({"data": [row(1), row(2)], "pagination": {"total": 10_000}}),
            ));
        })
        .await;
    let c = common::client(&server);
    let list = |status: &str| {
        c.list_sandboxes(createos_api::ListSandboxesOptions {
            status: Some(createos_api::SandboxStatus::from(status)),
            limit: Some(2),
            ..Default::default()
        })
        .try_collect::<Vec<_>>()
    };
    assert_eq!(bounded(list("paused")).await.unwrap().len(), 0);
    empty.assert_calls_async(1).await;
    assert_eq!(bounded(list("running")).await.unwrap().len(), 1);
    short.assert_calls_async(1).await;
    let rows = bounded(list("creating")).await.unwrap();
    assert_eq!(rows.len(), 2, "a repeated page is not yielded twice");
    same.assert_calls_async(2).await;
}

#[tokio::test]
async fn an_endless_list_stops_at_max_pages() {
    use futures::TryStreamExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    // Distinct full pages forever: only the page bound can end the walk.
    let served = std::sync::Arc::new(AtomicU64::new(0));
    let counter = served.clone();
    let app = axum::Router::new().route(
        "/v1/sandboxes",
        axum::routing::get(
            move |q: axum::extract::Query<std::collections::HashMap<String, String>>| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let offset: u64 = q.get("offset").and_then(|v| v.parse().ok()).unwrap_or(0);
                    axum::Json(ok(json!({
                        "data": [row(offset)],
                        "pagination": {"total": u64::MAX}
                    })))
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let c = common::client_for(&format!("http://{addr}"), Duration::from_secs(10));
    let err = tokio::time::timeout(
        Duration::from_secs(120),
        c.list_sandboxes(createos_api::ListSandboxesOptions {
            limit: Some(1),
            ..Default::default()
        })
        .try_collect::<Vec<_>>(),
    )
    .await
    .expect("the walk ended")
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(err.to_string().contains("pages"), "{err}");
    assert_eq!(
        served.load(Ordering::SeqCst),
        u64::from(createos_api::MAX_PAGES)
    );
}

// ---------------------------------------------------------------- hostile error text

#[tokio::test]
async fn a_huge_hostile_error_message_becomes_one_bounded_line() {
    let server = MockServer::start_async().await;
    let hostile = format!(
        "denied\r\n2026-12-04 CRITICAL root: forged\u{2028}\u{202e}\u{1b}[31m{}",
        // Under the 4 MiB an error body is read to, so the message is the server's.
        "x".repeat(3 << 20)
    );
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/whoami");
            then.status(400)
                .header("x-request-id", "req-1")
                .json_body(json!({"status": "error", "message": hostile}));
        })
        .await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(server.base_url())
        .build()
        .unwrap();
    let err = bounded(c.whoami()).await.unwrap_err();
    let shown = err.to_string();
    assert!(shown.len() < 4096, "{} bytes", shown.len());
    assert!(shown.contains("HTTP 400"), "{shown:.300}");
    assert_eq!(shown.lines().count(), 1, "{shown:.300}");
    assert!(!shown.chars().any(outside_text::is_unsafe), "{shown:.300}");
    assert!(
        shown.contains("denied\\r\\n2026-12-04 CRITICAL") && shown.contains("bytes cut]"),
        "{shown:.300}"
    );
}
