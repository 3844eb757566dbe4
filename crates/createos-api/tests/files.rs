//! Files: uploads from bytes and readers, downloads with byte caps.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, client_for, ok};
use createos_api::{Client, DownloadOptions, ErrorKind, RequestOptions, UploadBody};
use futures::StreamExt;
use httpmock::prelude::*;
use serde_json::json;

#[tokio::test]
async fn upload_bytes_sends_raw_octets_and_is_not_retried() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path("/v1/sandboxes/s/files")
                .query_param("path", "/workspace/config.json")
                .header("x-api-key", KEY)
                .header("content-type", "application/octet-stream")
                .body(r#"{"mode":"production"}"#);
            then.status(200)
                .json_body(ok(json!({"bytes": 21, "path": "/workspace/config.json"})));
        })
        .await;
    let files = client(&server).sandbox_handle("s").files();
    let r = files
        .upload("/workspace/config.json", r#"{"mode":"production"}"#)
        .await
        .unwrap();
    assert_eq!(r.bytes, 21);
    assert_eq!(r.path, "/workspace/config.json");
    m.assert_async().await;

    let busy = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path("/v1/sandboxes/s/files")
                .query_param("path", "/busy");
            then.status(503).body("busy");
        })
        .await;
    let err = files.upload("/busy", vec![1u8, 2, 3]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    busy.assert_calls_async(1).await;
}

/// A one-connection HTTP/1.1 server for chunked uploads. It signals `first_bytes` as soon as
/// it has received any body bytes, reads the body to its end, and answers with a JSend success
/// whose `bytes` is the decoded body length. Returns the decoded body once done.
async fn upload_server(
    first_bytes: tokio::sync::oneshot::Sender<()>,
) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut raw = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut signal = Some(first_bytes);
        let head_end = loop {
            let n = sock.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed before sending a head");
            raw.extend_from_slice(&buf[..n]);
            if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        let mut body = raw.split_off(head_end);
        while !body.ends_with(b"0\r\n\r\n") {
            if !body.is_empty()
                && let Some(tx) = signal.take()
            {
                let _ = tx.send(());
            }
            let n = sock.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed mid-body");
            body.extend_from_slice(&buf[..n]);
        }
        // Decode the chunked framing.
        let mut decoded = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16)
                    .unwrap();
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            decoded.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        let answer = ok(json!({"bytes": decoded.len(), "path": "/srv/blob.bin"})).to_string();
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        sock.write_all(reply.as_bytes()).await.unwrap();
        decoded
    });
    (format!("http://{addr}"), task)
}

#[tokio::test]
async fn upload_streams_from_any_async_reader() {
    // The reader hands over its second half only after the server has received bytes of the
    // first: a client that read the whole body before sending would wait forever.
    use tokio::io::AsyncWriteExt;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (url, server) = upload_server(started_tx).await;
    let (reader, mut writer) = tokio::io::duplex(16 * 1024);
    let first: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let second: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    let expected = [first.clone(), second.clone()].concat();
    let feeder = tokio::spawn(async move {
        writer.write_all(&first).await.unwrap();
        started_rx
            .await
            .expect("the server never saw body bytes before the reader finished");
        writer.write_all(&second).await.unwrap();
        writer.shutdown().await.unwrap();
    });
    let r = bounded(
        client_for(&url, Duration::from_secs(10))
            .sandbox_handle("s")
            .files()
            .upload("/srv/blob.bin", UploadBody::reader(reader)),
    )
    .await
    .unwrap();
    assert_eq!(r.bytes, 500_000);
    bounded(feeder).await.unwrap();
    assert_eq!(bounded(server).await.unwrap(), expected);
}

