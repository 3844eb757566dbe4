//! Pause/resume, fork, patch, resize, ssh keys, bandwidth, hosts and destroy cleanup, over HTTP.

mod common;

use std::time::Duration;

use common::{Fx, eventually, fast, pid_alive};
use createos_fake::FakeOptions;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn pause_then_resume_goes_through_resuming() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let r = fx
        .exec(&id, "sh", &["-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
        .await;
    let pid: i32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    let p = fx
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(p.data()["status"], "paused");
    assert!(p.data()["paused_at"].is_string());
    // A paused guest's processes are frozen (stopped), as in a paused VM.
    eventually("the guest process to be stopped", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
        })
    })
    .await;
    let r = fx
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(
        r.data()["status"],
        "resuming",
        "resume answers while still resuming"
    );
    let sb = fx.wait_status(&id, "running").await;
    assert!(sb["last_resumed_at"].is_string());
    assert!(pid_alive(pid));
    assert_eq!(fx.exec(&id, "echo", &["back"]).await["stdout"], "back\n");
    // Resuming a running guest is a no-op; pausing a destroyed one is refused.
    assert_eq!(
        fx.post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
            .await
            .data()["status"],
        "running"
    );
    fx.delete(&format!("/v1/sandboxes/{id}")).await.data();
    eventually("destroy to kill guest processes", || !pid_alive(pid)).await;
    let again = fx
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(again.status, 409);
}

