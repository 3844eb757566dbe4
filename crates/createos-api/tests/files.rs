//! Files: uploads from bytes and readers, downloads with byte caps.

mod common;

use std::time::Duration;

use common::{KEY, bounded, chunked_server, client, ok};
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

#[tokio::test]
async fn upload_streams_from_any_async_reader() {
    let server = MockServer::start_async().await;
    let payload: Vec<u8> = (0..300_000u32)
        .map(|i| (i % 251).to_le_bytes()[0])
        .collect();
    let expected = payload.clone();
    let m = server
        .mock_async(|when, then| {
            when.method(PUT)
                .path("/v1/sandboxes/s/files")
                .query_param("path", "/srv/blob.bin")
                .is_true(move |req| req.body().as_ref() == expected.as_slice());
            then.status(200)
                .json_body(ok(json!({"bytes": 300_000, "path": "/srv/blob.bin"})));
        })
        .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob.bin");
    std::fs::write(&path, &payload).unwrap();
    let file = tokio::fs::File::open(&path).await.unwrap();
    let r = client(&server)
        .sandbox_handle("s")
        .files()
        .upload_with(
            "/srv/blob.bin",
            UploadBody::reader(file),
            &RequestOptions::with_timeout(Duration::from_secs(300)),
        )
        .await
        .unwrap();
    assert_eq!(r.bytes, 300_000);
    m.assert_async().await;
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
