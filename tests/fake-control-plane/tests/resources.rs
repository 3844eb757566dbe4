//! Templates, networks and disks.

mod common;

use std::time::Duration;

use common::{Fx, parse_frames};
use serde_json::{Value, json};

async fn wait_template(fx: &Fx, tid: &str, want: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let t = fx.get(&format!("/v1/templates/{tid}")).await.data().clone();
        if t["status"] == want {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "template never {want}: {t}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn template_builds_streams_logs_and_serves_as_rootfs() {
    let fx = Fx::new().await;
    let dockerfile = "FROM nodeops/sandbox:debian\nRUN pip install lfx\n";
    let created = fx
        .post(
            "/v1/templates",
            json!({"name": "langflow-runtime-template-01", "dockerfile": dockerfile}),
        )
        .await;
    let t = created.data().clone();
    let tid = t["id"].as_str().unwrap().to_owned();
    assert_eq!(t["status"], "pending");
    // Creating a sandbox from an unbuilt template is refused.
    let early = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "rootfs": tid}),
        )
        .await;
    assert_eq!(early.status, 400);
    let resp = fx
        .http
        .get(format!("{}/v1/templates/{tid}/logs?follow=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap();
    let frames = parse_frames(&resp.text().await.unwrap());
    let last = frames.last().unwrap();
    assert_eq!(last["final"], true);
    assert_eq!(last["status"], "ready");
    assert!(frames.iter().any(|f| {
        f["line"]
            .as_str()
            .unwrap_or("")
            .contains("RUN pip install lfx")
    }));
    let ready = wait_template(&fx, &tid, "ready").await;
    assert!(ready["built_at"].is_string());
    assert!(ready.get("dockerfile").is_none());
    let with_df = fx
        .get(&format!("/v1/templates/{tid}?include=dockerfile"))
        .await;
    assert_eq!(with_df.data()["dockerfile"], dockerfile);
    let logs = fx.get(&format!("/v1/templates/{tid}/logs")).await;
    assert_eq!(logs.status, 200);
    assert!(
        logs.text.contains("Step 2/2 : RUN pip install lfx"),
        "{}",
        logs.text
    );
    assert!(logs.body.is_null(), "logs are plain text, not JSend");
    let sb = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "rootfs": tid}),
        )
        .await;
    assert_eq!(sb.data()["rootfs"], tid.as_str());
    let templates = fx.get("/v1/templates").await;
    assert_eq!(templates.data()["pagination"]["total"], 1);
    assert_eq!(
        fx.delete(&format!("/v1/templates/{tid}")).await.data()["deleted"],
        true
    );
    assert_eq!(fx.get(&format!("/v1/templates/{tid}")).await.status, 404);
    assert_eq!(
        fx.post("/v1/templates", json!({"name": "x"})).await.status,
        400
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_template_build_ends_failed() {
    let fx = Fx::new().await;
    let t = fx
        .post(
            "/v1/templates",
            json!({"name": "broken", "dockerfile": "FROM x\nRUN false\nRUN never\n"}),
        )
        .await;
    let tid = t.data()["id"].as_str().unwrap().to_owned();
    let resp = fx
        .http
        .get(format!("{}/v1/templates/{tid}/logs?follow=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap();
    let frames = parse_frames(&resp.text().await.unwrap());
    assert_eq!(frames.last().unwrap()["status"], "failed");
    assert!(
        !frames
            .iter()
            .any(|f| f["line"].as_str().unwrap_or("").contains("RUN never"))
    );
    wait_template(&fx, &tid, "failed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn networks_track_members() {
    let fx = Fx::new().await;
    let n = fx
        .post(
            "/v1/networks",
            json!({"name": "demo-overlay-network-0000001"}),
        )
        .await;
    let nid = n.data()["id"].as_str().unwrap().to_owned();
    assert_eq!(n.data()["member_count"], 0);
    let a = fx.create(json!({"name": "member-a"})).await;
    let b = fx.create(json!({"networks": [{"id": nid}]})).await;
    let att = fx
        .post(&format!("/v1/sandboxes/{a}/networks"), json!({"id": nid}))
        .await;
    assert_eq!(att.data()["ok"], true);
    let got = fx.get(&format!("/v1/networks/{nid}")).await;
    let members = got.data()["members"].as_array().unwrap().clone();
    assert_eq!(members.len(), 2);
    let ma = members
        .iter()
        .find(|m| m["sandbox_id"] == a.as_str())
        .unwrap();
    assert_eq!(ma["status"], "running");
    assert_eq!(ma["name"], "member-a");
    assert!(ma["ip"].is_string());
    assert!(members.iter().any(|m| m["sandbox_id"] == b.as_str()));
    assert_eq!(
        fx.get("/v1/networks").await.data()["data"][0]["member_count"],
        2
    );
    assert_eq!(
        fx.delete(&format!("/v1/networks/{nid}")).await.status,
        409,
        "members first"
    );
    assert_eq!(
        fx.delete(&format!("/v1/sandboxes/{a}/networks/{nid}"))
            .await
            .data()["ok"],
        true
    );
    assert_eq!(
        fx.delete(&format!("/v1/sandboxes/{b}/networks/{nid}"))
            .await
            .data()["ok"],
        true
    );
    assert_eq!(
        fx.get(&format!("/v1/networks/{nid}")).await.data()["member_count"],
        0
    );
    assert_eq!(
        fx.delete(&format!("/v1/networks/{nid}")).await.data()["deleted"],
        true
    );
    assert_eq!(fx.get(&format!("/v1/networks/{nid}")).await.status, 404);
    let missing = fx
        .post(
            &format!("/v1/sandboxes/{a}/networks"),
            json!({"id": "net_nope"}),
        )
        .await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn disks_attach_only_to_running_sandboxes() {
    let fx = Fx::new().await;
    let body = json!({
        "name": "data-disk", "kind": "s3",
        "config": {"bucket": "b", "endpoint": "https://s3.example.test", "region": "eu"},
        "credentials": {"access_key": "AKIAFAKE", "secret_key": "very-secret-value"},
    });
    let d = fx.post("/v1/disks", body.clone()).await;
    let disk = d.data().clone();
    let did = disk["id"].as_str().unwrap().to_owned();
    assert!(did.starts_with("disk_"));
    assert_eq!(disk["config"]["bucket"], "b");
    assert!(
        !d.text.contains("very-secret-value") && !d.text.contains("AKIAFAKE"),
        "credentials never returned"
    );
    assert_eq!(fx.post("/v1/disks", body).await.status, 409);
    assert_eq!(
        fx.get("/v1/disks/data-disk").await.data()["id"],
        did.as_str(),
        "by name"
    );
    assert_eq!(
        fx.post("/v1/disks", json!({"name": "Bad Name"}))
            .await
            .status,
        400
    );
    let sb = fx.create(json!({})).await;
    fx.post(&format!("/v1/sandboxes/{sb}/pause"), json!({}))
        .await
        .data();
    let paused = fx
        .post(
            &format!("/v1/sandboxes/{sb}/disks"),
            json!({"disk_id": did, "mount_path": "/mnt/data"}),
        )
        .await;
    assert_eq!(paused.status, 409);
    fx.post(&format!("/v1/sandboxes/{sb}/resume"), json!({}))
        .await
        .data();
    fx.wait_status(&sb, "running").await;
    let bad_sub = fx
        .post(
            &format!("/v1/sandboxes/{sb}/disks"),
            json!({"disk_id": did, "mount_path": "/mnt/data", "sub_path": "../x"}),
        )
        .await;
    assert_eq!(bad_sub.status, 400);
    let att = fx
        .post(
            &format!("/v1/sandboxes/{sb}/disks"),
            json!({"disk_id": did, "mount_path": "/mnt/data", "sub_path": "p"}),
        )
        .await;
    assert_eq!(att.data()["id"], sb.as_str());
    assert_eq!(att.data()["ok"], true);
    let mounts = fx.get(&format!("/v1/sandboxes/{sb}/disks")).await;
    let m = &mounts.data()["data"][0];
    assert_eq!(m["disk_id"], did.as_str());
    assert_eq!(m["mount_path"], "/mnt/data");
    assert_eq!(m["mount_status"], "mounted");
    let no_path = fx.delete(&format!("/v1/sandboxes/{sb}/disks/{did}")).await;
    assert_eq!(no_path.status, 400, "detach needs mount_path");
    let det = fx
        .delete(&format!(
            "/v1/sandboxes/{sb}/disks/{did}?mount_path=/mnt/data"
        ))
        .await;
    assert_eq!(det.data()["detached"], true);
    let rot = fx
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/disks/{did}"),
            Some(&fx.key),
            Some(json!({"credentials": {"access_key": "A2", "secret_key": "S2"}})),
        )
        .await;
    assert_eq!(rot.data()["id"], did.as_str());
    assert_eq!(
        fx.delete("/v1/disks/data-disk").await.data()["deleted"],
        true
    );
    assert_eq!(fx.get(&format!("/v1/disks/{did}")).await.status, 404);
}
