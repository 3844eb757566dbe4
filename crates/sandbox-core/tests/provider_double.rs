//! The guest lifecycle on a provider that is not CreateOS: an in-memory double of the
//! [`Provider`] seam, with none of CreateOS's habits (no `240.0.0.0/4`, no auto-pause, no
//! egress in its create answers, `running` is not ready until `wait_ready`, ids and lookups of
//! its own). Create → exec → destroy, a lost guard, an egress that differs, the orphan sweep by
//! age and the session's provider connector all go through the seam alone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::guest::{ExecInput, Guest, GuestContext, GuestSpec};
use sandbox_core::names::ONE_SHOT_PREFIX;
use sandbox_core::orphans::{SweepConfig, sweep_provider};
use sandbox_core::provider::{
    self, AgedGuest, CallError, CallFailure, Download, EgressCheck, ExecFrame, ExecRequest,
    ExecStream, GuestInfo, GuestStatus, Isolation, Labels, Provider, ProviderKind, Size,
};
use sandbox_core::reaper::{Reaper, ReaperConfig};
use sandbox_core::retry::Backoff;
use sandbox_core::session::{ProviderConnector, Session};
use sandbox_core::settings::Settings;
use sandbox_core::{ErrorKind, Redactor};
use tokio::time::Instant;

/// One guest the double holds.
#[derive(Clone)]
struct Held {
    info: GuestInfo,
    created_at: SystemTime,
}

/// Everything the lifecycle asked of the double, in order.
#[derive(Default)]
struct Seen {
    calls: Vec<String>,
    specs: Vec<provider::GuestSpec>,
    execs: Vec<ExecRequest>,
    policies: Vec<EgressPolicy>,
    /// What each `keep_alive` asked for.
    kept_alive: Vec<Duration>,
}

/// An in-memory provider: ids `os-N`, guests running at once but ready only after
/// `wait_ready`, egress read back as `egress_says`.
struct Double {
    guests: Mutex<BTreeMap<String, Held>>,
    seen: Mutex<Seen>,
    next: Mutex<u32>,
    egress_says: EgressCheck,
    /// `check` answers nothing (a server that is down).
    down: AtomicBool,
    /// Reports the declared environment keys of the guests it creates.
    reports_envs: AtomicBool,
    /// Answers [`Provider::replaces_drifted_kept_guests`].
    replaces: AtomicBool,
    /// Guests whose egress now reads back as something else than was asked.
    drifted: Mutex<Vec<String>>,
    /// How the next exec goes instead of the usual run: the request fails, or the stream is
    /// these frames (and then stays open when `hang` says so).
    exec_script: Mutex<Option<ExecScript>>,
}

/// A scripted exec: how the provider answers the next exec request.
enum ExecScript {
    /// The request fails with this error.
    Fails(CallError),
    /// The stream sends these, then ends (or stays open without a frame, with `hang`).
    Frames(Vec<Result<ExecFrame, CallError>>, bool),
}

impl Double {
    fn new(egress_says: EgressCheck) -> Arc<Self> {
        Arc::new(Self {
            guests: Mutex::new(BTreeMap::new()),
            seen: Mutex::new(Seen::default()),
            next: Mutex::new(0),
            egress_says,
            down: AtomicBool::new(false),
            reports_envs: AtomicBool::new(false),
            replaces: AtomicBool::new(false),
            drifted: Mutex::new(Vec::new()),
            exec_script: Mutex::new(None),
        })
    }

    fn note(&self, call: &str) {
        self.seen.lock().unwrap().calls.push(call.to_owned());
    }

    fn calls(&self) -> Vec<String> {
        self.seen.lock().unwrap().calls.clone()
    }

    fn live(&self) -> Vec<String> {
        let g = self.guests.lock().unwrap();
        g.values().filter_map(|h| h.info.name.clone()).collect()
    }

