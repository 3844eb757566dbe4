//! Templates: list/create/get/delete requests, plain-text logs and the followed log stream.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, client_for, ok, scripted_server};
use createos_api::{
    ErrorKind, GetTemplateOptions, MAX_TEMPLATE_LOG_BYTES, PaginationOptions,
    TemplateCreateRequest, TemplateLogsOptions, TemplateStatus,
};
use futures::{StreamExt as _, TryStreamExt as _};
use httpmock::prelude::*;
use serde_json::json;

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
async fn list_walks_pages_and_accepts_the_legacy_templates_key() {
    let server = MockServer::start_async().await;
    let first = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates")
                .header("x-api-key", KEY)
                .is_true(exact_query(&[("limit", "2"), ("offset", "0")]));
            then.status(200).json_body(ok(json!({
                "templates": [
                    {"id": "tpl_1", "name": "a", "status": "ready"},
                    {"id": "tpl_2", "name": "b", "status": "building"}
                ],
                "pagination": {"total": 3, "offset": 0, "count": 2}
            })));
        })
        .await;
    let second = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates")
                .is_true(exact_query(&[("limit", "2"), ("offset", "2")]));
            then.status(200).json_body(ok(json!({
                "data": [{"id": "tpl_3", "name": "c", "status": "rebuilding"}],
                "pagination": {"total": 3, "offset": 2, "count": 1}
            })));
        })
        .await;
    let all: Vec<_> = bounded(
        client(&server)
            .templates()
            .list(PaginationOptions {
                limit: Some(2),
                offset: None,
            })
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    let ids: Vec<&str> = all.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tpl_1", "tpl_2", "tpl_3"]);
    assert_eq!(all[0].status, TemplateStatus::Ready);
    assert_eq!(all[2].status, TemplateStatus::Unknown("rebuilding".into()));
    first.assert_async().await;
    second.assert_async().await;
}

#[tokio::test]
async fn create_get_and_delete_send_the_documented_requests() {
    let server = MockServer::start_async().await;
    let create = server
        .mock_async(|when, then| {
            when.method(POST).path("/v1/templates").json_body(
                json!({"name": "py-tools", "dockerfile": "FROM nodeops/sandbox:debian\n"}),
            );
            then.status(200).json_body(ok(json!({
                "id": "tpl_9", "name": "py-tools", "base": "", "status": "pending",
                "ext4_size_bytes": 0, "created_at": "2026-11-29T10:00:00Z"
            })));
        })
        .await;
    let get_plain = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_9")
                .is_true(exact_query(&[]));
            then.status(200).json_body(ok(json!({
                "id": "tpl_9", "status": "ready", "ext4_size_bytes": 1_073_741_824u64,
                "built_at": "2026-11-29T10:03:00Z"
            })));
        })
        .await;
    let get_dockerfile = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_9")
                .is_true(exact_query(&[("include", "dockerfile")]));
            then.status(200).json_body(ok(json!({
                "id": "tpl_9", "status": "ready", "dockerfile": "FROM nodeops/sandbox:debian\n"
            })));
        })
        .await;
    let delete = server
        .mock_async(|when, then| {
            when.method(DELETE).path("/v1/templates/tpl_9");
            then.status(200).json_body(ok(json!({"deleted": true})));
        })
        .await;
    let templates = client(&server).templates();
    let created = templates
        .create(&TemplateCreateRequest::new(
            "py-tools",
            "FROM nodeops/sandbox:debian\n",
        ))
        .await
        .unwrap();
    assert_eq!(created.status, TemplateStatus::Pending);
    let plain = templates
        .get("tpl_9", GetTemplateOptions::default())
        .await
        .unwrap();
    assert_eq!(plain.dockerfile, None);
    assert_eq!(plain.ext4_size_bytes, 1 << 30);
    assert_eq!(plain.built_at.as_deref(), Some("2026-11-29T10:03:00Z"));
    let full = templates
        .get(
            "tpl_9",
            GetTemplateOptions {
                include_dockerfile: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        full.dockerfile.as_deref(),
        Some("FROM nodeops/sandbox:debian\n")
    );
    templates.delete("tpl_9").await.unwrap();
    for m in [&create, &get_plain, &get_dockerfile, &delete] {
        m.assert_calls_async(1).await;
    }
}

#[tokio::test]
async fn logs_return_the_plain_text_body_and_send_attempt_only_when_set() {
    let server = MockServer::start_async().await;
    let latest = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_9/logs")
                .is_true(exact_query(&[]));
            then.status(200)
                .header("content-type", "text/plain")
                .body("step 1/2 : FROM nodeops/sandbox:debian\nstep 2/2 : RUN true\n");
        })
        .await;
    let second = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_9/logs")
                .is_true(exact_query(&[("attempt", "2")]));
            then.status(200).body("attempt two\n");
        })
        .await;
    let templates = client(&server).templates();
    let text = templates
        .logs("tpl_9", TemplateLogsOptions::default())
        .await
        .unwrap();
    assert_eq!(
        text,
        "step 1/2 : FROM nodeops/sandbox:debian\nstep 2/2 : RUN true\n"
    );
    let text = templates
        .logs("tpl_9", TemplateLogsOptions { attempt: 2 })
        .await
        .unwrap();
    assert_eq!(text, "attempt two\n");
    latest.assert_async().await;
    second.assert_async().await;
}

