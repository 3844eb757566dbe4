//! execd's files and directories: the multipart upload as sent, downloads whole, ranged and
//! capped (early and mid-stream), and the small calls.

mod common;

use std::time::Duration;

use common::{KEY, RawServer, SB, Step, chunk, chunked_head, client, end, proxied};
use futures::StreamExt;
use httpmock::prelude::*;
use opensandbox_api::{ByteRange, DownloadOptions, ErrorKind, FileType, NewDirectory, UploadFile};
use serde_json::json;

fn ok_empty() -> Vec<Step> {
    vec![Step::Write(
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
    )]
}

#[tokio::test]
async fn upload_sends_metadata_and_file_parts_with_a_content_length() {
    let server = RawServer::start(|_| ok_empty()).await;
    server
        .client()
        .execd(SB)
        .upload(&[
            UploadFile::new("/workspace/a.txt", "alpha\r\n--not-a-boundary").mode(0o644),
            UploadFile::new("/workspace/bin/run", vec![0u8, 255, 10]).owner("app", "app"),
        ])
        .await
        .unwrap();
    let (head, body) = server.request(0);
    let head = head.to_lowercase();
    assert!(
        head.starts_with(&format!("post {} http/1.1", proxied("/files/upload"))),
        "{head}"
    );
    assert!(head.contains(&format!("open-sandbox-api-key: {}", KEY.to_lowercase())));
    assert!(
        !head.contains("transfer-encoding"),
        "chunked multipart does not pass the proxy"
    );
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("a content-length")
        .parse()
        .unwrap();
    assert_eq!(length, body.len());
    let boundary = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: multipart/form-data; boundary="))
        .expect("a multipart content type")
        .to_owned();
    assert!(boundary.len() >= 32, "{boundary}");
    let b = boundary;
    let want = format!(
        "--{b}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\
Content-Type: application/json\r\n\r\n{{\"mode\":644,\"path\":\"/workspace/a.txt\"}}\r\n\
--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
Content-Type: application/octet-stream\r\n\r\nalpha\r\n--not-a-boundary\r\n\
--{b}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\
Content-Type: application/json\r\n\r\n{{\"group\":\"app\",\"owner\":\"app\",\"path\":\"/workspace/bin/run\"}}\r\n\
--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"run\"\r\n\
Content-Type: application/octet-stream\r\n\r\n\u{0}\u{1}\n\r\n--{b}--\r\n",
    );
    let mut want = want.into_bytes();
    // The binary file's second byte (written as \u{1} above) is 0xFF.
    let at = want.windows(3).position(|w| w == b"\0\x01\n").unwrap();
    want[at + 1] = 0xFF;
    assert_eq!(
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&want)
    );
    assert_eq!(body, want);
}

#[tokio::test]
async fn upload_is_never_repeated() {
    let server = MockServer::start_async().await;
    let m = server
        .mock_async(|when, then| {
            when.method(POST).path(proxied("/files/upload"));
            then.status(500)
                .json_body(json!({"code": "RUNTIME_ERROR", "message": "disk full"}));
        })
        .await;
    let err = client(&server)
        .execd(SB)
        .upload(&[UploadFile::new("/w/x", "x")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("RUNTIME_ERROR"));
    m.assert_calls_async(1).await;
}

#[tokio::test]
async fn downloads_whole_and_ranged() {
    let server = MockServer::start_async().await;
    let whole = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/files/download"))
                .query_param("path", "/w/data.bin")
                .header_missing("range")
                .header("open-sandbox-api-key", KEY);
            then.status(200).body("0123456789");
        })
        .await;
    let ranged = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/files/download"))
                .query_param("path", "/w/data.bin")
                .header("range", "bytes=2-4");
            then.status(206)
                .header("content-range", "bytes 2-4/10")
                .body("234");
        })
        .await;
    let execd = client(&server).execd(SB);
    let d = execd
        .download("/w/data.bin", DownloadOptions::capped(10))
        .await
        .unwrap();
    assert_eq!(d.content_length(), Some(10));
    assert_eq!(&d.bytes().await.unwrap()[..], b"0123456789");
    let d = execd
        .download(
            "/w/data.bin",
            DownloadOptions::capped(10).range(ByteRange {
                start: 2,
                end: Some(4),
            }),
        )
        .await
        .unwrap();
    let range = d.content_range().unwrap();
    assert_eq!((range.start, range.end, range.total), (2, 4, Some(10)));
    let mut sink = Vec::new();
    assert_eq!(d.write_to(&mut sink).await.unwrap(), 3);
    assert_eq!(sink, b"234");
    whole.assert_async().await;
    ranged.assert_async().await;
}

#[tokio::test]
async fn a_range_answered_whole_is_refused() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/files/download"));
            then.status(200).body("0123456789");
        })
        .await;
    let err = client(&server)
        .execd(SB)
        .download(
            "/w/f",
            DownloadOptions::capped(100).range(ByteRange {
                start: 5,
                end: None,
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
}

#[tokio::test]
async fn a_content_length_over_the_cap_is_refused_before_reading() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/files/download"));
            then.status(200).body(vec![b'x'; 4096]);
        })
        .await;
    let err = client(&server)
        .execd(SB)
        .download("/w/big", DownloadOptions::capped(1000))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert!(err.to_string().contains("4096"), "{err}");
}

