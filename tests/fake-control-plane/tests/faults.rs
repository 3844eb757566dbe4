//! Fault and latency injection, stats, reset and the injectable clock, through the binary over HTTP.

mod common;

use std::time::Duration;

use common::{Fx, client, eventually, eventually_async, fast, pid_alive};
use createos_fake::FakeOptions;
use futures::StreamExt;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn status_faults_fire_count_times_and_skip_processing() {
    let fx = Fx::with(FakeOptions {
        faults: "create=503#2;whoami=429".into(),
        ..fast()
    })
    .await;
    for _ in 0..2 {
        let r = fx
            .post("/v1/sandboxes", json!({"shape": "s-1vcpu-256mb"}))
            .await;
        assert_eq!(r.status, 503);
        assert_eq!(r.body["status"], "error");
        assert_eq!(r.body["code"], 503);
        assert_eq!(r.headers["retry-after"], "0");
        assert!(r.headers.contains_key("x-request-id"));
    }
    assert_eq!(
        fx.stats().await.created,
        0,
        "faulted creates are not processed"
    );
    fx.create(json!({})).await;
    assert_eq!(fx.stats().await.created, 1);
    let w = fx.get("/v1/whoami").await;
    assert_eq!(w.status, 429);
    assert_eq!(w.headers["retry-after"], "0");
    // Replace the rules at runtime.
    fx.set_faults("").await.unwrap();
    assert_eq!(fx.get("/v1/whoami").await.status, 200);
    assert!(fx.set_faults("bogus=1").await.is_err());
    fx.set_faults("*=500").await.unwrap();
    assert_eq!(fx.get("/v1/shapes").await.status, 500);
    // The HTTP control route does the same, and refuses a bad spec.
    let bad = fx
        .http
        .put(format!("{}/_fake/faults", fx.url))
        .body("create=zzz")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    let good = fx
        .http
        .put(format!("{}/_fake/faults", fx.url))
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(good.status().as_u16(), 200);
    assert_eq!(fx.get("/v1/shapes").await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_closes_the_connection_without_processing() {
    let fx = Fx::with(FakeOptions {
        faults: "create=reset#1".into(),
        ..fast()
    })
    .await;
    let err = fx
        .http
        .post(format!("{}/v1/sandboxes", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"shape": "s-1vcpu-256mb"}))
        .send()
        .await
        .expect_err("the connection is closed without a response");
    assert!(!err.is_status());
    assert_eq!(fx.stats().await.created, 0);
    assert_eq!(
        fx.get("/v1/sandboxes").await.data()["pagination"]["total"],
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_after_processes_then_loses_the_response() {
    let fx = Fx::with(FakeOptions {
        faults: "create=reset-after#1".into(),
        ..fast()
    })
    .await;
    let res = fx
        .http
        .post(format!("{}/v1/sandboxes", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"shape": "s-1vcpu-256mb", "name": "lost-response"}))
        .send()
        .await;
    assert!(res.is_err(), "no response arrives");
    assert_eq!(
        fx.stats().await.created,
        1,
        "the sandbox was created anyway"
    );
    let list = fx.get("/v1/sandboxes").await;
    assert_eq!(list.data()["data"][0]["name"], "lost-response");
}

#[tokio::test(flavor = "multi_thread")]
async fn stall_never_answers() {
    let fx = Fx::with(FakeOptions {
        faults: "get=stall".into(),
        ..fast()
    })
    .await;
    let id = fx.create(json!({})).await;
    let short = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = short
        .get(format!("{}/v1/sandboxes/{id}", fx.url))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .expect_err("stalled");
    assert!(err.is_timeout());
    // Other routes still answer.
    assert_eq!(fx.get("/v1/sandboxes").await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn stall_mid_streams_output_then_goes_silent() {
    let fx = Fx::with(FakeOptions {
        faults: "exec_stream=stall-mid".into(),
        heartbeat: Duration::from_millis(20),
        ..fast()
    })
    .await;
    let id = fx.create(json!({})).await;
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec?stream=true", fx.url))
        .header("X-Api-Key", &fx.key)
        .json(&json!({"cmd": "echo", "args": ["so far"], "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let frame: Value = serde_json::from_slice(first.trim_ascii()).unwrap();
    assert_eq!(frame["stdout"], "so far\n");
    // No heartbeat and no exit frame follow, yet the connection stays open.
    let next = tokio::time::timeout(Duration::from_millis(400), body.next()).await;
    assert!(next.is_err(), "nothing more is sent: {next:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn body_faults_echo_redirect_text_huge_malformed() {
    let fx = Fx::with(FakeOptions {
        faults: "whoami=echo-headers;list=redirect;shapes=text;get=huge;hosts=malformed".into(),
        ..fast()
    })
    .await;
    let echo = fx
        .send(
            reqwest::Method::GET,
            "/v1/whoami",
            Some("k-secret-visible"),
            None,
        )
        .await;
    assert_eq!(echo.status, 500);
    assert_eq!(echo.body["status"], "error");
    assert!(
        echo.body["message"]
            .as_str()
            .unwrap()
            .contains("x-api-key: k-secret-visible")
    );
    let redirect = fx.get("/v1/sandboxes").await;
    assert_eq!(redirect.status, 307);
    assert_eq!(redirect.headers["location"], "http://127.0.0.1:1/elsewhere");
    let text = fx.get("/v1/shapes").await;
    assert_eq!(text.status, 500);
    assert_eq!(text.text, "internal oops");
    let huge = fx.get("/v1/sandboxes/whatever").await;
    assert_eq!(huge.status, 404);
    assert_eq!(huge.text.len(), 8 * 1024 * 1024);
    let bad = fx.get("/v1/hosts").await;
    assert_eq!(bad.status, 200);
    assert!(serde_json::from_str::<Value>(&bad.text).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_is_added_to_every_api_request() {
    let fx = Fx::with(FakeOptions {
        latency: Duration::from_millis(800),
        ..fast()
    })
    .await;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let err = impatient
        .get(format!("{}/healthz", fx.url))
        .send()
        .await
        .expect_err("slowed down");
    assert!(err.is_timeout());
    // Control routes are not slowed down.
    let ok = impatient
        .get(format!("{}/_fake/stats", fx.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_and_reset_over_http() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    fx.exec(&id, "true", &[]).await;
    let stats: Value = client()
        .get(format!("{}/_fake/stats", fx.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let s = &stats["data"];
    assert_eq!(s["created"], 1);
    assert_eq!(s["live"], 1);
    assert_eq!(s["destroyed"], 0);
    assert_eq!(s["requests"]["create"], 1);
    assert_eq!(s["requests"]["exec"], 1);
    assert_eq!(s["peak_concurrent_execs"], 1);
    // A guest process survives until reset, which kills it and drops every guest.
    let r = fx
        .exec(&id, "sh", &["-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
        .await;
    let pid: i32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(pid_alive(pid));
    let reset = client()
        .post(format!("{}/_fake/reset", fx.url))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status().as_u16(), 200);
    eventually("reset to kill guest processes", || !pid_alive(pid)).await;
    assert_eq!(
        fx.get("/v1/sandboxes").await.data()["pagination"]["total"],
        0
    );
    let after = fx.stats().await;
    assert_eq!((after.created, after.live, after.destroyed), (0, 0, 0));
    assert_eq!(fx.get(&format!("/v1/sandboxes/{id}")).await.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_pause_follows_the_injectable_clock_and_exec_activity() {
    let fx = Fx::new().await;
    let id = fx.create(json!({"auto_pause_after_seconds": 60})).await;
    fx.advance_clock(Duration::from_secs(50)).await;
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["status"],
        "running"
    );
    fx.exec(&id, "true", &[]).await; // touches the activity clock
    fx.advance_clock(Duration::from_secs(30)).await;
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["status"],
        "running"
    );
    // Files and GETs are not activity.
    fx.upload(&id, "/workspace/x", b"x".to_vec()).await;
    let adv = client()
        .post(format!("{}/_fake/clock/advance?seconds=31", fx.url))
        .send()
        .await
        .unwrap();
    assert_eq!(adv.status().as_u16(), 200);
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["status"],
        "paused"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_quiet_exec_gets_paused_and_continues_after_resume() {
    let fx = Fx::new().await;
    let id = fx.create(json!({"auto_pause_after_seconds": 60})).await;
    let url = format!("{}/v1/sandboxes/{id}/exec", fx.url);
    let http = fx.http.clone();
    let key = fx.key.clone();
    let quiet = tokio::spawn(async move {
        http.post(url)
            .header("X-Api-Key", key)
            .json(&json!({"cmd": "sh", "args": ["-c", "while [ ! -f /workspace/go ]; do sleep 0.02; done; echo finished"]}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    eventually_async("the exec to be in flight", || async {
        fx.stats().await.peak_concurrent_execs == 1
    })
    .await;
    fx.advance_clock(Duration::from_secs(61)).await;
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["status"],
        "paused"
    );
    assert!(!quiet.is_finished());
    let r = fx
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(r.data()["status"], "resuming");
    fx.wait_status(&id, "running").await;
    fx.upload(&id, "/workspace/go", b"1".to_vec()).await;
    let done = tokio::time::timeout(Duration::from_secs(10), quiet)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done["data"]["result"]["stdout"], "finished\n");
}

/// `n` owner-key GETs of `/v1/whoami`; how many got the injected 503.
async fn count_503(fx: &Fx, n: usize) -> usize {
    let mut fired = 0;
    for _ in 0..n {
        let r = fx.get("/v1/whoami").await;
        match r.status {
            503 => fired += 1,
            200 => {}
            other => panic!("unexpected status {other}: {r:?}"),
        }
    }
    fired
}

#[tokio::test(flavor = "multi_thread")]
async fn fault_probability_is_honoured_over_http() {
    // @0 never fires (set on the command line).
    let fx = Fx::with(FakeOptions {
        faults: "whoami=503@0".into(),
        ..fast()
    })
    .await;
    assert_eq!(count_503(&fx, 100).await, 0, "@0 never fires");
    // @1 always fires.
    fx.set_faults("whoami=503@1").await.unwrap();
    assert_eq!(count_503(&fx, 100).await, 100, "@1 always fires");
    // @0.5 fires on some but not all: 200 draws of a fair coin land in 20%..80% with a
    // probability of failure far below 1e-15.
    fx.set_faults("whoami=503@0.5").await.unwrap();
    let fired = count_503(&fx, 200).await;
    assert!((40..=160).contains(&fired), "@0.5 fired {fired}/200 times");
    // A probability combines with a count: at most #COUNT firings whatever the draws.
    fx.set_faults("whoami=503@0.5#3").await.unwrap();
    assert!(count_503(&fx, 100).await <= 3);
    // Out-of-range probabilities are refused.
    assert!(fx.set_faults("whoami=503@1.5").await.is_err());
    assert!(fx.set_faults("whoami=503@-1").await.is_err());
    assert_eq!(
        fx.stats().await.requests.get("whoami"),
        Some(&500),
        "every request was counted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn status_faults_carry_the_retry_after_they_are_given() {
    let fx = Fx::with(FakeOptions {
        faults: "create=429+ra=0;whoami=503+ra=2#1;shapes=429+ra=none".into(),
        ..fast()
    })
    .await;
    let r = fx
        .post("/v1/sandboxes", json!({"shape": "s-1vcpu-256mb"}))
        .await;
    assert_eq!(
        (r.status, r.headers["retry-after"].to_str().unwrap()),
        (429, "0")
    );
    let r = fx.get("/v1/whoami").await;
    assert_eq!(
        (r.status, r.headers["retry-after"].to_str().unwrap()),
        (503, "2")
    );
    assert_eq!(fx.get("/v1/whoami").await.status, 200, "#1 fired once");
    let r = fx.get("/v1/shapes").await;
    assert_eq!(r.status, 429);
    assert!(!r.headers.contains_key("retry-after"), "{:?}", r.headers);
    // Through the control route too, garbage included.
    fx.set_faults("*=429+ra=garbage").await.unwrap();
    let r = fx.get("/v1/whoami").await;
    assert_eq!(
        (r.status, r.headers["retry-after"].to_str().unwrap()),
        (429, "garbage")
    );
    fx.set_faults("exec_stream=503+ra=Wed, 21 Oct 2015 07:28:00 GMT")
        .await
        .unwrap();
    let id = fx.create(json!({})).await;
    let r = fx
        .post(
            &format!("/v1/sandboxes/{id}/exec?stream=true"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "Wed, 21 Oct 2015 07:28:00 GMT");
    assert!(fx.set_faults("create=reset+ra=1").await.is_err());
    assert!(fx.set_faults("create=503+ra=").await.is_err());
}
