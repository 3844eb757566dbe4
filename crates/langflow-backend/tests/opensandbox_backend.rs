//! `LANGFLOW_SANDBOX_BACKEND=opensandbox`'s Rust half against the OpenSandbox fake.

use std::collections::BTreeMap;

use langflow_backend::LfxPolicy;
use langflow_backend::opensandbox::{OpenSandboxBackend, capabilities_with};
use opensandbox_fake::{Config, FakeOptions, FakeServer, Runtime, SecureRuntime};

const KEY: &str = "backend-os-key-41";

fn lookup(
    url: String,
    extra: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
    move |name| match name {
        "OPEN_SANDBOX_DOMAIN" => Some(url.clone()),
        "OPEN_SANDBOX_API_KEY" => Some(KEY.into()),
        _ => extra
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned()),
    }
}

#[test]
fn isolation_is_declared_only_when_attested() {
    let caps = capabilities_with(|_| None);
    assert_eq!(caps.isolation, "container");
    assert!(caps.supports_deny_all_egress && caps.supports_domain_allowlist);
    let caps = capabilities_with(|n| {
        (n == "OPEN_SANDBOX_ATTEST_ISOLATION").then(|| "hardware-virtualized".to_owned())
    });
    assert_eq!(caps.isolation, "hardware-virtualized");
    let caps =
        capabilities_with(|n| (n == "OPEN_SANDBOX_ATTEST_ISOLATION").then(|| "vm".to_owned()));
    assert_eq!(caps.isolation, "none");
}

#[test]
fn doctor_warns_of_an_attestation_without_the_host_kernel() {
    use langflow_backend::DoctorLevel;
    use langflow_backend::opensandbox::{host_kernel_line, isolation_lines};
    use sandbox_opensandbox::OpenSandboxSettings;
    let read = |pairs: &'static [(&'static str, &'static str)]| {
        OpenSandboxSettings::from_lookup(move |n| {
            pairs
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap()
    };
    let attested = read(&[("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized")]);
    let line = host_kernel_line(&attested).expect("a warning");
    assert_eq!(line.level, DoctorLevel::Warn);
    assert_eq!(line.setting.as_deref(), Some("OPEN_SANDBOX_HOST_KERNEL"));
    assert!(line.text.contains("uname -r"), "{}", line.text);
    assert!(
        isolation_lines(&attested)
            .iter()
            .any(|l| l.setting.as_deref() == Some("OPEN_SANDBOX_HOST_KERNEL"))
    );
    // Set, or nothing attested (the probe does not run): nothing to warn about.
    let named = read(&[
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
        ("OPEN_SANDBOX_HOST_KERNEL", "6.1.0-18-amd64"),
    ]);
    assert!(host_kernel_line(&named).is_none());
    assert!(host_kernel_line(&read(&[])).is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_names_the_ca_file_when_the_tls_handshake_fails_and_warns_of_plain_http() {
    use langflow_backend::DoctorLevel;
    use langflow_backend::opensandbox::{server_lines, transport_lines};
    use sandbox_opensandbox::OpenSandboxSettings;
    // A plain-http server on an https:// URL: the handshake fails, and doctor names the CA
    // file and the domain (a private CA's proxy fails the same way, in opensandbox-api's and
    // sandbox-core's TLS tests).
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let https = format!("https://localhost:{}", fake.addr().port());
    let settings = OpenSandboxSettings::from_lookup(lookup(https, &[])).unwrap();
    let lines = server_lines(&settings).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, DoctorLevel::Refused);
    assert_eq!(lines[0].setting.as_deref(), Some("OPEN_SANDBOX_CA_FILE"));
    assert!(
        lines[0].text.contains("OPEN_SANDBOX_DOMAIN"),
        "{}",
        lines[0].text
    );
    fake.shutdown().await;

    let plain = OpenSandboxSettings::from_lookup(lookup(
        "http://10.20.30.40:8080".into(),
        &[("OPEN_SANDBOX_ALLOW_PLAIN_HTTP", "true")],
    ))
    .unwrap();
    let lines = transport_lines(&plain);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, DoctorLevel::Warn);
    assert!(lines[0].text.contains("10.20.30.40"), "{}", lines[0].text);
    // Without the opt-in the server check refuses, naming both ways out.
    let refused =
        OpenSandboxSettings::from_lookup(lookup("http://10.20.30.40:8080".into(), &[])).unwrap();
    let lines = server_lines(&refused).await;
    assert_eq!(lines[0].level, DoctorLevel::Refused);
    for name in ["OPEN_SANDBOX_CA_FILE", "OPEN_SANDBOX_ALLOW_PLAIN_HTTP"] {
        assert!(lines[0].text.contains(name), "{name}: {}", lines[0].text);
    }
}

#[test]
fn a_cpu_that_is_not_a_quantity_is_refused_naming_the_setting() {
    use sandbox_opensandbox::OpenSandboxSettings;
    let e = OpenSandboxSettings::from_lookup(|n| (n == "OPEN_SANDBOX_CPU").then(|| "abc".into()))
        .unwrap_err();
    assert!(e.message().contains("OPEN_SANDBOX_CPU=abc"), "{e}");
    // lfx's gate sees an unusable setting as no isolation at all, and refuses.
    let caps = capabilities_with(|n| (n == "OPEN_SANDBOX_CPU").then(|| "abc".to_owned()));
    assert_eq!(caps.isolation, "none");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_gets_its_own_sandbox_and_leaves_none() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            runtime: Runtime::Kubernetes,
            secure_runtime: SecureRuntime::Kata,
            pending_ms: 100,
            ping_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let backend = OpenSandboxBackend::new();
    let attested: &'static [(&str, &str)] = &[
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
        ("OPEN_SANDBOX_RUNTIME_CLASS", "kata-qemu"),
    ];
    let policy = LfxPolicy::default();
    for n in 0..2 {
        let out = backend
            .run_with(
                &format!("import math\nprint(math.factorial(5) + {n})\n"),
                None,
                &policy,
                lookup(fake.url(), attested),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout.to_string(), format!("{}\n", 120 + n));
        assert_eq!(out.exit_code, 0);
        assert_eq!(fake.stats().live, 0);
    }
    assert_eq!(fake.stats().created, 2);
    let out = backend
        .run_with(
            "raise SystemExit('nope')",
            Some(BTreeMap::new()),
            &policy,
            lookup(fake.url(), attested),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 1);
    assert!(out.stderr.to_string().contains("nope"));
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

async fn plain_fake() -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap()
}

