//! A session's account over CreateOS's HTTP client (moved here from sandbox-core's `session`
//! tests with the client): an unreachable control plane fails naming its URL and both settings.

use std::time::Duration;

use sandbox_core::ErrorKind;
use sandbox_core::control::DEFAULT_REQUEST_TIMEOUT;
use sandbox_core::retry::Backoff;
use sandbox_core::session::Session;
use sandbox_core::settings::{ENV_BASE_URL, ENV_CONTROL_PLANE_RETRY, Settings};

#[tokio::test]
async fn an_unreachable_control_plane_fails_naming_its_url_and_both_settings() {
    // A loopback port nothing listens on: every connect is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let key = "sk-session-test-123456";
    let lookup = |k: &str| match k {
        "CREATEOS_SANDBOX_API_KEY" => Some(key.to_owned()),
        ENV_BASE_URL => Some(url.clone()),
        _ => None,
    };
    let settings = Settings::from_lookup(&lookup).unwrap();
    let account = Session::new(sandbox_createos::http_connector(), DEFAULT_REQUEST_TIMEOUT)
        .account(&settings)
        .unwrap();
    let backoff = Backoff {
        base: Duration::from_millis(10),
        max: Duration::from_millis(20),
        budget: Duration::from_millis(400),
    };
    let started = std::time::Instant::now();
    let (cred, shapes) = account.preflight(&backoff, &settings.redactor()).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for err in [cred.unwrap_err(), shapes.unwrap_err()] {
        let m = err.message();
        assert_eq!(err.kind(), ErrorKind::Transient, "{m}");
        assert!(
            m.contains(&format!("control plane at {url} ({ENV_BASE_URL})")),
            "{m}"
        );
        assert!(
            m.contains(&format!("0.4 s of retries ({ENV_CONTROL_PLANE_RETRY})")),
            "{m}"
        );
        assert!(!m.contains(key), "{m}");
    }
}
