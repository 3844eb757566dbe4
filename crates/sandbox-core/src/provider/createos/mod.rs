//! CreateOS behind the provider seam: [`CreateOs`] implements [`Provider`] over a
//! [`ControlPlane`] (in production `sandbox_createos::CreateOsControlPlane`, the `createos-api`
//! client; in tests an in-memory double).
//!
//! What is CreateOS's and nobody else's lives here:
//!
//! - [`egress`]: the `240.0.0.0/4` deny-all spelling and the read-back comparison of its
//!   allowlist, the link-local hole and its opt-in ([`egress::LINK_LOCAL`]);
//! - [`shapes`]: the shape catalog and its floor (the sizes on offer);
//! - [`NAME_MAX`]: 22-character unique names, the guest key ([`crate::names`] mints them);
//! - auto-pause as the idle backstop ([`auto_pause_secs`], [`AUTO_PAUSE_MIN_SECS`]);
//! - the settings that point at the control plane ([`ENV_BASE_URL`], [`DEFAULT_BASE_URL`],
//!   [`ENV_SHAPE`]); every `createos-api` call is the `sandbox-createos` crate's
//!   (`CreateOsControlPlane`), which a process installs as the session's connector.
//!
//! `sandbox_core::createos` is this module under its old name.

pub mod egress;
pub mod shapes;

pub use crate::control::DEFAULT_REQUEST_TIMEOUT;
pub use egress::{DENY_ALL_RULE, LINK_LOCAL, LINK_LOCAL_HOLE};

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{
    AgedGuest, CallError, CallFailure, ControlPlane, Download, EgressCheck, EgressException,
    ExecRequest, ExecStream, GuestInfo, GuestSpec, GuestStatus, Isolation, ProcessSpec, Provider,
    ProviderKind, Size, left,
};
use crate::control::CreateGuest;
use crate::egress::EgressPolicy;

/// `CREATEOS_SANDBOX_BASE_URL`: control-plane endpoint.
pub const ENV_BASE_URL: &str = "CREATEOS_SANDBOX_BASE_URL";
/// The public control plane.
pub const DEFAULT_BASE_URL: &str = "https://api.sb.createos.sh";
/// `CREATEOS_SANDBOX_SHAPE`: pin an exact shape (`auto` or unset = choose by memory).
pub const ENV_SHAPE: &str = "CREATEOS_SANDBOX_SHAPE";

/// Longest sandbox name CreateOS accepts; a name is unique per account, which makes it the key
/// that finds a guest whose create response was lost.
pub const NAME_MAX: usize = 22;

/// Shortest auto-pause backstop CreateOS accepts, in seconds.
pub const AUTO_PAUSE_MIN_SECS: u32 = 60;
/// Longest auto-pause backstop CreateOS accepts, in seconds (24 h).
pub const AUTO_PAUSE_MAX_SECS: u32 = 86_400;

/// The isolation CreateOS vouches for before any guest exists: every guest is its own
/// Firecracker microVM.
pub const ISOLATION: Isolation = Isolation::HardwareVirtualized;

/// How often [`CreateOs::wait_ready`] reads a guest that is not running yet, at most.
const READY_POLL_MAX: Duration = Duration::from_secs(2);

/// The CreateOS provider: every guest a Firecracker microVM.
#[derive(Clone)]
pub struct CreateOs {
    cp: Arc<dyn ControlPlane>,
}

impl std::fmt::Debug for CreateOs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateOs").finish_non_exhaustive()
    }
}

impl CreateOs {
    /// The provider over `cp`.
    pub fn new(cp: Arc<dyn ControlPlane>) -> Self {
        Self { cp }
    }

    /// The control plane underneath (CreateOS-only operations: templates).
    pub fn control_plane(&self) -> &Arc<dyn ControlPlane> {
        &self.cp
    }