/// The OpenSandbox backend is admitted under the CreateOS backend's caps: at
/// `CREATEOS_MAX_LIVE_GUESTS`, a second run waits its admission wait and is refused by name,
/// nothing created; the slot comes back once the first run's sandbox is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_over_the_live_guest_cap_is_refused_naming_the_setting() {
    use sandbox_core::observe::RunOutcome;
    use sandbox_core::provider::ProviderKind;
    let fake = plain_fake().await;
    let backend = std::sync::Arc::new(OpenSandboxBackend::new());
    let capped: &'static [(&str, &str)] = &[
        ("CREATEOS_MAX_LIVE_GUESTS", "1"),
        ("CREATEOS_ADMISSION_WAIT_SECONDS", "0.5"),
    ];
    let policy = LfxPolicy::default();
    let (b, url, p) = (backend.clone(), fake.url(), policy.clone());
    let first = tokio::spawn(async move {
        b.run_with(
            "import time\ntime.sleep(3)\nprint('slow')\n",
            None,
            &p,
            lookup(url, capped),
        )
        .await
    });
    // Until the first run holds its slot.
    let t0 = std::time::Instant::now();
    while backend.session().admission().stats().live == 0 {
        assert!(
            t0.elapsed().as_secs() < 10,
            "the first run never took a slot"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let e = backend
        .run_with("print(2)", None, &policy, lookup(fake.url(), capped))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, langflow_backend::BackendError::Unavailable(_)),
        "{text}"
    );
    for want in ["at capacity", "CREATEOS_MAX_LIVE_GUESTS=1", "nothing ran"] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert!(!text.contains("CreateOS sandbox"), "{text}");
    let out = first.await.unwrap().unwrap();
    assert_eq!(out.stdout.to_string(), "slow\n");
    assert_eq!(fake.stats().created, 1, "the refused run created nothing");
    assert_eq!(backend.session().admission().stats().live, 0);
    assert_eq!(fake.stats().live, 0);
    let c = backend
        .session()
        .observation()
        .counters_of(ProviderKind::OpenSandbox);
    let b = ("surface", "backend");
    assert_eq!(
        c.value("createos_admission_refusals_total", &[b]),
        Some(1.0)
    );
    assert_eq!(
        c.value(
            "createos_runs_total",
            &[b, ("outcome", RunOutcome::Unavailable.as_str())]
        ),
        Some(1.0)
    );
    // A bad cap is refused by name before anything is created.
    let e = backend
        .run_with(
            "print(3)",
            None,
            &policy,
            lookup(fake.url(), &[("CREATEOS_MAX_LIVE_GUESTS", "many")]),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("CREATEOS_MAX_LIVE_GUESTS"), "{e}");
    fake.shutdown().await;
}

