//! The provider seam: what a sandbox provider must offer the surfaces (the backend, the
//! component, the executor, the reaper and orphan sweep, `doctor`), in provider-neutral terms.
//!
//! sandbox-core decides *policy* for every provider: whether code may run at all, the egress a
//! guest gets ([`EgressPolicy`]), its size, how long it may live, what it is labelled with for
//! cleanup, the deadlines and output caps of every exec, and what happens on every failure
//! (destroy, refuse, report). A provider only *carries those decisions out* on its control
//! plane and reports back what the control plane did, so that sandbox-core can check it:
//!
//! | operation | [`Provider`] method | CreateOS ([`createos`]) | OpenSandbox (`opensandbox`) |
//! |---|---|---|---|
//! | who am I / reachable (`doctor`) | [`Provider::check`] | `GET /v1/whoami` | lifecycle `GET /sandboxes` |
//! | sizes on offer | [`Provider::sizes`] | the shape catalog | operator-configured limits |
//! | create from a neutral spec | [`Provider::create`] | `POST /v1/sandboxes`, unique name | `POST /v1/sandboxes`, name nonce in metadata |
//! | lost create response | [`Provider::find`] | list by name | list by metadata |
//! | wait ready | [`Provider::wait_ready`] | poll until `running` | `Running`, then execd `/ping` |
//! | egress read-back | [`Provider::verify_egress`] | `GET …/egress` | `GET …/networkpolicy` (`dns+nft`) |
//! | exec, streamed | [`Provider::exec_stream`] | `…/exec?stream=true` | execd `/command` via the proxy |
//! | files in / out | [`Provider::upload`], [`Provider::download`] | `…/files` | execd multipart / ranged |
//! | destroy, idempotent | [`Provider::destroy`] | `DELETE` (404 confirmed) | `DELETE` (retry 500, 404 = gone) |
//! | list ours by label and age | [`Provider::list_ours`] | name prefix `lf-` | `created-by` metadata |
//! | keep a kept guest alive | [`Provider::keep_alive`] | auto-pause backstop | renew, clamped, on every adoption |
//! | a kept guest that drifted | [`Provider::replaces_drifted_kept_guests`] | left, run refused | destroyed, created again |
//! | isolation vouched for | [`Provider::isolation`] | always [`Isolation::HardwareVirtualized`] | attested by the operator |
//!
//! The seam is an object-safe trait returning boxed futures, like [`ControlPlane`] beside it
//! (the crate holds its control plane as `Arc<dyn …>` and test doubles implement it in memory;
//! no `async-trait` dependency). It is a trait rather than an enum over the providers so that a
//! provider lives entirely in its own module and a test double is one more implementation; the
//! closed list of providers a *user* can pick is [`ProviderKind`].
//!
//! Where each provider's own knowledge lives:
//!
//! - [`createos`]: everything that is CreateOS's: the `240.0.0.0/4` deny-all spelling, the
//!   link-local hole and its opt-in, the shape catalog and its floor, 22-character names,
//!   auto-pause, and the `createos-api` calls ([`createos::CreateOs`] implements [`Provider`]
//!   over a [`ControlPlane`]);
//! - the `sandbox-opensandbox` crate: the self-hosted OpenSandbox server (issue 41): isolation attestation and
//!   probe, the `dns+nft` read-back, the host-mode canary, nonce adoption, `/ping`, clamped
//!   renew.
//!
//! Errors are [`CallError`]s: already free of any key, classified (transient, declined, not
//! found, conflict) so that sandbox-core's retry and classification ([`crate::classify`]) stay
//! the same for every provider. A provider never retries a call that may have run code
//! (create, exec, spawn); sandbox-core decides what may be repeated.

pub mod createos;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;

pub use crate::control::{
    AgedGuest, CallError, CallFailure, ControlPlane, Download, ExecFrame, ExecRequest, ExecStream,
    GuestInfo, GuestStatus, ProcessSpec, Shape,
};
pub use crate::egress::EgressException;
use crate::egress::EgressPolicy;

pub use crate::kind::ProviderKind;

/// The isolation a provider can vouch for, as lfx's dispatcher reads it (it accepts only
/// [`Isolation::HardwareVirtualized`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isolation {
    /// Each guest is its own virtual machine (CreateOS; OpenSandbox only on the operator's
    /// attestation, cross-checked and probed).
    HardwareVirtualized,
    /// A container on a shared kernel (OpenSandbox without an attestation): lfx refuses it,
    /// and the component and executor refuse it unless the operator opts in by a setting.
    Container,
}