    /// The create request CreateOS gets for `spec`: the name as the sandbox's unique name, the
    /// size's shape id, the egress in CreateOS's allowlist spelling, the idle backstop as
    /// auto-pause (clamped into 60 s ..= 24 h). Labels are carried by the name alone.
    pub fn create_request(spec: &GuestSpec) -> CreateGuest {
        CreateGuest {
            name: spec.name.clone(),
            shape: spec.size.id.clone(),
            rootfs: spec.image.clone(),
            envs: spec.envs.clone(),
            egress: egress_rules(&spec.egress),
            auto_pause_after_seconds: auto_pause_secs(spec.lifetime.idle_backstop),
        }
    }
}

/// `policy` in CreateOS's allowlist spelling (`["*"]`, `["240.0.0.0/4"]`, or the rules).
pub fn egress_rules(policy: &EgressPolicy) -> Vec<String> {
    policy.rules()
}

/// Whether the allowlist CreateOS reports is the one `policy` asked for.
pub fn egress_matches(policy: &EgressPolicy, reported: Option<&[String]>) -> bool {
    policy.matches(reported)
}

/// An allowlist CreateOS reported, as a refusal quotes it: `(none)` when absent (allow-all),
/// else the list as `["…", …]`, escaped and bounded.
pub fn shown_rules(reported: Option<&[String]>) -> String {
    reported.map_or_else(
        || "(none)".to_owned(),
        |r| outside_text::snippet(&format!("{r:?}"), SHOWN_RULES_MAX),
    )
}

/// The most of a reported allowlist a refusal quotes, in bytes.
const SHOWN_RULES_MAX: usize = 512;

/// `idle` as CreateOS's auto-pause backstop in seconds, clamped into what it accepts.
pub fn auto_pause_secs(idle: Duration) -> u32 {
    u32::try_from(idle.as_secs())
        .unwrap_or(u32::MAX)
        .clamp(AUTO_PAUSE_MIN_SECS, AUTO_PAUSE_MAX_SECS)
}

impl Provider for CreateOs {
    fn kind(&self) -> ProviderKind {
        ProviderKind::CreateOs
    }

    fn isolation(&self) -> Isolation {
        ISOLATION
    }