/// A body of `chunks` chunks of 1 KiB, one every `gap`, then (when `stall` is set) a pause
/// that never ends.
fn paced_body(chunks: usize, gap: Duration, stall: bool) -> UploadBody {
    let paced = futures::stream::iter(0..chunks).then(move |_| async move {
        tokio::time::sleep(gap).await;
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'z'; 1024]))
    });
    if stall {
        UploadBody::stream(paced.chain(futures::stream::pending()))
    } else {
        UploadBody::stream(paced)
    }
}

#[tokio::test]
async fn a_slow_upload_that_keeps_moving_outlives_the_timeout() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path("/v1/sandboxes/s/files")
                .is_true(|req| req.body().as_ref().len() == 12 * 1024);
            then.status(200)
                .json_body(ok(json!({"bytes": 12 * 1024, "path": "/slow"})));
        })
        .await;
    let started = std::time::Instant::now();
    // 12 chunks 100 ms apart: 1.2 s in all, four times the 300 ms timeout.
    let r = bounded(client(&server).sandbox_handle("s").files().upload_with(
        "/slow",
        paced_body(12, Duration::from_millis(100), false),
        &RequestOptions::with_timeout(Duration::from_millis(300)),
    ))
    .await
    .unwrap();
    assert!(started.elapsed() > Duration::from_millis(900));
    assert_eq!(r.bytes, 12 * 1024);
    m.assert_async().await;
}

#[tokio::test]
async fn a_stalled_upload_times_out() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(PUT).path("/v1/sandboxes/s/files");
            then.status(200).json_body(ok(json!({"bytes": 0})));
        })
        .await;
    let started = std::time::Instant::now();
    let err = bounded(client(&server).sandbox_handle("s").files().upload_with(
        "/stalled",
        paced_body(3, Duration::from_millis(50), true),
        &RequestOptions::with_timeout(Duration::from_millis(300)),
    ))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err:?}");
    assert!(
        matches!(err, createos_api::Error::Timeout { after, .. } if after == Duration::from_millis(300))
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn dropping_a_download_stops_the_transfer() {
    let (url, written) = chunked_server(200, vec![vec![3u8; 64 * 1024]], true).await;
    let mut dl = bounded(
        client_for(&url, Duration::from_secs(10))
            .sandbox_handle("s")
            .files()
            .download("/endless", DownloadOptions::default()),
    )
    .await
    .unwrap();
    assert!(!bounded(dl.next()).await.unwrap().unwrap().is_empty());
    drop(dl);
    // The server sees the connection close and stops (bounded, or the test fails).
    let n = bounded(written).await.unwrap();
    assert!(n > 0);
}

#[tokio::test]
async fn download_streams_bytes_and_reports_the_length() {
    let server = MockServer::start_async().await;
    let data: Vec<u8> = (0..100_000u32)
        .map(|i| (i % 251).to_le_bytes()[0])
        .collect();
    let m = server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/s/files")
                .query_param("path", "/tmp/out.bin")
                .header("x-api-key", KEY);
            then.status(200)
                .header("content-type", "application/octet-stream")
                .body(data.clone());
        })
        .await;
    let dl = client(&server)
        .sandbox_handle("s")
        .files()
        .download("/tmp/out.bin", DownloadOptions::default())
        .await
        .unwrap();
    assert_eq!(dl.content_length(), Some(100_000));
    let got = dl.bytes().await.unwrap();
    assert_eq!(got.as_ref(), data.as_slice());
    m.assert_async().await;
}

#[tokio::test]
async fn download_write_to_copies_everything() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/files");
            then.status(200).body("hello file");
        })
        .await;
    let dl = client(&server)
        .sandbox_handle("s")
        .files()
        .download("/a", DownloadOptions::default())
        .await
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(dl.write_to(&mut out).await.unwrap(), 10);
    assert_eq!(out, b"hello file");
}