#[tokio::test(flavor = "multi_thread")]
async fn destroy_removes_the_guest_directory() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let pwd = fx.exec(&id, "pwd", &[]).await["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    assert!(std::path::Path::new(&pwd).is_dir());
    fx.delete(&format!("/v1/sandboxes/{id}")).await.data();
    fx.wait_status(&id, "destroyed").await;
    assert!(!std::path::Path::new(&pwd).exists(), "{pwd} removed");
    let r = fx
        .post(&format!("/v1/sandboxes/{id}/exec"), json!({"cmd": "true"}))
        .await;
    assert_eq!(r.status, 409);
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_copies_files_and_then_diverges() {
    let fx = Fx::new().await;
    let src = fx
        .create(json!({"envs": {"K": "v"}, "egress": ["240.0.0.0/4"]}))
        .await;
    fx.upload(&src, "/workspace/shared.txt", b"original".to_vec())
        .await;
    fx.upload(&src, "/root/.config/x", b"cfg".to_vec()).await;
    fx.post(&format!("/v1/sandboxes/{src}/pause"), json!({}))
        .await
        .data();
    let f = fx
        .post(
            &format!("/v1/sandboxes/{src}/fork"),
            json!({"start_paused": true, "ingress_enabled": false}),
        )
        .await;
    let fork = f.data().clone();
    let fid = fork["id"].as_str().unwrap().to_owned();
    assert_ne!(fid, src);
    assert_eq!(fork["forked_from"], src.as_str());
    assert_eq!(fork["status"], "paused");
    assert_eq!(fork["envs"], json!(["K"]));
    assert_eq!(fork["egress"], json!(["240.0.0.0/4"]));
    fx.post(&format!("/v1/sandboxes/{fid}/resume"), json!({}))
        .await
        .data();
    fx.post(&format!("/v1/sandboxes/{src}/resume"), json!({}))
        .await
        .data();
    fx.wait_status(&fid, "running").await;
    fx.wait_status(&src, "running").await;
    assert_eq!(
        fx.exec(&fid, "cat", &["/workspace/shared.txt"]).await["stdout"],
        "original"
    );
    assert_eq!(
        fx.exec(&fid, "cat", &["/root/.config/x"]).await["stdout"],
        "cfg"
    );
    fx.upload(&fid, "/workspace/shared.txt", b"fork".to_vec())
        .await;
    fx.upload(&src, "/workspace/only-src.txt", b"src".to_vec())
        .await;
    assert_eq!(
        fx.exec(&src, "cat", &["/workspace/shared.txt"]).await["stdout"],
        "original"
    );
    assert_ne!(
        fx.exec(&fid, "cat", &["/workspace/only-src.txt"]).await["exit_code"],
        0
    );
    // A fork without start_paused runs.
    let f2 = fx
        .post(&format!("/v1/sandboxes/{src}/fork"), json!({}))
        .await;
    assert_eq!(f2.data()["status"], "running");
    assert_eq!(fx.stats().await.created, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn ingress_template_follows_patch() {
    let fx = Fx::new().await;
    let id = fx.create(json!({"ingress_enabled": true})).await;
    let sb = fx.get(&format!("/v1/sandboxes/{id}")).await.data().clone();
    assert!(
        sb["ingress_url_template"]
            .as_str()
            .unwrap()
            .contains("<port>")
    );
    assert_eq!(sb["ingress_enabled"], true);
    let off = fx
        .patch(
            &format!("/v1/sandboxes/{id}"),
            json!({"ingress_enabled": false}),
        )
        .await;
    assert!(off.data().get("ingress_url_template").is_none());
    assert_eq!(off.data()["ingress_enabled"], false);
    let on = fx
        .patch(
            &format!("/v1/sandboxes/{id}"),
            json!({"ingress_enabled": true}),
        )
        .await;
    assert!(
        on.data()["ingress_url_template"]
            .as_str()
            .unwrap()
            .contains("<port>")
    );
    let bad = fx
        .patch(
            &format!("/v1/sandboxes/{id}"),
            json!({"ingress_enabled": "yes"}),
        )
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn resize_ssh_keys_bandwidth_and_hosts() {
    let fx = Fx::new().await;
    let id = fx
        .create(json!({"ssh_pubkeys": ["ssh-ed25519 AAA a"]}))
        .await;
    let disk = fx.get(&format!("/v1/sandboxes/{id}")).await.data()["disk_mib"]
        .as_u64()
        .unwrap();
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/resize"),
            json!({"disk_mib": disk + 1024}),
        )
        .await;
    assert_eq!(r.data(), &json!({"id": id, "disk_mib": disk + 1024}));
    let shrink = fx
        .post(
            &format!("/v1/sandboxes/{id}/resize"),
            json!({"disk_mib": 1}),
        )
        .await;
    assert_eq!(shrink.status, 400);
    let k = fx
        .post(
            &format!("/v1/sandboxes/{id}/ssh-pubkeys"),
            json!({"keys": ["ssh-ed25519 AAA a", "ssh-ed25519 BBB b"]}),
        )
        .await;
    assert_eq!(k.data()["count"], 2, "de-duplicated total");
    let bw = fx.get(&format!("/v1/sandboxes/{id}/bandwidth")).await;
    assert_eq!(bw.data()["quota_bytes"], -1);
    assert_eq!(bw.data()["capped"], false);
    let rc = fx
        .post(
            &format!("/v1/sandboxes/{id}/bandwidth/recharge"),
            json!({"add_bytes": 10}),
        )
        .await;
    assert_eq!(rc.data()["id"], id);
    let bad = fx
        .post(
            &format!("/v1/sandboxes/{id}/bandwidth/recharge"),
            json!({"add_bytes": 0}),
        )
        .await;
    assert_eq!(bad.status, 400);
    let hosts = fx.get("/v1/hosts").await;
    let h = &hosts.data()["data"][0];
    assert_eq!(h["status"], "active");
    assert_eq!(h["vm_count"], 1);
    assert!(
        h["rootfses"]
            .as_array()
            .unwrap()
            .contains(&json!("devbox:1"))
    );
}

/// Transitional delays long enough to observe, short enough to keep the suite quick.
fn with_delays(create: u64, pause: u64, fork: u64) -> FakeOptions {
    FakeOptions {
        create_delay: Duration::from_millis(create),
        pause_delay: Duration::from_millis(pause),
        fork_delay: Duration::from_millis(fork),
        ..fast()
    }
}

/// Asserts a 409 JSend `error` whose message contains `needle`.
fn assert_conflict(r: &common::Resp, needle: &str) {
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.body["status"], "error", "{r:?}");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains(needle),
        "{needle:?} not in {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_delays_create_pause_and_fork_answer_their_final_states() {
    let fx = Fx::new().await;
    let created = fx
        .post("/v1/sandboxes", json!({"shape": "s-1vcpu-256mb"}))
        .await;
    assert_eq!(created.data()["status"], "running");
    assert!(created.data()["ip"].is_string());
    let id = created.data()["id"].as_str().unwrap().to_owned();
    let fork = fx
        .post(&format!("/v1/sandboxes/{id}/fork"), json!({}))
        .await;
    assert_eq!(fork.data()["status"], "running");
    let paused = fx
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(paused.data()["status"], "paused");
}

#[tokio::test(flavor = "multi_thread")]
async fn create_delay_answers_creating_without_ip_then_running() {
    let fx = Fx::with(with_delays(600, 0, 0)).await;
    let r = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "slow-boot"}),
        )
        .await;
    let sb = r.data().clone();
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["status"], "creating");
    assert!(sb.get("ip").is_none(), "no ip while creating: {sb}");
    assert!(sb.get("running_at").is_none(), "{sb}");
    let got = fx.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(got.data()["status"], "creating");
    assert!(got.data().get("ip").is_none());
    let listed = fx.get("/v1/sandboxes?status=creating").await;
    assert_eq!(listed.data()["pagination"]["total"], 1);
    // Exec, files, processes and pause refuse a guest that is not running yet.
    let exec = fx
        .post(&format!("/v1/sandboxes/{id}/exec"), json!({"cmd": "true"}))
        .await;
    assert_conflict(&exec, "sandbox is creating");
    assert_conflict(
        &fx.upload(&id, "/workspace/x", b"x".to_vec()).await,
        "sandbox is creating",
    );
    let get_file = fx
        .get(&format!("/v1/sandboxes/{id}/files?path=/workspace/x"))
        .await;
    assert_conflict(&get_file, "sandbox is creating");
    let proc = fx
        .post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_conflict(&proc, "sandbox is creating");
    assert_eq!(
        fx.post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
            .await
            .status,
        409
    );
    // The name is already taken while creating.
    let dup = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "slow-boot"}),
        )
        .await;
    assert_eq!(dup.status, 409);
    let running = fx.wait_status(&id, "running").await;
    assert!(running["ip"].is_string(), "{running}");
    assert!(running["running_at"].is_string(), "{running}");
    assert_eq!(fx.exec(&id, "echo", &["up"]).await["stdout"], "up\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_while_creating_never_becomes_running() {
    let fx = Fx::with(with_delays(400, 0, 0)).await;
    let id = fx.create(json!({})).await;
    let del = fx.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(del.data()["status"], "destroying");
    fx.wait_status(&id, "destroyed").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["status"],
        "destroyed",
        "the stale creating -> running transition is dropped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_delay_answers_pausing_then_paused() {
    let fx = Fx::with(with_delays(0, 600, 0)).await;
    let id = fx.create(json!({})).await;
    let r = fx
        .exec(&id, "sh", &["-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
        .await;
    let pid: i32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    let p = fx
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(p.data()["status"], "pausing");
    // A second pause while pausing is accepted and changes nothing.
    let again = fx
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(again.data()["status"], "pausing");
    // Exec and files on a pausing guest get the paused guest's 409 (the remedy is the same).
    let exec = fx
        .post(&format!("/v1/sandboxes/{id}/exec"), json!({"cmd": "true"}))
        .await;
    assert_conflict(&exec, "sandbox is paused; resume it before accessing files");
    assert_conflict(
        &fx.upload(&id, "/workspace/x", b"x".to_vec()).await,
        "sandbox is paused; resume it before accessing files",
    );
    // Resume must wait until the pause has completed.
    assert_eq!(
        fx.post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
            .await
            .status,
        409
    );
    let paused = fx.wait_status(&id, "paused").await;
    assert!(paused["paused_at"].is_string(), "{paused}");
    eventually("the guest process to be stopped once paused", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
        })
    })
    .await;
    let resumed = fx
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(resumed.data()["status"], "resuming");
    fx.wait_status(&id, "running").await;
    assert!(pid_alive(pid));
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_delay_answers_forking_then_running_or_paused() {
    let fx = Fx::with(with_delays(0, 0, 600)).await;
    let src = fx.create(json!({})).await;
    fx.upload(&src, "/workspace/a.txt", b"from source".to_vec())
        .await
        .data();
    let f = fx
        .post(&format!("/v1/sandboxes/{src}/fork"), json!({}))
        .await;
    let fork: Value = f.data().clone();
    let fid = fork["id"].as_str().unwrap().to_owned();
    assert_ne!(fid, src);
    assert_eq!(fork["status"], "forking");
    assert_eq!(fork["forked_from"], src.as_str());
    let exec = fx
        .post(&format!("/v1/sandboxes/{fid}/exec"), json!({"cmd": "true"}))
        .await;
    assert_conflict(&exec, "sandbox is forking");
    fx.wait_status(&fid, "running").await;
    assert_eq!(
        fx.exec(&fid, "cat", &["/workspace/a.txt"]).await["stdout"],
        "from source"
    );
    // start_paused: forking, then paused.
    let p = fx
        .post(
            &format!("/v1/sandboxes/{src}/fork"),
            json!({"start_paused": true}),
        )
        .await;
    assert_eq!(p.data()["status"], "forking");
    let pid = p.data()["id"].as_str().unwrap().to_owned();
    let paused = fx.wait_status(&pid, "paused").await;
    assert!(paused["paused_at"].is_string(), "{paused}");
    // The source stayed running throughout.
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{src}")).await.data()["status"],
        "running"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn peak_live_and_the_account_quota() {
    let fx = Fx::with(FakeOptions {
        max_live: 2,
        ..fast()
    })
    .await;
    let a = fx.create(json!({})).await;
    let _b = fx.create(json!({})).await;
    // A third while two are live: the account's quota, 429 with the fake's usual
    // `Retry-After: 0` (a fault rule `create=429+ra=none` models an answer without one).
    let over = fx
        .post("/v1/sandboxes", json!({"shape": "s-1vcpu-256mb"}))
        .await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(over.headers.get("retry-after").unwrap(), "0", "{over:?}");
    assert!(over.text.contains("quota"), "{over:?}");
    fx.delete(&format!("/v1/sandboxes/{a}")).await;
    let _c = fx.create(json!({})).await;
    let s = fx.stats().await;
    assert_eq!(
        (s.created, s.live, s.peak_live, s.quota_refusals),
        (3, 2, 2, 1)
    );
    // The quota is set at run time through the control route (0: none).
    let set = fx
        .http
        .put(fx.control("max-live?n=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status().as_u16(), 200);
    let _d = fx.create(json!({})).await;
    assert_eq!(fx.stats().await.peak_live, 3);
}