/// An OpenSandbox run is counted (created, destroyed, live, runs) and recorded (a usage record
/// with its worker, host and provider) under the OpenSandbox tag; CreateOS's totals stay 0.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_is_counted_and_recorded_as_opensandboxs() {
    use std::sync::{Arc, Mutex};

    use sandbox_core::observe::{Event, GuestUsage, Observer};
    use sandbox_core::provider::ProviderKind;

    #[derive(Default)]
    struct Keep(Mutex<Vec<(ProviderKind, GuestUsage)>>);
    impl Observer for Keep {
        fn observe(&self, _: &Event<'_>) {}
        fn observe_on(&self, provider: ProviderKind, event: &Event<'_>) {
            if let Event::GuestDestroyed(u) = event {
                self.0.lock().unwrap().push((provider, (*u).clone()));
            }
        }
    }
    let fake = plain_fake().await;
    let backend = OpenSandboxBackend::new();
    let keep = Arc::new(Keep::default());
    backend
        .session()
        .observation()
        .set_observer(Some(keep.clone()));
    let out = backend
        .run_with(
            "print('hi')",
            None,
            &LfxPolicy::default(),
            lookup(fake.url(), &[]),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.to_string(), "hi\n");
    let obs = backend.session().observation();
    let b = ("surface", "backend");
    let os = obs.counters_of(ProviderKind::OpenSandbox);
    assert_eq!(os.value("createos_guests_created_total", &[b]), Some(1.0));
    assert_eq!(
        os.value(
            "createos_guests_destroyed_total",
            &[b, ("reason", "run-end")]
        ),
        Some(1.0)
    );
    assert_eq!(os.value("createos_guests_live", &[b]), Some(0.0));
    assert_eq!(
        os.value("createos_runs_total", &[b, ("outcome", "ok")]),
        Some(1.0)
    );
    assert_eq!(
        obs.counters().value("createos_guests_created_total", &[b]),
        Some(0.0),
        "CreateOS's series are unchanged by an OpenSandbox run"
    );
    let seen = keep.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one usage record");
    let (provider, u) = &seen[0];
    assert_eq!(*provider, ProviderKind::OpenSandbox);
    assert_eq!(u.provider, ProviderKind::OpenSandbox);
    assert_eq!(u.guest, out.guest_id);
    assert_eq!(u.worker, std::process::id());
    assert!(!u.host.is_empty());
    assert_eq!((u.runs, u.egress, u.bytes_returned), (1, "none", 3));
    assert_eq!(u.shape, "256Mi");
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

/// Waits (at most 10 s) until the fake holds `live` sandboxes.
async fn until_live(fake: &FakeServer, live: u64) {
    let t0 = std::time::Instant::now();
    while fake.stats().live != live {
        assert!(
            t0.elapsed().as_secs() < 10,
            "live never became {live}: {:?}",
            fake.stats()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// lfx's `shutdown_sandbox` (and SIGTERM's cleanup) while a run is in its sandbox: the sandbox
/// is deleted at once, the run ends with an error, and every later run is refused with nothing
/// created.
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_deletes_a_running_runs_sandbox_and_refuses_later_runs() {
    let fake = plain_fake().await;
    let backend = std::sync::Arc::new(OpenSandboxBackend::new());
    let policy = LfxPolicy::default();
    let (b, url, p) = (backend.clone(), fake.url(), policy.clone());
    let run = tokio::spawn(async move {
        b.run_with("import time\ntime.sleep(30)\n", None, &p, lookup(url, &[]))
            .await
    });
    until_live(&fake, 1).await;
    // Until the create returned and the program was sent (the sandbox is live on the server
    // while its checks run).
    while backend.live_sandboxes() == 0 || fake.stats().commands < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let t0 = std::time::Instant::now();
    backend.shutdown().await;
    assert_eq!(fake.stats().live, 0, "deleted by the shutdown itself");
    assert_eq!(backend.live_sandboxes(), 0);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), run)
        .await
        .expect("the run ends once its sandbox is gone")
        .unwrap();
    assert!(
        t0.elapsed().as_secs() < 20,
        "it did not wait out the program"
    );
    assert!(ended.is_err(), "{ended:?}");
    let e = backend
        .run_with("print(1)", None, &policy, lookup(fake.url(), &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, langflow_backend::BackendError::Unavailable(_)),
        "{e}"
    );
    assert!(e.to_string().contains("shut down"), "{e}");
    assert_eq!(fake.stats().created, 1);
    // Idempotent.
    backend.shutdown().await;
    fake.shutdown().await;
}

/// A run whose future is dropped (Ctrl-C in Python) deletes its sandbox in the background;
/// `settled` returns once that delete is done.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_runs_sandbox_is_deleted_and_settled_waits_for_it() {
    let fake = plain_fake().await;
    let backend = std::sync::Arc::new(OpenSandboxBackend::new());
    let (b, url) = (backend.clone(), fake.url());
    let run = tokio::spawn(async move {
        b.run_with(
            "import time\ntime.sleep(30)\n",
            None,
            &LfxPolicy::default(),
            lookup(url, &[]),
        )
        .await
    });
    until_live(&fake, 1).await;
    while backend.live_sandboxes() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    tokio::time::timeout(std::time::Duration::from_secs(10), backend.settled())
        .await
        .expect("the background delete finishes");
    assert_eq!(fake.stats().live, 0);
    assert_eq!(backend.live_sandboxes(), 0);
    fake.shutdown().await;
}