    /// Puts a guest in as if an earlier process had created it `age` ago.
    fn plant(&self, name: &str, status: GuestStatus, age: Duration) {
        let id = format!("planted-{name}");
        let info = GuestInfo {
            id: id.clone(),
            name: Some(name.to_owned()),
            status,
            ..GuestInfo::default()
        };
        let created_at = SystemTime::now() - age;
        self.guests
            .lock()
            .unwrap()
            .insert(id, Held { info, created_at });
    }

    fn lookup(&self, id: &str) -> Result<GuestInfo, CallError> {
        let g = self.guests.lock().unwrap();
        g.get(id)
            .map(|h| h.info.clone())
            .ok_or_else(|| CallError::new(CallFailure::Status(404), format!("no guest {id}")))
    }
}

fn now<T: Send + 'static>(v: Result<T, CallError>) -> BoxFuture<'static, Result<T, CallError>> {
    Box::pin(futures::future::ready(v))
}

impl Provider for Double {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenSandbox
    }

    fn isolation(&self) -> Isolation {
        Isolation::Container
    }

    fn check(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.note("check");
        if self.down.load(Ordering::SeqCst) {
            return now(Err(CallError::new(
                CallFailure::Transport,
                "connection refused",
            )));
        }
        now(Ok("double".to_owned()))
    }

    fn sizes(&self) -> BoxFuture<'_, Result<Vec<Size>, CallError>> {
        self.note("sizes");
        now(Ok(vec![Size {
            id: "small".into(),
            vcpu: 1,
            mem_mib: 512,
        }]))
    }

    fn create(&self, spec: provider::GuestSpec) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.note("create");
        let id = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            format!("os-{n}")
        };
        // Running at once, no egress in the answer: the answer proves nothing about it.
        let info = GuestInfo {
            id: id.clone(),
            name: Some(spec.name.clone()),
            status: GuestStatus::Running,
            envs: self
                .reports_envs
                .load(Ordering::SeqCst)
                .then(|| spec.envs.keys().cloned().collect()),
            ..GuestInfo::default()
        };
        self.seen.lock().unwrap().specs.push(spec);
        self.guests.lock().unwrap().insert(
            id,
            Held {
                info: info.clone(),
                created_at: SystemTime::now(),
            },
        );
        now(Ok(info))
    }

    fn find(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.note("find");
        let g = self.guests.lock().unwrap();
        let found = g
            .values()
            .find(|h| h.info.name.as_deref() == Some(name.as_str()))
            .map(|h| h.info.clone());
        now(Ok(found))
    }

    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.note("get");
        now(self.lookup(&id))
    }

    fn wait_ready(
        &self,
        id: String,
        _deadline: Instant,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.note("wait_ready");
        now(self.lookup(&id))
    }

    fn verify_egress(
        &self,
        id: String,
        policy: EgressPolicy,
    ) -> BoxFuture<'_, Result<EgressCheck, CallError>> {
        self.note("verify_egress");
        self.seen.lock().unwrap().policies.push(policy);
        let drifted = self.drifted.lock().unwrap().contains(&id);
        now(self.lookup(&id).map(|_| {
            if drifted {
                EgressCheck::Differs("unrestricted (drifted)".to_owned())
            } else {
                self.egress_says.clone()
            }
        }))
    }

    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.note("exec");
        self.seen.lock().unwrap().execs.push(req);
        if let Some(script) = self.exec_script.lock().unwrap().take() {
            let answer = self.lookup(&id).and_then(|_| match script {
                ExecScript::Fails(e) => Err(e),
                ExecScript::Frames(frames, hang) => {
                    let sent = futures::stream::iter(frames);
                    Ok(if hang {
                        Box::pin(sent.chain(futures::stream::pending())) as ExecStream
                    } else {
                        Box::pin(sent) as ExecStream
                    })
                }
            });
            return now(answer);
        }
        let frames = self.lookup(&id).map(|_| {
            let frames = vec![
                Ok(ExecFrame::Heartbeat),
                Ok(ExecFrame::Stdout("from the double\n".to_owned())),
                Ok(ExecFrame::Exit(0)),
            ];
            Box::pin(futures::stream::iter(frames)) as ExecStream
        });
        now(frames)
    }

    fn upload(
        &self,
        id: String,
        _path: String,
        _data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.note("upload");
        now(self.lookup(&id).map(|_| ()))
    }

    fn download(
        &self,
        _id: String,
        _path: String,
        _max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        now(Err(CallError::new(
            CallFailure::Config,
            "no downloads here",
        )))
    }

    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.note("destroy");
        // Idempotent: a guest already gone counts as destroyed.
        self.guests.lock().unwrap().remove(&id);
        now(Ok(()))
    }

    fn keep_alive(
        &self,
        id: String,
        idle: Duration,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.note("keep_alive");
        self.seen.lock().unwrap().kept_alive.push(idle);
        now(self.lookup(&id))
    }

    fn replaces_drifted_kept_guests(&self) -> bool {
        self.replaces.load(Ordering::SeqCst)
    }

    fn list_ours(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.note("list_ours");
        let g = self.guests.lock().unwrap();
        let listed = g
            .values()
            .filter(|h| {
                h.info
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .map(|h| AgedGuest {
                info: h.info.clone(),
                created_at: Some(h.created_at),
            })
            .collect();
        now(Ok(listed))
    }
}

fn quick() -> Backoff {
    Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_millis(20),
        budget: Duration::from_secs(2),
    }
}

