//! The real `createos-fake` binary: CLI, first line, exec through HTTP, SIGTERM cleanup.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{client, eventually, pid_alive};
use serde_json::{Value, json};

struct Bin {
    child: Child,
    url: String,
    rest: std::thread::JoinHandle<String>,
}

impl Drop for Bin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Bin {
    let mut child = Command::new(env!("CARGO_BIN_EXE_createos-fake"))
        .args(["--port", "0", "--api-key", "bin-key"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn createos-fake");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).expect("first line");
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    Bin { child, url, rest }
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_serves_python_exec_and_cleans_up_on_sigterm() {
    let mut bin = start(&["--faults", "whoami=503#1", "--latency-ms", "1"]);
    let http = client();
    let health: Value = http
        .get(format!("{}/healthz", bin.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["data"]["up"], true);
    // The CLI fault spec is active.
    let w = http
        .get(format!("{}/v1/whoami", bin.url))
        .header("X-Api-Key", "bin-key")
        .send()
        .await
        .unwrap();
    assert_eq!(w.status().as_u16(), 503);
    let w = http
        .get(format!("{}/v1/whoami", bin.url))
        .header("X-Api-Key", "bin-key")
        .send()
        .await
        .unwrap();
    assert_eq!(w.status().as_u16(), 200);
    let created: Value = http
        .post(format!("{}/v1/sandboxes", bin.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"shape": "s-2vcpu-4gb"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["data"]["id"].as_str().unwrap().to_owned();
    let exec: Value = http
        .post(format!("{}/v1/sandboxes/{id}/exec", bin.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"cmd": "python3", "args": ["-c", "print(1)"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(exec["data"]["result"]["stdout"], "1\n");
    assert_eq!(exec["data"]["result"]["exit_code"], 0);
    // A background guest process is killed when the server gets SIGTERM.
    let bg: Value = http
        .post(format!("{}/v1/sandboxes/{id}/exec", bin.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"cmd": "sh", "args": ["-c", "sleep 60 >/dev/null 2>&1 & echo $!"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pid: i32 = bg["data"]["result"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(pid));
    let server_pid = bin.child.id().to_string();
    let st = Command::new("kill")
        .args(["-TERM", &server_pid])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = bin.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "clean exit: {status:?}");
    eventually("guest processes to die with the server", || !pid_alive(pid)).await;
    let rest = std::mem::replace(&mut bin.rest, std::thread::spawn(String::new))
        .join()
        .unwrap();
    assert!(
        rest.contains("NO isolation"),
        "start-up warning printed: {rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_rejects_a_bad_fault_spec() {
    let out = Command::new(env!("CARGO_BIN_EXE_createos-fake"))
        .args(["--port", "0", "--faults", "nowhere=500"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown route"));
}
