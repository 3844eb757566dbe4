//! execd through the server proxy: the bare-JSON command stream, exit codes, options,
//! timeouts and disconnects, command status, files and directories.

mod common;

use std::time::{Duration, Instant};

use common::{Bin, Exec, FrameReader, alive, eventually};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn execd(bin: &Bin, id: &str, path: &str) -> String {
    format!("{}/v1/sandboxes/{id}/proxy/44772{path}", bin.url)
}

#[tokio::test]
async fn a_command_streams_bare_json_frames_with_pings_and_completes() {
    let bin = Bin::spawn(&[]);
    let id = bin.create(json!({"env": {"FROM_CREATE": "yes"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = bin
        .http
        .get(execd(&bin, &id, "/ping"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let resp = bin
        .http
        .post(execd(&bin, &id, "/command"))
        .json(&json!({"command": "echo one; echo; printf 'two\\r\\n'; echo err >&2; sleep 0.8; echo \"$OPENSANDBOX_ID $FROM_CREATE\"; printf unterminated"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let raw = resp.text().await.unwrap();
    let x = Exec::parse(&raw);
    let kinds: Vec<&str> = x
        .frames
        .iter()
        .map(|f| f["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "init");
    assert_eq!(kinds[1], "ping", "execd pings at once after init");
    assert_eq!(*kinds.last().unwrap(), "execution_complete");
    assert!(
        x.of("ping").len() >= 3,
        "a ping every 300 ms over 0.8 s: {kinds:?}"
    );
    assert!(x.of("ping").iter().all(|p| p["text"] == "pong"));
    assert_eq!(x.id().len(), 32);
    // One frame per line without its terminator; a blank line is "\n"; \r\n ends one line;
    // the unterminated rest comes at the end.
    assert_eq!(
        x.stdout(),
        vec!["one", "\n", "two", &format!("{id} yes"), "unterminated"]
    );
    assert_eq!(x.stderr(), vec!["err"]);
    let eids: Vec<i64> = x.frames.iter().filter_map(|f| f["eid"].as_i64()).collect();
    assert!(
        eids.windows(2).all(|w| w[0] < w[1]),
        "eids increase: {eids:?}"
    );
    let done = x.of("execution_complete")[0];
    assert!(done["execution_time"].as_i64().unwrap() >= 800);
    assert_eq!(x.exit_code(), Some(0));
    assert!(x.of("error").is_empty());
    // The status route knows it.
    let (st, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/command/status/{}", x.id()),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (v["running"].as_bool(), v["exit_code"].as_i64()),
        (Some(false), Some(0))
    );
    assert!(v["content"].as_str().unwrap().starts_with("echo one"));
    assert!(v["finished_at"].is_string() && v["started_at"].is_string());
    let s = bin.stats().await;
    assert_eq!(s["commands"], 1);
    assert_eq!(s["requests"]["command"], 1);
}

#[tokio::test]
async fn a_failing_command_ends_with_an_error_frame_carrying_its_exit_code() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let x = bin.sh(&id, "echo partial; exit 42").await;
    assert_eq!(x.stdout(), vec!["partial"]);
    let err = x.of("error");
    assert_eq!(err.len(), 1);
    assert_eq!(err[0]["error"]["ename"], "CommandExecError");
    assert_eq!(err[0]["error"]["evalue"], "42");
    assert_eq!(err[0]["error"]["traceback"], json!(["exit status 42"]));
    assert!(
        x.of("execution_complete").is_empty(),
        "an error ends the stream instead"
    );
    assert_eq!(x.frames.last().unwrap()["type"], "error");
    assert_eq!(x.exit_code(), Some(42));
    // A command killed by a signal reports -1.
    let x = bin.sh(&id, "kill -TERM $$").await;
    assert_eq!(x.exit_code(), Some(-1));
    assert_eq!(
        x.of("error")[0]["error"]["traceback"],
        json!(["signal: terminated"])
    );
}

#[tokio::test]
async fn cwd_envs_argv_and_guest_paths() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let x = bin
        .exec(&id, json!({"command": "pwd; echo \"$A $B\"; ls /workspace", "cwd": "/tmp", "envs": {"A": "1", "B": "/workspace/x"}}))
        .await;
    assert_eq!(x.exit_code(), Some(0));
    let out = x.stdout();
    assert!(out[0].ends_with(&format!("/sandboxes/{id}/tmp")), "{out:?}");
    assert!(
        out[1].starts_with("1 /") && out[1].ends_with(&format!("/sandboxes/{id}/workspace/x")),
        "{out:?}"
    );
    // argv: no shell, literal arguments.
    let x = bin
        .exec(&id, json!({"argv": ["printf", "%s|", "a b", "$HOME", "*"]}))
        .await;
    assert_eq!(x.stdout(), vec!["a b|$HOME|*|"]);
    let x = bin
        .exec(&id, json!({"argv": ["no-such-program-xyz"]}))
        .await;
    assert_eq!(x.id().len(), 32);
    let e = &x.of("error")[0]["error"];
    assert!(
        e["evalue"]
            .as_str()
            .unwrap()
            .contains("executable file not found"),
        "{e}"
    );
    assert_eq!(
        x.exit_code(),
        None,
        "a start failure has no numeric exit code"
    );
    let x = bin
        .exec(&id, json!({"command": "true", "cwd": "/workspace/missing"}))
        .await;
    assert!(
        x.of("error")[0]["error"]["evalue"]
            .as_str()
            .unwrap()
            .contains("chdir")
    );
    // Bad requests.
    for body in [
        json!({}),
        json!({"command": "a", "argv": ["b"]}),
        json!({"command": "x", "timeout": -1}),
    ] {
        let r = bin
            .http
            .post(execd(&bin, &id, "/command"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            r.json::<Value>().await.unwrap()["code"],
            "INVALID_REQUEST_BODY"
        );
    }
    // Each sandbox has its own guest directory.
    let other = bin.create_id().await;
    bin.sh(&id, "echo mine > /workspace/only-here").await;
    let x = bin.sh(&other, "test -e /workspace/only-here").await;
    assert_eq!(x.exit_code(), Some(1));
}

#[tokio::test]
async fn the_timeout_kills_the_process_group_and_reports_minus_one() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let started = Instant::now();
    let x = bin
        .exec(
            &id,
            json!({"command": "sleep 60 & echo $! > /tmp/child; wait", "timeout": 700}),
        )
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(x.exit_code(), Some(-1));
    assert_eq!(
        x.of("error")[0]["error"]["traceback"],
        json!(["signal: killed"])
    );
    let pid: i32 = bin.sh(&id, "cat /tmp/child").await.stdout()[0]
        .parse()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !alive(pid)).await,
        "the background child died with its group"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_kills_the_process_group() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let resp = bin
        .http
        .post(execd(&bin, &id, "/command"))
        .json(&json!({"command": "echo $$ > /tmp/pid; sleep 60"}))
        .send()
        .await
        .unwrap();
    let mut frames = FrameReader::new(resp);
    assert_eq!(
        frames.next(Duration::from_secs(5)).await.unwrap().unwrap()["type"],
        "init"
    );
    let pid = {
        let mut pid = None;
        for _ in 0..50 {
            if let Some(p) = bin
                .sh(&id, "cat /tmp/pid 2>/dev/null")
                .await
                .stdout()
                .first()
            {
                pid = p.parse::<i32>().ok();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pid.expect("the command wrote its pid")
    };
    assert!(alive(pid));
    drop(frames);
    assert!(
        eventually(Duration::from_secs(5), || !alive(pid)).await,
        "the command outlived its client"
    );
}

#[tokio::test]
async fn interrupt_background_commands_and_their_logs() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let x = bin
        .exec(
            &id,
            json!({"command": "echo started; sleep 30", "background": true}),
        )
        .await;
    let kinds: Vec<&str> = x
        .frames
        .iter()
        .map(|f| f["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        vec!["init", "execution_complete"],
        "a background command answers at once"
    );
    let cid = x.id();
    assert_eq!(status(&bin, &id, &cid).await["running"], true);
    let mut logged = String::new();
    for _ in 0..40 {
        let r = bin
            .http
            .get(execd(&bin, &id, &format!("/command/{cid}/logs?cursor=0")))
            .send()
            .await
            .unwrap();
        let cursor = r.headers()["EXECD-COMMANDS-TAIL-CURSOR"]
            .to_str()
            .unwrap()
            .to_owned();
        logged = r.text().await.unwrap();
        if !logged.is_empty() {
            assert_eq!(cursor, logged.len().to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(logged, "started\n");
    let r = bin
        .http
        .delete(execd(&bin, &id, &format!("/command?id={cid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut done = Value::Null;
    for _ in 0..60 {
        done = status(&bin, &id, &cid).await;
        if done["running"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (done["running"].as_bool(), done["exit_code"].as_i64()),
        (Some(false), Some(-1)),
        "{done}"
    );
    let r = bin
        .http
        .delete(execd(&bin, &id, "/command?id=unknown"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let r = bin
        .http
        .get(execd(&bin, &id, "/command/status/unknown"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

async fn status(bin: &Bin, id: &str, cid: &str) -> Value {
    let url = format!("/v1/sandboxes/{id}/proxy/44772/command/status/{cid}");
    bin.call(Method::GET, &url, None).await.1
}

/// A multipart body as the SDK writes it: `metadata` (with a filename) then `file`, per entry.
fn multipart(entries: &[(&str, &[u8], Option<i64>)], metadata_filename: bool) -> (String, Vec<u8>) {
    let boundary = "fakeboundary7d2";
    let mut b = Vec::new();
    for (path, data, mode) in entries {
        let meta = json!({"path": path, "owner": null, "group": null, "mode": mode});
        b.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        if metadata_filename {
            b.extend_from_slice(
                b"Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n",
            );
        } else {
            b.extend_from_slice(b"Content-Disposition: form-data; name=\"metadata\"\r\n");
        }
        b.extend_from_slice(b"Content-Type: application/json\r\n\r\n");
        b.extend_from_slice(meta.to_string().as_bytes());
        b.extend_from_slice(b"\r\n");
        b.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), b)
}

#[tokio::test]
async fn upload_download_ranges_info_and_delete() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let blob: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    let (ctype, body) = multipart(
        &[
            ("/workspace/deep/a.bin", &blob, Some(600)),
            ("/tmp/b.txt", b"line1\nline2\nline3\n", None),
        ],
        true,
    );
    let r = bin
        .http
        .post(execd(&bin, &id, "/files/upload"))
        .header("content-type", ctype)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    // Whole file.
    let r = bin
        .http
        .get(execd(
            &bin,
            &id,
            "/files/download?path=/workspace/deep/a.bin",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-length"], "5000");
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"a.bin\""
    );
    assert_eq!(r.bytes().await.unwrap().to_vec(), blob);
    // Ranges.
    let get_range = |range: &'static str| {
        bin.http
            .get(execd(
                &bin,
                &id,
                "/files/download?path=%2Fworkspace%2Fdeep%2Fa.bin",
            ))
            .header("Range", range)
            .send()
    };
    let r = get_range("bytes=100-199").await.unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.headers()["content-range"], "bytes 100-199/5000");
    assert_eq!(r.bytes().await.unwrap().to_vec(), blob[100..200].to_vec());
    let r = get_range("bytes=-10").await.unwrap();
    assert_eq!(r.bytes().await.unwrap().to_vec(), blob[4990..].to_vec());
    let r = get_range("bytes=4999-").await.unwrap();
    assert_eq!(r.bytes().await.unwrap().len(), 1);
    let r = get_range("bytes=5000-").await.unwrap();
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    // Lines 2..3 (1-based offset and limit).
    let r = bin
        .http
        .get(execd(
            &bin,
            &id,
            "/files/download?path=/tmp/b.txt&offset=2&limit=2",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "line2\nline3\n");
    // The guest sees the files at its paths, with the mode asked for.
    let x = bin.sh(&id, "wc -c < /workspace/deep/a.bin; stat -c %a /workspace/deep/a.bin; cat /tmp/b.txt | wc -l").await;
    assert_eq!(x.stdout(), vec!["5000", "600", "3"]);
    // Info.
    let (st, v) = bin.call(Method::GET, &format!("/v1/sandboxes/{id}/proxy/44772/files/info?path=/workspace/deep/a.bin&path=/tmp/b.txt"), None).await;
    assert_eq!(st, StatusCode::OK);
    let a = &v["/workspace/deep/a.bin"];
    assert_eq!(
        (a["size"].as_u64(), a["mode"].as_i64(), a["type"].as_str()),
        (Some(5000), Some(600), Some("file"))
    );
    assert_eq!(
        a["path"], "/workspace/deep/a.bin",
        "guest paths, never host paths"
    );
    assert!(a["owner"].is_string() && a["modified_at"].is_string() && a["created_at"].is_string());
    assert_eq!(v["/tmp/b.txt"]["mode"], 644, "the default mode");
    // Missing files.
    let r = bin
        .http
        .get(execd(&bin, &id, "/files/download?path=/workspace/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "FILE_NOT_FOUND");
    let (st, _) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/files/info?path=/nope"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let r = bin
        .http
        .get(execd(&bin, &id, "/files/download"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Delete.
    let r = bin
        .http
        .delete(execd(&bin, &id, "/files?path=/tmp/b.txt&path=/tmp/never"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(bin.sh(&id, "test -e /tmp/b.txt").await.exit_code(), Some(1));
    // Paths cannot climb out of the guest.
    let r = bin
        .http
        .get(execd(&bin, &id, "/files/download?path=/../../etc/passwd"))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn uploads_need_a_filename_on_the_metadata_part_like_execds_form_parser() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let (ctype, body) = multipart(&[("/workspace/x.txt", b"x", None)], false);
    let r = bin
        .http
        .post(execd(&bin, &id, "/files/upload"))
        .header("content-type", ctype)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json::<Value>().await.unwrap()["code"],
        "INVALID_FILE_METADATA"
    );
    let r = bin
        .http
        .post(execd(&bin, &id, "/files/upload"))
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        bin.sh(&id, "test -e /workspace/x.txt").await.exit_code(),
        Some(1)
    );
}

#[tokio::test]
async fn directories_create_list_and_delete() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let (st, _) = bin
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/proxy/44772/directories"),
            Some(json!({"/workspace/a/b": {"mode": 700}, "/workspace/c": {"mode": 755}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    bin.sh(
        &id,
        "echo 1 > /workspace/a/b/f; echo 2 > /workspace/z; ln -s /workspace/a /workspace/link",
    )
    .await;
    let (st, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/directories/list?path=/workspace"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let names = |v: &Value| -> Vec<(String, String)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["path"].as_str().unwrap().to_owned(),
                    e["type"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(
        names(&v),
        vec![
            ("/workspace/a".into(), "directory".into()),
            ("/workspace/c".into(), "directory".into()),
            ("/workspace/link".into(), "symlink".into()),
            ("/workspace/z".into(), "file".into()),
        ]
    );
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/directories/list?path=/workspace&depth=3"),
            None,
        )
        .await;
    let paths: Vec<String> = names(&v).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        vec![
            "/workspace/a",
            "/workspace/a/b",
            "/workspace/a/b/f",
            "/workspace/c",
            "/workspace/link",
            "/workspace/z"
        ],
        "depth-first, lexical, links not followed"
    );
    assert_eq!(v[1]["mode"], 700);
    let (st, _) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/directories/list?path=/workspace/link"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "a symlink path is refused");
    let (st, _) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/directories/list?path=/workspace/none"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let r = bin
        .http
        .delete(execd(&bin, &id, "/directories?path=/workspace/a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        bin.sh(&id, "test -e /workspace/a").await.exit_code(),
        Some(1)
    );
}

#[tokio::test]
async fn guest_path_puts_a_directory_in_front_of_path() {
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("python3");
    std::fs::write(&tool, "#!/bin/sh\necho fake-venv-python \"$@\"\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bin = Bin::spawn(&["--guest-path", dir.path().to_str().unwrap()]);
    let id = bin.create_id().await;
    let x = bin.sh(&id, "python3 -V").await;
    assert_eq!(x.stdout(), vec!["fake-venv-python -V"]);
    let x = bin.exec(&id, json!({"argv": ["python3", "x"]})).await;
    assert_eq!(x.stdout(), vec!["fake-venv-python x"]);
}