fn reaper() -> Reaper {
    Reaper::new(ReaperConfig {
        backoff: quick(),
        lookup_patience: Duration::from_millis(100),
    })
}

fn spec(egress: EgressPolicy) -> GuestSpec {
    GuestSpec {
        shape: "small".into(),
        rootfs: "python:3.12-slim".into(),
        envs: BTreeMap::from([("TOKEN".to_owned(), "v-secret-double".to_owned())]),
        egress,
        auto_pause_after_seconds: 300,
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn limits() -> ExecLimits {
    ExecLimits {
        budget: Duration::from_secs(2),
        kill_after: Duration::from_millis(100),
        host_grace: Duration::from_millis(200),
    }
}

fn context(double: &Arc<Double>, reaper: &Reaper) -> GuestContext {
    GuestContext::with_provider(double.clone(), reaper.clone(), Redactor::default(), quick())
}

#[tokio::test]
async fn create_exec_destroy_go_through_the_seam_alone() {
    let double = Double::new(EgressCheck::Matches);
    let r = reaper();
    let cx = context(&double, &r);
    let policy = EgressPolicy::DenyAll;

    let g = Guest::create(&cx, &spec(policy.clone()), ONE_SHOT_PREFIX, soon())
        .await
        .unwrap();
    assert_eq!(g.id(), "os-1");
    assert_eq!(r.registered(), 1, "the one-shot guest is the reaper's");
    // The answer showed no egress: nothing is taken as confirmed, it is read back.
    assert!(!g.egress_confirmed(&policy));
    g.verify_egress(&policy, soon()).await.unwrap();

    let run = g
        .exec(
            &Command::shell("echo hi"),
            &limits(),
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap();
    let out = g.capture(run, &limits(), 1024).await.unwrap();
    assert_eq!(out.stdout.text, "from the double\n");
    assert_eq!(out.exit_code, 0);

    g.destroy().await.unwrap();
    assert!(double.live().is_empty(), "{:?}", double.live());
    assert_eq!(r.registered(), 0);

    // Readiness is the provider's (`running` is not enough here), before the first exec.
    assert_eq!(
        double.calls(),
        ["create", "wait_ready", "verify_egress", "exec", "destroy"]
    );

    // What the provider got is neutral: the policy as sandbox-core decided it, the lifetime
    // and the labels; no CreateOS spelling anywhere, and no CreateOS name rule enforced here.
    let seen = double.seen.lock().unwrap();
    let sent = &seen.specs[0];
    assert_eq!(sent.egress, EgressPolicy::DenyAll);
    assert_eq!(sent.image, "python:3.12-slim");
    assert_eq!(sent.size.id, "small");
    assert_eq!(sent.lifetime.idle_backstop, Duration::from_secs(300));
    assert!(sent.lifetime.budget <= sent.lifetime.idle_backstop);
    assert_eq!(
        sent.labels.0.get(Labels::CREATED_BY).map(String::as_str),
        Some(Labels::CREATED_BY_US)
    );
    assert!(sent.name.starts_with(ONE_SHOT_PREFIX));
    let shown = format!("{sent:?} {:?} {:?}", seen.policies, seen.execs);
    assert!(!shown.contains("240.0.0.0/4"), "{shown}");
    assert!(!shown.contains("169.254"), "{shown}");
    assert!(!shown.contains("v-secret-double"), "{shown}");
    assert_eq!(seen.policies, [EgressPolicy::DenyAll]);
}

#[tokio::test]
async fn an_egress_that_differs_refuses_in_the_providers_words_and_destroys() {
    let double = Double::new(EgressCheck::Differs("dns (not dns+nft)".to_owned()));
    let r = reaper();
    let cx = context(&double, &r);
    let policy = EgressPolicy::DenyAll;
    let g = Guest::create(&cx, &spec(policy.clone()), ONE_SHOT_PREFIX, soon())
        .await
        .unwrap();
    let e = g.verify_egress(&policy, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    let m = e.message();
    assert!(m.contains("reports egress dns (not dns+nft)"), "{m}");
    assert!(m.contains("but deny-all was requested"), "{m}");
    assert!(!m.contains("240.0.0.0/4") && !m.contains("169.254"), "{m}");
    // The run lets go of the refused guest; the reaper destroys it through the provider.
    g.release();
    let report = r.shutdown(Duration::from_secs(2)).await;
    assert_eq!(report.failed, 0);
    assert!(double.live().is_empty(), "{:?}", double.live());
}

#[tokio::test]
async fn a_dropped_guest_is_destroyed_by_the_reaper_through_the_provider() {
    let double = Double::new(EgressCheck::Matches);
    let r = reaper();
    let cx = context(&double, &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::AllowAll), ONE_SHOT_PREFIX, soon())
        .await
        .unwrap();
    drop(g);
    let report = r.shutdown(Duration::from_secs(2)).await;
    assert_eq!(report.failed, 0);
    assert!(double.live().is_empty(), "{:?}", double.live());
    assert!(double.calls().contains(&"destroy".to_owned()));
}

#[tokio::test]
async fn a_kept_guest_is_found_by_the_providers_lookup_and_readied() {
    let double = Double::new(EgressCheck::Matches);
    let r = reaper();
    let cx = context(&double, &r);
    let s = spec(EgressPolicy::DenyAll);
    let name = "lf-c-kept";
    let first = Guest::acquire(&cx, &s, name, soon()).await.unwrap();
    assert!(first.was_created());
    let id = first.id().to_owned();
    first.release();
    // The double does not report the declared env keys: an adopted guest is refused rather
    // than used with keys nobody can vouch for, and left as it is.
    let e = Guest::acquire(&cx, &s, name, soon()).await.unwrap_err();
    assert!(e.message().contains("(not reported)"), "{e}");
    assert_eq!(double.live(), [name]);
    assert_eq!(
        double.calls(),
        [
            "find",
            "create",
            "wait_ready",
            "verify_egress",
            "find",
            "keep_alive",
            "wait_ready"
        ]
    );
    double.destroy(id).await.unwrap();
}

#[tokio::test]
async fn an_adopted_kept_guest_is_renewed_past_the_run_on_a_provider_that_never_pauses() {
    let double = Double::new(EgressCheck::Matches);
    double.reports_envs.store(true, Ordering::SeqCst);
    let r = reaper();
    let cx = context(&double, &r);
    let s = spec(EgressPolicy::DenyAll);
    let name = "lf-c-renewed";
    let first = Guest::acquire(&cx, &s, name, soon()).await.unwrap();
    let id = first.id().to_owned();
    first.release();
    // Created: its lifetime came with the create, nothing to renew; labelled as kept.
    assert!(double.seen.lock().unwrap().kept_alive.is_empty());
    let labels = double.seen.lock().unwrap().specs[0].labels.clone();
    assert_eq!(
        labels
            .0
            .get(sandbox_core::provider::Labels::KEPT)
            .map(String::as_str),
        Some("true")
    );
    let again = Guest::acquire(&cx, &s, name, soon()).await.unwrap();
    assert!(!again.was_created());
    assert_eq!(again.id(), id);
    // The run's budget and an idle backstop after it (both the spec's 300 s).
    assert_eq!(
        double.seen.lock().unwrap().kept_alive,
        [Duration::from_secs(600)]
    );
    again.release();
    assert_eq!(double.live(), [name]);
    double.destroy(id).await.unwrap();
}

#[tokio::test]
async fn a_drifted_kept_guest_is_replaced_only_where_the_provider_says_so() {
    let double = Double::new(EgressCheck::Matches);
    double.reports_envs.store(true, Ordering::SeqCst);
    let r = reaper();
    let cx = context(&double, &r);
    let s = spec(EgressPolicy::DenyAll);
    let name = "lf-c-drifted";
    let first = Guest::acquire(&cx, &s, name, soon()).await.unwrap();
    let old = first.id().to_owned();
    first.release();
    double.drifted.lock().unwrap().push(old.clone());
    // By default (CreateOS's way) refused and left as it is.
    let e = Guest::acquire(&cx, &s, name, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused);
    assert!(e.message().contains("left as it is"), "{e}");
    assert!(double.lookup(&old).is_ok());
    // A provider that replaces them: destroyed, created again under the name, checked.
    double.replaces.store(true, Ordering::SeqCst);
    let fresh = Guest::acquire(&cx, &s, name, soon()).await.unwrap();
    assert!(fresh.was_created());
    assert_ne!(fresh.id(), old);
    assert!(
        double.lookup(&old).is_err(),
        "the drifted guest was destroyed"
    );
    assert_eq!(double.live(), [name]);
    // A new guest that reads back wrong is destroyed too: nothing is left to drift again.
    double.drifted.lock().unwrap().push(fresh.id().to_owned());
    fresh.release();
    let next_id = format!("os-{}", *double.next.lock().unwrap() + 1);
    double.drifted.lock().unwrap().push(next_id);
    let e = Guest::acquire(&cx, &s, name, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused);
    assert!(e.message().contains("destroyed"), "{e}");
    assert!(double.live().is_empty(), "{:?}", double.live());
}

#[tokio::test]
async fn the_sweep_goes_by_age_on_a_provider_that_never_pauses() {
    let double = Double::new(EgressCheck::Matches);
    let old = Duration::from_secs(3 * 86_400);
    let orphan = "lf-0123456789abcdefghi";
    double.plant(orphan, GuestStatus::Running, old);
    double.plant(
        "lf-youngyoungyoungyoun",
        GuestStatus::Running,
        Duration::ZERO,
    );
    double.plant("lf-c-reused-and-old", GuestStatus::Running, old);
    double.plant(
        "lf-pausedpausedpausedp",
        GuestStatus::Paused,
        Duration::ZERO,
    );
    let config = SweepConfig {
        backoff: quick(),
        ..SweepConfig::default()
    };

    let dry = sweep_provider(double.as_ref(), true, &config)
        .await
        .unwrap();
    let names: Vec<&str> = dry.deleted.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, [orphan]);
    assert_eq!(double.live().len(), 4);

    let report = sweep_provider(double.as_ref(), false, &config)
        .await
        .unwrap();
    assert_eq!(report.deleted.len(), 1);
    assert!(report.failed.is_empty());
    let mut live = double.live();
    live.sort();
    assert_eq!(
        live,
        [
            "lf-c-reused-and-old",
            "lf-pausedpausedpausedp",
            "lf-youngyoungyoungyoun"
        ]
    );
    // A shorter orphan age sweeps the young one-shot guests too, never the reused one.
    let eager = SweepConfig {
        orphan_age: Duration::ZERO,
        ..config
    };
    sweep_provider(double.as_ref(), false, &eager)
        .await
        .unwrap();
    assert_eq!(double.live(), ["lf-c-reused-and-old"]);
}

#[tokio::test]
async fn a_session_on_a_provider_connector_needs_no_createos_key() {
    let double = Double::new(EgressCheck::Matches);
    let handed = double.clone();
    let connector: ProviderConnector =
        Arc::new(move |_: &Settings, _| Ok(handed.clone() as Arc<dyn Provider>));
    let session = Session::with_provider_connector(connector, Duration::from_secs(1));
    let settings = Settings::from_lookup(&|_| None).unwrap();
    let account = session.account(&settings).unwrap();
    assert_eq!(account.provider().kind(), ProviderKind::OpenSandbox);
    let (cred, shapes) = account.preflight(&quick(), &Redactor::default()).await;
    assert_eq!(cred.unwrap(), "double");
    assert_eq!(shapes.unwrap()[0].id, "small");
    // Its calls are counted like CreateOS's, under its own provider (CreateOS's totals stay).
    let routes = |c: &sandbox_core::observe::Counters| -> Vec<String> {
        c.snapshot()
            .into_iter()
            .filter(|s| s.name == "createos_control_requests_total")
            .flat_map(|s| s.labels.into_iter().filter(|(k, _)| *k == "route"))
            .map(|(_, v)| v)
            .collect()
    };
    assert!(routes(session.observation().counters()).is_empty());
    let counted: Vec<String> = session
        .observation()
        .counters_of(ProviderKind::OpenSandbox)
        .snapshot()
        .into_iter()
        .filter(|s| s.name == "createos_control_requests_total")
        .flat_map(|s| s.labels.into_iter().filter(|(k, _)| *k == "route"))
        .map(|(_, v)| v)
        .collect();
    assert!(
        counted.iter().any(|r| r == "whoami") && counted.iter().any(|r| r == "shapes"),
        "{counted:?}"
    );
    // CreateOS's own calls are refused on it, naming the provider.
    let e = account.control_plane().list_shapes().await.unwrap_err();
    assert_eq!(e.failure, CallFailure::Config);
    assert!(e.message.contains("opensandbox"), "{e}");
    // The same account again.
    assert!(Arc::ptr_eq(&account, &session.account(&settings).unwrap()));
}

#[tokio::test]
async fn a_provider_that_does_not_answer_is_named_as_itself_not_as_createos() {
    let double = Double::new(EgressCheck::Matches);
    double.down.store(true, Ordering::SeqCst);
    let handed = double.clone();
    let connector: ProviderConnector =
        Arc::new(move |_: &Settings, _| Ok(handed.clone() as Arc<dyn Provider>));
    let session = Session::with_provider_connector(connector, Duration::from_secs(1));
    let account = session
        .account(&Settings::from_lookup(&|_| None).unwrap())
        .unwrap();
    let backoff = Backoff {
        budget: Duration::from_millis(50),
        ..quick()
    };
    let e = account
        .credential(&backoff, &Redactor::default())
        .await
        .unwrap_err();
    let m = e.message();
    assert!(m.contains("The opensandbox server"), "{m}");
    assert!(!m.contains("CREATEOS_SANDBOX_BASE_URL"), "{m}");
}

/// Runs `script` as one exec in a fresh guest of `double` and returns what the capture made of
/// it: the error's message, or the outcome's standard error.
async fn scripted_exec(double: &Arc<Double>, script: ExecScript) -> Result<String, String> {
    let r = reaper();
    let cx = context(double, &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::DenyAll), ONE_SHOT_PREFIX, soon())
        .await
        .unwrap();
    *double.exec_script.lock().unwrap() = Some(script);
    let short = ExecLimits {
        budget: Duration::from_millis(200),
        kill_after: Duration::from_millis(50),
        host_grace: Duration::from_millis(50),
    };
    let cmd = Command::shell("echo hi");
    let res = match g.exec(&cmd, &short, &ExecInput::default(), soon()).await {
        Ok(run) => g
            .capture(run, &short, 1024)
            .await
            .map(|out| out.stderr.text.to_string())
            .map_err(|e| e.message().to_owned()),
        Err(e) => Err(e.message().to_owned()),
    };
    g.destroy().await.unwrap();
    res
}

fn names_opensandbox_only(message: &str) {
    assert!(message.contains("OpenSandbox"), "{message}");
    assert!(!message.contains("CreateOS"), "{message}");
}

#[tokio::test]
async fn exec_failures_name_the_provider_the_guest_ran_on() {
    let double = Double::new(EgressCheck::Matches);
    let fails = |f| ExecScript::Fails(CallError::new(f, "the server said no"));

    let m = scripted_exec(&double, fails(CallFailure::Status(400)))
        .await
        .unwrap_err();
    assert!(m.starts_with("OpenSandbox exec was rejected: "), "{m}");
    names_opensandbox_only(&m);

    let m = scripted_exec(&double, fails(CallFailure::Status(500)))
        .await
        .unwrap_err();
    assert!(
        m.starts_with("OpenSandbox exec failed after the program was dispatched"),
        "{m}"
    );
    names_opensandbox_only(&m);

    let broke = vec![
        Ok(ExecFrame::Stdout("partial\n".to_owned())),
        Err(CallError::new(CallFailure::Transport, "connection reset")),
    ];
    let m = scripted_exec(&double, ExecScript::Frames(broke, false))
        .await
        .unwrap_err();
    assert!(
        m.starts_with("the exec stream from OpenSandbox broke"),
        "{m}"
    );
    names_opensandbox_only(&m);

    let m = scripted_exec(&double, ExecScript::Frames(vec![], true))
        .await
        .unwrap_err();
    assert!(
        m.starts_with("OpenSandbox accepted the exec but sent nothing"),
        "{m}"
    );
    names_opensandbox_only(&m);

    let impossible = vec![Ok(ExecFrame::Exit(300))];
    let m = scripted_exec(&double, ExecScript::Frames(impossible, false))
        .await
        .unwrap_err();
    assert!(
        m.starts_with("OpenSandbox exec did not complete: OpenSandbox reported exit status 300"),
        "{m}"
    );
    names_opensandbox_only(&m);

    let agent = vec![
        Ok(ExecFrame::Error("agent hiccup".to_owned())),
        Ok(ExecFrame::Exit(1)),
    ];
    let stderr = scripted_exec(&double, ExecScript::Frames(agent, false))
        .await
        .unwrap();
    assert!(
        stderr.contains("[OpenSandbox guest agent: agent hiccup]"),
        "{stderr}"
    );
    names_opensandbox_only(&stderr);
    assert!(double.live().is_empty(), "{:?}", double.live());
}

#[tokio::test]
async fn call_failures_and_shutdown_name_the_provider_the_guest_ran_on() {
    let double = Double::new(EgressCheck::Matches);
    let r = reaper();
    let cx = context(&double, &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::DenyAll), ONE_SHOT_PREFIX, soon())
        .await
        .unwrap();
    // The double refuses every download (a configuration failure, not retried).
    let e = g.download("/tmp/out.txt", 1024, soon()).await.unwrap_err();
    let m = e.message();
    assert!(
        m.starts_with("OpenSandbox download of /tmp/out.txt failed: "),
        "{m}"
    );
    names_opensandbox_only(m);

    // Shutdown destroys the guest under the handle; nothing is dispatched after it.
    r.shutdown(Duration::from_secs(2)).await;
    let e = g
        .exec(
            &Command::shell("echo hi"),
            &limits(),
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap_err();
    let m = e.message();
    assert!(
        m.starts_with("OpenSandbox sandboxes in this process were shut down"),
        "{m}"
    );
    names_opensandbox_only(m);
}