impl Isolation {
    /// lfx's spelling: `hardware-virtualized`, `container`.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::HardwareVirtualized => "hardware-virtualized",
            Isolation::Container => "container",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The size a guest gets, decided by sandbox-core from the provider's [`Provider::sizes`]
/// (never rounding down: see [`crate::shapes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Size {
    /// The provider's id for it (a CreateOS shape id; an OpenSandbox provider may make one up
    /// from its limits).
    pub id: String,
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub mem_mib: u32,
}

impl From<Shape> for Size {
    fn from(s: Shape) -> Self {
        Size {
            id: s.id,
            vcpu: s.vcpu,
            mem_mib: s.mem_mib,
        }
    }
}

/// How long a guest may live, decided by sandbox-core; each provider carries it out its own
/// way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// The longest a run on it may take, every grace included. A provider whose control plane
    /// expires guests on its own (OpenSandbox's `timeout`) sets the expiry beyond this.
    pub budget: Duration,
    /// After this long without use the control plane should stop paying for it even if this
    /// process is gone (CreateOS: the auto-pause backstop, 60 s ..= 24 h; a provider without
    /// idle detection uses it as an absolute expiry on top of `budget`).
    pub idle_backstop: Duration,
}

/// How long a new guest may take from its create's answer until it is ready for a program,
/// when the provider has its own setting for that (OpenSandbox's `OPEN_SANDBOX_READY_SECONDS`).
/// The lifecycle then waits exactly this long, on every surface, and a guest not ready by then
/// is refused with a message that names the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// The budget.
    pub budget: Duration,
    /// The setting it comes from, named in the timeout's message.
    pub setting: &'static str,
}

/// Labels a guest carries so that cleanup finds it (the orphan sweep, `reap`) and a lost create
/// response can be adopted. The keys are this package's; a provider stores them where its
/// control plane keeps such things (CreateOS: the name alone; OpenSandbox: metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(pub BTreeMap<String, String>);

impl Labels {
    /// The label every guest of this package carries: `created-by`.
    pub const CREATED_BY: &'static str = "created-by";
    /// Its value.
    pub const CREATED_BY_US: &'static str = "langflow";
    /// The label naming the surface that made the guest (`backend`, `component`, `executor`).
    pub const SURFACE: &'static str = "lf-surface";
    /// The label of a kept guest (the component's Guest Reuse), value `true`: a provider
    /// without unique names settles two creates of one kept name by it, and its own orphan
    /// sweep leaves such a guest to `reap --older-than`.
    pub const KEPT: &'static str = "lf-kept";

    /// `created-by=langflow` and nothing else.
    pub fn ours() -> Self {
        let mut l = BTreeMap::new();
        l.insert(Self::CREATED_BY.to_owned(), Self::CREATED_BY_US.to_owned());
        Labels(l)
    }

    /// The same labels with `key=value` added.
    #[must_use]
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.0.insert(key.to_owned(), value.to_owned());
        self
    }
}

/// What sandbox-core asks a provider to create: every policy already decided. `Debug` shows
/// the environment's names, never its values.
#[derive(Clone, PartialEq, Eq)]
pub struct GuestSpec {
    /// The guest's key, minted by sandbox-core *before* create ([`crate::names`]), so that a
    /// create whose response was lost can be found ([`Provider::find`]) and destroyed. CreateOS
    /// uses it as the sandbox's unique name; a provider without unique names stores it as a
    /// label and adopts or destroys duplicates.
    pub name: String,
    /// The image: a CreateOS rootfs or template id, an OpenSandbox container image.
    pub image: String,
    /// The size.
    pub size: Size,
    /// Environment declared at create (an exec may only use declared keys).
    pub envs: BTreeMap<String, String>,
    /// The egress policy; the provider spells it for its control plane and refuses
    /// ([`crate::error::ErrorKind::Refused`], before any create) one it cannot enforce.
    pub egress: EgressPolicy,
    /// How long it may live.
    pub lifetime: Lifetime,
    /// Cleanup labels.
    pub labels: Labels,
}

impl fmt::Debug for GuestSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuestSpec")
            .field("name", &self.name)
            .field("image", &self.image)
            .field("size", &self.size)
            .field("envs", &self.envs.keys().collect::<Vec<_>>())
            .field("egress", &self.egress)
            .field("lifetime", &self.lifetime)
            .field("labels", &self.labels)
            .finish()
    }
}