    fn egress_exceptions(&self) -> &'static [EgressException] {
        egress::EXCEPTIONS
    }

    fn describe_egress(&self, policy: &EgressPolicy) -> String {
        policy.to_string()
    }

    fn egress_in_answer(&self, info: &GuestInfo, policy: &EgressPolicy) -> Option<EgressCheck> {
        let eg = info.egress.as_ref()?;
        Some(if egress_matches(policy, Some(eg)) {
            EgressCheck::Matches
        } else {
            EgressCheck::Differs(shown_rules(Some(eg)))
        })
    }

    fn identity(&self) -> usize {
        // The control plane's, so that two wrappings of one control plane are one account.
        Arc::as_ptr(&self.cp).cast::<()>() as usize
    }

    fn running_is_ready(&self) -> bool {
        true
    }

    fn pauses_idle_guests(&self) -> bool {
        true
    }

    fn check(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.cp.check_credential()
    }

    fn sizes(&self) -> BoxFuture<'_, Result<Vec<Size>, CallError>> {
        async move {
            let shapes = self.cp.list_shapes().await?;
            Ok(shapes.into_iter().map(Size::from).collect())
        }
        .boxed()
    }

    fn create(&self, spec: GuestSpec) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        if let Err(e) = egress::refuse_domains(&spec.egress) {
            let e = CallError::new(CallFailure::Config, e.message().to_owned());
            return Box::pin(futures::future::ready(Err(e)));
        }
        self.cp.create(Self::create_request(&spec))
    }

    fn find(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.cp.find_by_name(name)
    }

    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.cp.get(id)
    }

    fn wait_ready(
        &self,
        id: String,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let info = self.cp.get(id.clone()).await?;
                if info.status == GuestStatus::Running {
                    return Ok(info);
                }
                if info.is_terminal() {
                    return Err(CallError::new(
                        CallFailure::Protocol,
                        format!("guest {id} is {} and will not run", info.status),
                    ));
                }
                if left(deadline) < pause {
                    return Err(CallError::new(
                        CallFailure::Timeout,
                        format!("guest {id} was still {} at the deadline", info.status),
                    ));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(READY_POLL_MAX);
            }
        }
        .boxed()
    }

    fn verify_egress(
        &self,
        id: String,
        policy: EgressPolicy,
    ) -> BoxFuture<'_, Result<EgressCheck, CallError>> {
        async move {
            let got = self.cp.egress(id).await?;
            if egress_matches(&policy, got.as_deref()) {
                Ok(EgressCheck::Matches)
            } else {
                Ok(EgressCheck::Differs(shown_rules(got.as_deref())))
            }
        }
        .boxed()
    }

    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.cp.exec_stream(id, req)
    }

    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.cp.upload(id, path, data)
    }

    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        self.cp.download(id, path, max_bytes)
    }

    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.cp.destroy(id)
    }

    fn list_ours(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.cp.list_guests_aged(prefix)
    }

    fn keep_alive(
        &self,
        id: String,
        idle: Duration,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.cp.set_auto_pause(id, auto_pause_secs(idle))
    }

    fn resume(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.cp.resume(id)
    }

    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        self.cp.spawn_process(id, spec)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;
    use crate::provider::{Labels, Lifetime};

    /// A control plane that records the create it got and reports `egress`.
    struct Recorder {
        created: Mutex<Option<CreateGuest>>,
        egress: Option<Vec<String>>,
        status: GuestStatus,
    }

    fn ready<T: Send + 'static>(
        v: Result<T, CallError>,
    ) -> BoxFuture<'static, Result<T, CallError>> {
        Box::pin(futures::future::ready(v))
    }

    fn info(status: GuestStatus) -> GuestInfo {
        GuestInfo {
            id: "sb-1".into(),
            status,
            ..GuestInfo::default()
        }
    }

    impl ControlPlane for Recorder {
        fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
            ready(Ok("me".into()))
        }
        fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<crate::control::Shape>, CallError>> {
            ready(Ok(vec![]))
        }
        fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
            *self.created.lock().unwrap() = Some(req);
            ready(Ok(info(GuestStatus::Running)))
        }
        fn find_by_name(&self, _: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
            ready(Ok(None))
        }
        fn egress(&self, _: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
            ready(Ok(self.egress.clone()))
        }
        fn upload(&self, _: String, _: String, _: Bytes) -> BoxFuture<'_, Result<(), CallError>> {
            ready(Ok(()))
        }
        fn exec_stream(
            &self,
            _: String,
            _: ExecRequest,
        ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
            ready(Err(CallError::new(CallFailure::Config, "no exec")))
        }
        fn destroy(&self, _: String) -> BoxFuture<'_, Result<(), CallError>> {
            ready(Ok(()))
        }
        fn get(&self, _: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
            ready(Ok(info(self.status.clone())))
        }
    }

    fn provider(egress: Option<Vec<String>>, status: GuestStatus) -> (CreateOs, Arc<Recorder>) {
        let rec = Arc::new(Recorder {
            created: Mutex::new(None),
            egress,
            status,
        });
        (CreateOs::new(rec.clone()), rec)
    }

    fn spec(idle: Duration) -> GuestSpec {
        GuestSpec {
            name: "lf-abcdefghijklmnopqrs".into(),
            image: "python-3.12".into(),
            size: Size {
                id: "s-2vcpu-4gb".into(),
                vcpu: 2,
                mem_mib: 4096,
            },
            envs: BTreeMap::new(),
            egress: EgressPolicy::DenyAll,
            lifetime: Lifetime {
                budget: Duration::from_secs(60),
                idle_backstop: idle,
            },
            labels: Labels::ours(),
        }
    }

    #[tokio::test]
    async fn create_spells_deny_all_and_auto_pause_the_createos_way() {
        let (p, rec) = provider(None, GuestStatus::Running);
        p.create(spec(Duration::from_secs(5))).await.unwrap();
        let sent = rec.created.lock().unwrap().clone().unwrap();
        assert_eq!(sent.egress, vec!["240.0.0.0/4".to_owned()]);
        assert_eq!(sent.shape, "s-2vcpu-4gb");
        assert_eq!(sent.name, "lf-abcdefghijklmnopqrs");
        assert_eq!(sent.auto_pause_after_seconds, AUTO_PAUSE_MIN_SECS);
        assert_eq!(auto_pause_secs(Duration::from_secs(900)), 900);
        assert_eq!(
            auto_pause_secs(Duration::from_secs(10 << 20)),
            AUTO_PAUSE_MAX_SECS
        );
        assert_eq!(p.isolation(), Isolation::HardwareVirtualized);
        assert_eq!(p.egress_exceptions()[0].range, "169.254.0.0/16");
    }

    #[tokio::test]
    async fn a_domain_allowlist_is_refused_before_any_create_and_never_matches() {
        let (p, rec) = provider(Some(vec!["pypi.org".into()]), GuestStatus::Running);
        let mut s = spec(Duration::from_secs(60));
        s.egress = EgressPolicy::Domains(vec!["pypi.org".into()]);
        let e = p.create(s.clone()).await.unwrap_err();
        assert_eq!(e.failure, CallFailure::Config, "{e}");
        assert!(e.message.contains("CREATEOS_GATEWAY_URL"), "{e}");
        assert!(rec.created.lock().unwrap().is_none());
        // Were it ever sent, it would be spelled deny-all; CreateOS's echo of a name is no
        // proof.
        assert_eq!(s.egress.rules(), vec!["240.0.0.0/4".to_owned()]);
        assert!(!s.egress.matches(Some(&["pypi.org".to_owned()])));
    }

    #[tokio::test]
    async fn an_allowlist_that_differs_is_reported_escaped() {
        let (p, _) = provider(Some(vec!["*".into()]), GuestStatus::Running);
        let got = p
            .verify_egress("sb-1".into(), EgressPolicy::DenyAll)
            .await
            .unwrap();
        assert_eq!(got, EgressCheck::Differs(r#"["*"]"#.into()));
        let (p, _) = provider(None, GuestStatus::Running);
        let got = p
            .verify_egress("sb-1".into(), EgressPolicy::DenyAll)
            .await
            .unwrap();
        assert_eq!(got, EgressCheck::Differs("(none)".into()));
        let (p, _) = provider(Some(vec!["240.0.0.0/4".into()]), GuestStatus::Running);
        let got = p
            .verify_egress("sb-1".into(), EgressPolicy::DenyAll)
            .await
            .unwrap();
        assert_eq!(got, EgressCheck::Matches);
    }

    #[tokio::test]
    async fn wait_ready_fails_on_a_terminal_guest_and_at_the_deadline() {
        let (p, _) = provider(None, GuestStatus::Running);
        let soon = Instant::now() + Duration::from_secs(1);
        assert_eq!(
            p.wait_ready("sb-1".into(), soon).await.unwrap().status,
            GuestStatus::Running
        );
        let (p, _) = provider(None, GuestStatus::Failed);
        let e = p.wait_ready("sb-1".into(), soon).await.unwrap_err();
        assert_eq!(e.failure, CallFailure::Protocol, "{e}");
        let (p, _) = provider(None, GuestStatus::Creating);
        let e = p
            .wait_ready("sb-1".into(), Instant::now() + Duration::from_millis(250))
            .await
            .unwrap_err();
        assert_eq!(e.failure, CallFailure::Timeout, "{e}");
    }
}