#[tokio::test]
async fn follow_logs_parses_ndjson_keeps_extra_keys_and_stops_at_final() {
    let server = MockServer::start_async().await;
    let body = concat!(
        ": started\n",
        "{\"ts\":\"t1\",\"level\":\"info\",\"line\":\"step 1\",\"attempt\":1,\"final\":false,\"step\":1}\n",
        "data: {\"ts\":\"t2\",\"level\":\"info\",\"line\":\"step 2\",\"attempt\":1}\n",
        "{\"ts\":\"t3\",\"line\":\"\",\"attempt\":1,\"final\":true,\"status\":\"ready\",\"image_bytes\":42}\n",
        "{\"ts\":\"t4\",\"line\":\"after final\"}\n",
    );
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_9/logs")
                .is_true(exact_query(&[("follow", "true")]));
            then.status(200).body(body);
        })
        .await;
    let stream = client(&server)
        .templates()
        .follow_logs("tpl_9", TemplateLogsOptions::default())
        .await
        .unwrap();
    let events: Vec<_> = bounded(stream.try_collect::<Vec<_>>()).await.unwrap();
    m.assert_async().await;
    assert_eq!(events.len(), 3, "nothing is read past the final frame");
    assert_eq!(events[0].line, "step 1");
    assert_eq!(events[0].extra.get("step"), Some(&json!(1)));
    assert!(!events[1].is_final);
    assert!(events[2].is_final);
    assert_eq!(events[2].status, Some(TemplateStatus::Ready));
    assert_eq!(events[2].extra.get("image_bytes"), Some(&json!(42)));
}

#[tokio::test]
async fn follow_logs_surfaces_bad_frames_and_missing_templates() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/broken/logs")
                .query_param("follow", "true")
                .query_param("attempt", "3");
            then.status(200).body("{\"line\":\"ok\"}\nnot json\n");
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/templates/missing/logs");
            then.status(404)
                .json_body(json!({"status": "fail", "data": "template not found"}));
        })
        .await;
    let templates = client(&server).templates();
    let mut stream = templates
        .follow_logs("broken", TemplateLogsOptions { attempt: 3 })
        .await
        .unwrap();
    assert_eq!(bounded(stream.next()).await.unwrap().unwrap().line, "ok");
    let err = bounded(stream.next()).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(
        bounded(stream.next()).await.is_none(),
        "the stream ends after an error"
    );
    let Err(err) = templates
        .follow_logs("missing", TemplateLogsOptions::default())
        .await
    else {
        panic!("a missing template must fail");
    };
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn logs_are_retried_like_every_get() {
    let server = MockServer::start_async().await;
    let busy = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/templates/tpl_9/logs");
            then.status(503)
                .up_to_n_times(2)
                .header("retry-after", "0")
                .body("busy");
        })
        .await;
    let good = server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/templates/tpl_9/logs");
            then.status(200).body("built\n");
        })
        .await;
    let text = bounded(
        client(&server)
            .templates()
            .logs("tpl_9", TemplateLogsOptions::default()),
    )
    .await
    .unwrap();
    assert_eq!(text, "built\n");
    busy.assert_calls_async(2).await;
    good.assert_calls_async(1).await;
}

#[tokio::test]
async fn logs_body_is_capped_while_reading() {
    // Chunked and endless: only the cap can end it.
    let (url, written) = chunked_server(200, vec![vec![b'x'; 64 * 1024]], true).await;
    let err = bounded(
        client_for(&url, Duration::from_secs(10))
            .templates()
            .logs("tpl_9", TemplateLogsOptions::default()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err:?}");
    assert!(
        err.to_string()
            .contains(&MAX_TEMPLATE_LOG_BYTES.to_string()),
        "{err}"
    );
    // The transfer stopped near the cap, not at the server's 20 s deadline.
    let sent = bounded(written).await.unwrap();
    assert!(
        sent < 4 * MAX_TEMPLATE_LOG_BYTES as u64,
        "{sent} bytes sent"
    );
}

#[tokio::test]
async fn a_stalled_logs_body_times_out() {
    let url = scripted_server(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 100\r\n\r\nstep 1\n"
            .to_vec(),
        Duration::from_secs(15),
    )
    .await;
    let started = std::time::Instant::now();
    let err = bounded(
        client_for(&url, Duration::from_millis(300))
            .templates()
            .logs("tpl_9", TemplateLogsOptions::default()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_cut_logs_body_is_a_transport_error() {
    let url = scripted_server(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 100\r\n\r\nstep 1\n"
            .to_vec(),
        Duration::ZERO,
    )
    .await;
    let err = bounded(
        client_for(&url, Duration::from_secs(5))
            .templates()
            .logs("tpl_9", TemplateLogsOptions::default()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport, "{err:?}");
}

#[tokio::test]
async fn a_bad_log_frame_never_reveals_a_reflected_key() {
    let server = MockServer::start_async().await;
    let frame = json!({"line": KEY, "attempt": KEY}).to_string();
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_9/logs")
                .query_param("follow", "true");
            then.status(200).body(format!("{frame}\n"));
        })
        .await;
    let mut stream = client(&server)
        .templates()
        .follow_logs("tpl_9", TemplateLogsOptions::default())
        .await
        .unwrap();
    let err = bounded(stream.next()).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
    assert!(!shown.contains(KEY), "{shown}");
}