/// What an egress read-back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressCheck {
    /// The control plane enforces exactly the policy asked for.
    Matches,
    /// It does not (another policy, a weaker enforcement mode, no enforcer at all): the guest
    /// must be destroyed and the run refused. The text says what was found, already bounded
    /// and escaped, for the refusal.
    Differs(String),
}

fn unsupported<T: Send + 'static>(what: &str) -> BoxFuture<'static, Result<T, CallError>> {
    let e = CallError::new(CallFailure::Config, format!("this provider cannot {what}"));
    Box::pin(futures::future::ready(Err(e)))
}

/// What a sandbox provider must offer the surfaces. See the module documentation for the map
/// of each operation onto CreateOS and OpenSandbox.
///
/// Every method takes owned arguments and returns a boxed future, so the trait is object-safe
/// and held as `Arc<dyn Provider>`. No method retries a call that may have run code.
pub trait Provider: Send + Sync + 'static {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;

    /// The isolation this provider vouches for *before* any guest exists (lfx's capabilities,
    /// the component's and executor's gate). A provider that can only vouch after checking a
    /// guest (an in-guest probe) reports the weaker isolation here unless the operator
    /// attested it, and refuses in [`Provider::wait_ready`] when the check fails.
    fn isolation(&self) -> Isolation;

    /// The ranges every guest can reach whatever the policy says; each needs the operator's
    /// opt-in before a restricted policy is accepted. None by default.
    fn egress_exceptions(&self) -> &'static [EgressException] {
        &[]
    }

    /// How a refusal names `policy` to the operator, in this provider's terms. The default
    /// says it in neutral words (`deny-all`, `unrestricted`, `only [..]`).
    fn describe_egress(&self, policy: &EgressPolicy) -> String {
        match policy {
            EgressPolicy::AllowAll => "unrestricted".to_owned(),
            EgressPolicy::DenyAll => "deny-all".to_owned(),
            EgressPolicy::Rules(rules) => {
                let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
                format!("only {shown:?}")
            }
            EgressPolicy::Domains(domains) => format!("deny-all but the domains {domains:?}"),
        }
    }

    /// What a create or lookup answer (`info`) already proves about the guest's egress: `None`
    /// when it proves nothing (the default), and the lifecycle then reads the egress back with
    /// [`Provider::verify_egress`]. A provider whose answer is the control plane's stored
    /// record of the guest (CreateOS) saves that read-back.
    fn egress_in_answer(&self, info: &GuestInfo, policy: &EgressPolicy) -> Option<EgressCheck> {
        let _ = (info, policy);
        None
    }

    /// Whether a guest whose status is [`GuestStatus::Running`] already serves exec and files
    /// (CreateOS). When not (the default), the lifecycle calls [`Provider::wait_ready`] once the
    /// guest runs, before any program.
    fn running_is_ready(&self) -> bool {
        false
    }

    /// The provider's own readiness budget ([`Readiness`]): `None` (the default, CreateOS,
    /// whose create holds until the guest runs) leaves the wait to the run's control-plane
    /// budget.
    fn readiness(&self) -> Option<Readiness> {
        None
    }

    /// Whether the control plane pauses a guest nobody uses (CreateOS's auto-pause). Then a
    /// paused one-shot guest can only be an orphan; without it (the default) the orphan sweep
    /// goes by the guest's age instead.
    fn pauses_idle_guests(&self) -> bool {
        false
    }

    /// What becomes of a kept guest found with another egress policy or other declared
    /// environment keys than the run asks for. `false` (the default, CreateOS): it is left as
    /// it is and the run refused (its name stays taken until someone deletes it). `true` (a
    /// provider without unique names, whose kept guests expire on their own: OpenSandbox): it
    /// is destroyed and a new one created under the same name, checked like any new guest.
    fn replaces_drifted_kept_guests(&self) -> bool {
        false
    }

    /// Which control plane this is, as a number that is the same for every handle on the same
    /// one and differs between two that live at once (the warm pool keeps one account's
    /// guests from another's runs). By default this value's address.
    fn identity(&self) -> usize {
        std::ptr::from_ref(self).cast::<()>() as usize
    }

    /// Checks the credential and reachability (`doctor`, the session's first call); returns a
    /// short account label for logs, without any secret.
    fn check(&self) -> BoxFuture<'_, Result<String, CallError>>;

    /// The sizes on offer, for sandbox-core's choice.
    fn sizes(&self) -> BoxFuture<'_, Result<Vec<Size>, CallError>>;

    /// Creates a guest from `spec`. Never retried by the implementation (sandbox-core mints a
    /// fresh name for a retry and hands the old one to the reaper). The answer may still be
    /// starting: see [`Provider::wait_ready`].
    fn create(&self, spec: GuestSpec) -> BoxFuture<'_, Result<GuestInfo, CallError>>;

    /// Finds a guest by the name its [`GuestSpec::name`] gave it; a guest that is not terminal
    /// wins over a terminal one. `None` when there is none.
    fn find(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>>;

    /// Reads one guest by id.
    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>>;

    /// Waits until the guest serves exec and files, or `deadline`; a guest that turns terminal
    /// fails the wait. A provider whose isolation or identity must be checked inside the guest
    /// checks it here, before any user code.
    fn wait_ready(
        &self,
        id: String,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>>;

    /// Reads the guest's egress back and compares it with `policy`.
    fn verify_egress(
        &self,
        id: String,
        policy: EgressPolicy,
    ) -> BoxFuture<'_, Result<EgressCheck, CallError>>;

    /// Starts a streamed exec; [`ExecRequest::timeout`] bounds the whole stream. Frames end
    /// with [`ExecFrame::Exit`] (or [`ExecFrame::Error`]); sandbox-core enforces the output
    /// caps and the host deadline while reading. Dropping the stream stops the command.
    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>>;

    /// Writes a file in the guest, creating its parent directories.
    fn upload(&self, id: String, path: String, data: Bytes)
    -> BoxFuture<'_, Result<(), CallError>>;

    /// Starts downloading the file at `path`; the implementation may enforce `max_bytes`, and
    /// sandbox-core always does. An archive is made in the guest (`tar`) and downloaded as a
    /// file.
    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>>;

    /// Destroys a guest; one that is already gone counts as destroyed. Idempotent.
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>>;

    /// Every guest of this package whose name starts with `prefix`, with its creation time when
    /// known, whatever its status. The walk is bounded (pages and time) and fails rather than
    /// hang. The orphan sweep and `reap` filter by age.
    fn list_ours(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>>;

    /// Makes a kept guest last at least `idle` more without use (CreateOS: raises the
    /// auto-pause backstop; OpenSandbox: renews the server-side expiry, clamped, never
    /// shortening it). sandbox-core calls it when it adopts a kept guest whose backstop is too
    /// short, and on a provider that does not pause idle guests
    /// ([`Provider::pauses_idle_guests`]) on every adoption, so that a kept guest nobody uses
    /// still expires on its own.
    fn keep_alive(
        &self,
        id: String,
        idle: Duration,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        unsupported(&format!("keep guest {id} alive for {}s", idle.as_secs()))
    }

    /// Asks a paused guest to resume.
    fn resume(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        unsupported(&format!("resume guest {id}"))
    }

    /// Starts a long-lived process in the guest (the executor's warm runner). Never retried.
    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        unsupported(&format!("start a process ({:?}) in guest {id}", spec.cmd))
    }
}

/// A deadline as a duration from now (zero once passed), for providers that poll.
pub fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_kinds_parse_their_own_spelling_only() {
        for k in ProviderKind::ALL {
            assert_eq!(ProviderKind::parse(k.as_str()), Some(k));
            assert_eq!(
                ProviderKind::parse(&format!(" {} ", k.as_str().to_uppercase())),
                Some(k)
            );
        }
        assert_eq!(ProviderKind::parse("open-sandbox"), None);
        assert_eq!(ProviderKind::parse(""), None);
        assert_eq!(ProviderKind::default(), ProviderKind::CreateOs);
    }

    #[test]
    fn isolation_is_spelled_as_lfx_reads_it() {
        assert_eq!(
            Isolation::HardwareVirtualized.to_string(),
            "hardware-virtualized"
        );
        assert_eq!(Isolation::Container.to_string(), "container");
    }

    #[test]
    fn spec_debug_shows_env_names_not_values() {
        let mut envs = BTreeMap::new();
        envs.insert("TOKEN".to_owned(), "v-secret-1".to_owned());
        let spec = GuestSpec {
            name: "lf-x".into(),
            image: "img".into(),
            size: Size {
                id: "s".into(),
                vcpu: 1,
                mem_mib: 4096,
            },
            envs,
            egress: EgressPolicy::DenyAll,
            lifetime: Lifetime {
                budget: Duration::from_secs(60),
                idle_backstop: Duration::from_secs(300),
            },
            labels: Labels::ours(),
        };
        let shown = format!("{spec:?}");
        assert!(
            shown.contains("TOKEN") && !shown.contains("v-secret-1"),
            "{shown}"
        );
    }
}