#[tokio::test]
async fn a_declared_length_over_the_cap_is_refused_before_reading() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/files");
            then.status(200).body(vec![0u8; 10_000]);
        })
        .await;
    let err = client(&server)
        .sandbox_handle("s")
        .files()
        .download("/big", DownloadOptions::max_bytes(9_999))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert!(err.to_string().contains("Content-Length 10000"), "{err}");
    // Exactly at the cap is fine.
    let dl = client(&server)
        .sandbox_handle("s")
        .files()
        .download("/big", DownloadOptions::max_bytes(10_000))
        .await
        .unwrap();
    assert_eq!(dl.bytes().await.unwrap().len(), 10_000);
}

#[tokio::test]
async fn the_cap_is_enforced_during_a_transfer_without_a_length() {
    // Chunked, no Content-Length, endless: the cap must stop it.
    let (url, written) = chunked_server(200, vec![vec![7u8; 64 * 1024]], true).await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(url)
        .build()
        .unwrap();
    let mut dl = bounded(
        c.sandbox_handle("s")
            .files()
            .download("/endless", DownloadOptions::max_bytes(1_000_000)),
    )
    .await
    .unwrap();
    assert_eq!(dl.content_length(), None);
    let mut total = 0u64;
    let err = loop {
        match bounded(dl.next()).await {
            Some(Ok(b)) => total += b.len() as u64,
            Some(Err(e)) => break e,
            None => panic!("an endless body ended"),
        }
    };
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert!(total <= 1_000_000, "{total} bytes passed a 1 MB cap");
    assert!(dl.next().await.is_none());
    drop(dl);
    bounded(written).await.unwrap();
}

#[tokio::test]
async fn missing_files_are_not_found_errors() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/files");
            then.status(404)
                .header("x-request-id", "r1")
                .json_body(json!({"status": "fail", "data": {"path": "no such file"}}));
        })
        .await;
    let err = client(&server)
        .sandbox_handle("s")
        .files()
        .download("/nope", DownloadOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.request_id(), Some("r1"));
    assert_eq!(err.as_api().unwrap().message, "path: no such file");
}

#[tokio::test]
async fn an_idle_download_times_out() {
    // The server sends headers and one chunk, then stalls.
    let (url, _written) = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
                .await;
            tokio::time::sleep(Duration::from_secs(10)).await;
            let _ = tx.send(0);
        });
        (format!("http://{addr}"), rx)
    };
    let c = Client::builder()
        .api_key(KEY)
        .base_url(url)
        .build()
        .unwrap();
    let opts = DownloadOptions {
        request: RequestOptions::with_timeout(Duration::from_millis(300)),
        ..DownloadOptions::default()
    };
    let mut dl = bounded(c.sandbox_handle("s").files().download("/slow", opts))
        .await
        .unwrap();
    assert_eq!(bounded(dl.next()).await.unwrap().unwrap().as_ref(), b"abc");
    let err = bounded(dl.next()).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test]
async fn download_as_async_read_keeps_the_cap() {
    use tokio::io::AsyncReadExt;
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/s/files")
                .query_param("path", "/r");
            then.status(200).body("reader body");
        })
        .await;
    let files = client(&server).sandbox_handle("s").files();
    let mut text = String::new();
    files
        .download("/r", DownloadOptions::default())
        .await
        .unwrap()
        .into_reader()
        .read_to_string(&mut text)
        .await
        .unwrap();
    assert_eq!(text, "reader body");

    let (url, _written) = chunked_server(200, vec![vec![1u8; 4096]], true).await;
    let c = Client::builder()
        .api_key(KEY)
        .base_url(url)
        .build()
        .unwrap();
    let dl = bounded(
        c.sandbox_handle("s")
            .files()
            .download("/endless", DownloadOptions::max_bytes(10_000)),
    )
    .await
    .unwrap();
    let mut sink = Vec::new();
    let err = bounded(dl.into_reader().read_to_end(&mut sink))
        .await
        .unwrap_err();
    let inner = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<createos_api::Error>())
        .expect("crate error inside");
    assert_eq!(inner.kind(), ErrorKind::TooLarge);
    assert!(sink.len() <= 10_000);
}