#[tokio::test]
async fn the_cap_holds_mid_stream_when_no_length_is_sent() {
    let server = RawServer::start(|_| {
        vec![
            chunked_head(
                "206 Partial Content\r\ncontent-range: bytes 0-2999/3000",
                "application/octet-stream",
            ),
            chunk(&[b'a'; 400]),
            chunk(&[b'b'; 400]),
            chunk(&[b'c'; 400]),
            chunk(&[b'd'; 400]),
            end(),
        ]
    })
    .await;
    let mut d = server
        .client()
        .execd(SB)
        .download(
            "/w/big",
            DownloadOptions::capped(1000).range(ByteRange {
                start: 0,
                end: None,
            }),
        )
        .await
        .unwrap();
    assert_eq!(d.content_length(), None);
    let mut got = 0;
    let err = loop {
        match d.next().await {
            Some(Ok(bytes)) => got += bytes.len(),
            Some(Err(e)) => break e,
            None => panic!("the cap was not enforced ({got} bytes read)"),
        }
    };
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert!(got <= 1000, "{got} bytes passed a cap of 1000");
    assert!(d.next().await.is_none());
}

#[tokio::test]
async fn a_download_stalled_mid_body_ends_with_idle() {
    let server = RawServer::start(|_| {
        vec![
            chunked_head("200 OK", "application/octet-stream"),
            chunk(b"first"),
            Step::Sleep(Duration::from_secs(10)),
        ]
    })
    .await;
    let c = opensandbox_api::Client::builder()
        .domain(&server.base)
        .api_key(KEY)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut d = c
        .execd(SB)
        .download("/w/f", DownloadOptions::capped(100))
        .await
        .unwrap();
    assert_eq!(&d.next().await.unwrap().unwrap()[..], b"first");
    let err = d.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Idle, "{err}");
}

#[tokio::test]
async fn a_download_is_repeated_until_its_head_arrives() {
    let server = MockServer::start_async().await;
    let busy = server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/files/download"));
            then.status(503)
                .json_body(json!({"code": "BUSY", "message": "later"}));
        })
        .await;
    busy.up_to_n_times_async(1).await;
    server
        .mock_async(|when, then| {
            when.method(GET).path(proxied("/files/download"));
            then.status(200).body("ok");
        })
        .await;
    let d = client(&server)
        .execd(SB)
        .download("/w/f", DownloadOptions::capped(100))
        .await
        .unwrap();
    assert_eq!(&d.bytes().await.unwrap()[..], b"ok");
    busy.assert_calls_async(1).await;
}

#[tokio::test]
async fn info_deletes_directories_and_listings() {
    let server = MockServer::start_async().await;
    let info = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/files/info"))
                .query_param("path", "/w/a")
                .query_param("path", "/w/b");
            then.status(200).json_body(json!({
                "/w/a": {"path": "/w/a", "type": "file", "size": 3, "mode": 644, "owner": "root", "group": "root",
                          "modified_at": "2026-12-04T10:00:00Z", "created_at": "2026-12-04T10:00:00Z"},
                "/w/b": {"path": "/w/b", "type": "directory", "size": 0, "mode": 755}
            }));
        })
        .await;
    let rm = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(proxied("/files"))
                .query_param("path", "/w/a")
                .query_param("path", "/w/c");
            then.status(200);
        })
        .await;
    let mkdir = server
        .mock_async(|when, then| {
            when.method(POST)
                .path(proxied("/directories"))
                .json_body(json!({
                    "/w/out": {"mode": 755},
                    "/w/priv": {"mode": 700, "owner": "app", "group": "app"}
                }));
            then.status(200);
        })
        .await;
    let ls = server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/directories/list"))
                .query_param("path", "/w")
                .query_param("depth", "2");
            then.status(200).json_body(json!([
                {"path": "/w/out", "type": "directory", "size": 0, "mode": 755},
                {"path": "/w/link", "type": "symlink", "size": 0, "mode": 777}
            ]));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path(proxied("/directories/list"))
                .query_param("path", "/empty");
            then.status(200).body("null");
        })
        .await;
    let rmdir = server
        .mock_async(|when, then| {
            when.method(DELETE)
                .path(proxied("/directories"))
                .query_param("path", "/w/out");
            then.status(200);
        })
        .await;
    let execd = client(&server).execd(SB);
    let map = execd.file_info(&["/w/a", "/w/b"]).await.unwrap();
    assert_eq!(map["/w/a"].size, 3);
    assert_eq!(map["/w/a"].permissions(), Some(0o644));
    assert_eq!(map["/w/b"].kind, FileType::Directory);
    execd.delete_files(&["/w/a", "/w/c"]).await.unwrap();
    let mut private = NewDirectory::new("/w/priv", 0o700);
    private.owner = Some("app".into());
    private.group = Some("app".into());
    execd
        .make_dirs(&[NewDirectory::new("/w/out", 0o755), private])
        .await
        .unwrap();
    let entries = execd.list_dir("/w", 2).await.unwrap();
    assert_eq!(entries[1].kind, FileType::Symlink);
    assert!(execd.list_dir("/empty", 1).await.unwrap().is_empty());
    execd.delete_dirs(&["/w/out"]).await.unwrap();
    assert_eq!(
        execd.delete_files(&[]).await.unwrap_err().kind(),
        ErrorKind::Config
    );
    for m in [&info, &rm, &mkdir, &ls, &rmdir] {
        m.assert_calls_async(1).await;
    }
}
