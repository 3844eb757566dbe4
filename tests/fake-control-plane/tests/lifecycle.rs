//! Pause/resume, fork, patch, resize, ssh keys, bandwidth, hosts and destroy cleanup, over HTTP.

mod common;

use common::{Fx, eventually, pid_alive};
use serde_json::json;

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
    assert_eq!(fx.server.stats().created, 3);
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
