//! The [`Executor`] and its options, and a flow run's start.
//!
//! One flow run in one guest: create (reaper-guarded) → read the egress back → upload the
//! runner, start it, and write the files and the job → streaming exec of the runner → each frame yielded as it arrives → the
//! guest destroyed at the end, on an error, and when the consumer stops early. This module
//! holds the start up to the runner's exec: the refusals that need no I/O (the run's
//! [`Plan`]), the guest's acquisition, and the cold start of a guest created for the run (a
//! pooled guest's start is in `warm`); what the two starts share is in `prepared`, and what
//! follows the exec is the [`FlowRun`]'s.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use sandbox_core::LOG_TARGET;
use sandbox_core::admission::Caps;
use sandbox_core::exec::Command;
use sandbox_core::gateway::Grant;
use sandbox_core::guest::{ExecInput, Guest, GuestSpec};
use sandbox_core::observe::RunOutcome;
use sandbox_core::pool::PoolStats;
use sandbox_core::provider::ProviderKind;
use sandbox_core::settings::Settings;
use sandbox_core::shapes::{Pin, in_catalog};
use sandbox_core::surface::{
    Acquire, End, Origin, StartError, Surface, SurfaceKind, SurfaceOptions, Want,
};
use sandbox_core::withheld::Withheld;
use sandbox_opensandbox::OpenSandboxSettings;
use tokio::time::Instant;

use crate::error::ExecutorError;
use crate::flow_run::FlowRun;
use crate::frames::{FrameLimits, MAX_FRAME_BYTES};
use crate::job::{FlowRequest, RunHead};
use crate::prepared::{Body, Job, Plan, job_for, upload_files};
use crate::runner::{JOB_PATH, RUNNER_PATH, SOURCE};
use crate::settings::{ENV_ALLOWED_DOMAINS, ENV_SHAPE, ExecutorSettings};
use crate::timings::{self, Timings};
use crate::warm::{preloader, start_warm};
use crate::withhold;

/// The longest frame line accepted by default (16 MiB): the terminal frame carries the run's
/// outputs. The same as [`MAX_FRAME_BYTES`].
pub const DEFAULT_MAX_FRAME_BYTES: usize = MAX_FRAME_BYTES;

/// Reads one environment variable (sandbox-core's, shared by every surface).
pub use sandbox_core::surface::EnvLookup;

/// Knobs for tests, benchmarks and embedders; [`Executor::new`] uses the defaults.
#[derive(Clone)]
pub struct ExecutorOptions {
    /// What every surface shares (the environment lookup, the clocks, the backoff, the reaper,
    /// the session, the warm pool, the fork rule). The executor always destroys a run's guest
    /// before its run ends, whatever `background_destroy` says.
    pub surface: SurfaceOptions,
    /// The host's bounds on what it parses from the guest (default: the `frames::MAX_*`
    /// constants).
    pub limits: FrameLimits,
    /// How long a pool guest's preloaded runner may take to import lfx before the guest is
    /// given up (default 120 s).
    pub preload_wait: Duration,
    /// The provider the session in `surface` runs on (default CreateOS). On OpenSandbox the
    /// run needs no CreateOS key, is refused unless the server's isolation is attested or
    /// container isolation is accepted by its setting, takes the server's image
    /// (`OPEN_SANDBOX_IMAGE`) and, without `CREATEOS_EXECUTOR_SHAPE`, the size
    /// [`OPENSANDBOX_DEFAULT_SIZE`]; a domain allowlist (`CREATEOS_EXECUTOR_ALLOWED_DOMAINS`)
    /// becomes the sandbox's own egress rules (deny plus one FQDN rule per domain, read back
    /// before the job is sent), with no egress gateway.
    pub provider: ProviderKind,
}

/// The size a flow run gets on OpenSandbox when `CREATEOS_EXECUTOR_SHAPE` is unset: 8 GiB, as
/// CreateOS's default shape (flows import heavy libraries).
pub const OPENSANDBOX_DEFAULT_SIZE: &str = "8192Mi";

impl fmt::Debug for ExecutorOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorOptions")
            .field("surface", &self.surface)
            .field("limits", &self.limits)
            .field("preload_wait", &self.preload_wait)
            .field("provider", &self.provider)
            .finish()
    }
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            surface: SurfaceOptions::default(),
            limits: FrameLimits::default(),
            preload_wait: Duration::from_secs(120),
            provider: ProviderKind::CreateOs,
        }
    }
}

/// The whole-flow executor: cheap to build (no I/O), `Send + Sync`, shared by every concurrent
/// run of a process. Build a fresh one in a child after `fork()`.
pub struct Executor {
    opts: ExecutorOptions,
    surface: Surface,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("surface", &self.surface)
            .finish_non_exhaustive()
    }
}

impl Default for Executor {
    fn default() -> Self {
        Self::new()
    }
}

impl Executor {
    /// An executor with default options. Reads nothing yet.
    pub fn new() -> Self {
        Self::with_options(ExecutorOptions::default())
    }

    /// An executor with explicit options (CreateOS's HTTP client installed as the default
    /// connector, `sandbox_createos::install`).
    pub fn with_options(opts: ExecutorOptions) -> Self {
        sandbox_createos::install();
        let warmer = preloader(opts.preload_wait, opts.surface.kill_after);
        Self {
            surface: Surface::with_warmer(SurfaceKind::Executor, opts.surface.clone(), warmer),
            opts,
        }
    }

    /// The surface kit this executor runs on.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// The warm pool's counters (size 0 while `CREATEOS_EXECUTOR_WARM_POOL` is unset).
    pub fn pool_stats(&self) -> PoolStats {
        self.surface.pool_stats()
    }

    /// Guests currently registered with this executor (live runs plus pending destroys).
    pub fn registered_guests(&self) -> usize {
        self.surface.registered_guests()
    }

    /// The refusals that need no I/O, in the order an operator would fix them.
    pub fn plan(&self) -> Result<Plan, ExecutorError> {
        let lookup = |k: &str| self.surface.lookup(k);
        let settings = Settings::from_lookup(&lookup)?;
        let mut executor = ExecutorSettings::from_lookup_on(&lookup, self.opts.provider)?;
        if self.opts.provider == ProviderKind::OpenSandbox {
            let env = Arc::clone(&self.opts.surface.env);
            let os = OpenSandboxSettings::from_lookup(move |k: &str| env(k))?;
            os.require_isolation_for("OpenSandbox executor")?;
            // The server's image (`OPEN_SANDBOX_IMAGE`), never CreateOS's rootfs setting or
            // default.
            executor.rootfs = Some(os.image.clone());
            if lookup(ENV_SHAPE).is_none_or(|v| v.trim().is_empty()) {
                OPENSANDBOX_DEFAULT_SIZE.clone_into(&mut executor.shape);
            }
        } else {
            settings.require_key()?;
        }
        let limits = self
            .surface
            .limits(Duration::from_secs(u64::from(executor.timeout_seconds)));
        // On OpenSandbox a domain allowlist is the sandbox's own egress rules
        // (`EgressPolicy::Domains`, read back before the job goes out): no gateway, no grant.
        let grant =
            if executor.domains.is_empty() || self.opts.provider == ProviderKind::OpenSandbox {
                None
            } else {
                let gateway = settings.gateway.require(ENV_ALLOWED_DOMAINS)?;
                Some(gateway.grant(&executor.domains, limits.host_deadline()))
            };
        Ok(Plan {
            settings,
            executor,
            limits,
            grant,
            withheld: Withheld::from_lookup(&lookup),
        })
    }

    /// Starts `request` in a fresh guest and returns the running flow, whose events arrive
    /// through [`FlowRun::next`]. `host_lfx_version` is the host's lfx version: the per-run
    /// install (`CREATEOS_EXECUTOR_INSTALL_LFX`) pins it, and a guest with another version is
    /// logged. Every refusal happens before a guest exists; a failure after create destroys the
    /// guest before this returns. Dropping the returned future destroys the guest too.
    pub async fn start(
        &self,
        request: &FlowRequest,
        host_lfx_version: Option<&str>,
    ) -> Result<FlowRun, ExecutorError> {
        let body = request.clone();
        self.start_with(&request.head(), async move { Ok(body) }, host_lfx_version)
            .await
    }

    /// [`Executor::start`] for a request whose flow is still being prepared: `head` admits,
    /// refuses and creates the guest, whose runner starts importing lfx at once, while `body`
    /// (the glue's dump of the graph and what it resolves for the flow) completes; the job is
    /// uploaded once both the body and the guest's egress read-back are there. `body` failing
    /// ends the run (the guest destroyed) with its error.
    pub async fn start_with(
        &self,
        head: &RunHead,
        body: impl Future<Output = Result<FlowRequest, ExecutorError>> + Send + 'static,
        host_lfx_version: Option<&str>,
    ) -> Result<FlowRun, ExecutorError> {
        let began = Instant::now();
        let mut t = Timings::default();
        // A flow that asks for what configures the sandbox is refused before anything else.
        withhold::refuse_asked(&head.asked)?;
        let plan = self.plan()?;
        t.plan_ms = Some(timings::since(began));
        // Uploaded files are measured and read before anything is sent: over a bound, the run
        // is refused before any guest exists.
        let at = Instant::now();
        let files = head
            .read_files()
            .await
            .map_err(|why| ExecutorError::Unavailable(outside_text::line(&why).into_owned()))?;
        withhold::check_files(&files, &head.files, &plan.withheld)?;
        t.files_ms = Some(timings::since(at));
        let at = Instant::now();
        let opened = self.surface.open(&plan.settings).await?;
        t.open_ms = Some(timings::since(at));
        let pin = Pin {
            id: &plan.executor.shape,
            setting: ENV_SHAPE,
            otherwise: "",
        };
        in_catalog(&opened.catalog, &pin)?;
        let install: Vec<String> = if plan.executor.install_lfx {
            let lfx = host_lfx_version.map_or_else(|| "lfx".to_owned(), |v| format!("lfx=={v}"));
            std::iter::once(lfx)
                .chain(plan.executor.pip_extras.iter().cloned())
                .collect()
        } else {
            Vec::new()
        };
        // The body is awaited by whichever guest gets the run (a pool guest that cannot take
        // it hands the run to a fresh one, which awaits the same body).
        // Checked as it completes, before any guest (a fresh one or a pooled one) is handed
        // anything of it.
        let withheld = plan.withheld.clone();
        let body: Body = body
            .map(move |r| {
                let request = r?;
                withhold::check_request(&request, &withheld)?;
                Ok(Arc::new(request))
            })
            .boxed()
            .shared();
        let spec = GuestSpec {
            shape: plan.executor.shape.clone(),
            rootfs: plan.rootfs().to_owned(),
            envs: plan
                .grant
                .as_ref()
                .map(Grant::declared_env)
                .unwrap_or_default(),
            egress: plan.executor.egress.clone(),
            auto_pause_after_seconds: plan.limits.auto_pause_seconds(),
        };
        let cx = self.surface.context(&opened);
        let req = Acquire {
            cx: &cx,
            spec: &spec,
            want: Want::OneShot,
            pool_size: plan.executor.warm_pool,
            caps: Caps::of(&plan.settings),
            flow: head.flow_id.as_deref(),
            run_budget: plan.limits.budget,
            node: None,
            session: head.session_id.as_deref(),
        };
        let at = Instant::now();
        let job = Job {
            body: &body,
            install: &install,
            files: &files,
            host_lfx: host_lfx_version,
            began,
            acquire_began: at,
            timings: t,
        };
        let (plan, spec, job) = (&plan, &spec, &job);
        // Boxed: the guest's start holds the exec stream and the uploads' futures.
        let acquired = Box::pin(self.surface.acquire(&req, |guest, begin| async move {
            let run = if begin.origin == Origin::Pooled {
                start_warm(&guest, plan, job, self.opts.limits).await
            } else {
                self.start_cold(&guest, plan, spec, head, job, begin.deadline)
                    .await
            };
            (guest, run)
        }))
        .await?;
        let lease = acquired.lease;
        match acquired.result {
            Ok(mut run) => {
                if lease.origin() == Origin::Pooled {
                    tracing::info!(
                        target: LOG_TARGET,
                        guest = %lease.guest().name(),
                        mode = head.mode.as_str(),
                        pool = ?self.surface.pool_stats(),
                        "flow run: a warm guest took the flow (preloaded runner)"
                    );
                }
                run.lease = Some(lease);
                Ok(run)
            }
            Err(e) => {
                let mut lease = lease;
                let outcome = match &e {
                    ExecutorError::Unavailable(_) => RunOutcome::Refused,
                    _ => RunOutcome::Unavailable,
                };
                lease.set_outcome(outcome, 0);
                lease.end(End::Destroy).await;
                Err(e)
            }
        }
    }

    /// Reads the egress back, then starts the runner on a guest created for this run, so it
    /// imports lfx while the host writes the run's files and waits for the body; the job is
    /// uploaded once all of that is done (the runner waits for it), all by `deadline` (the
    /// create's too: one budget from when the run was admitted).
    async fn start_cold(
        &self,
        guest: &Guest,
        plan: &Plan,
        spec: &GuestSpec,
        head: &RunHead,
        job: &Job<'_>,
        deadline: Instant,
    ) -> Result<FlowRun, StartError<ExecutorError>> {
        let created = Instant::now();
        let mut t = job.timings;
        t.acquire_ms = Some(timings::ms(created - job.acquire_began));
        tracing::info!(
            target: LOG_TARGET,
            guest = %guest.name(),
            rootfs = %spec.rootfs,
            shape = %spec.shape,
            mode = head.mode.as_str(),
            pool = plan.executor.warm_pool,
            "flow run: guest created"
        );
        // Nothing reaches a guest whose egress was not read back and matched: not the runner,
        // not the run's files, not the job. (On a provider whose create answer shows the
        // egress, CreateOS, this asks nothing.)
        guest
            .verify_egress(&spec.egress, deadline)
            .await
            .map_err(|e| StartError::Failed(e.into()))?;
        let mut dispatched = created;
        let runner = async {
            guest
                .upload(RUNNER_PATH, Bytes::from_static(SOURCE.as_bytes()), deadline)
                .await?;
            let exec = guest
                .exec(
                    &cold_runner(),
                    &plan.limits,
                    &ExecInput::default(),
                    deadline,
                )
                .await;
            dispatched = Instant::now();
            exec
        };
        // The runner imports the image's lfx while the run's files are written and the body
        // completes; the job goes last.
        let job_written = async {
            let (uploads, body) = tokio::join!(
                upload_files(guest, job.files, deadline),
                job.body_within(plan),
            );
            uploads.map_err(ExecutorError::from)?;
            let request = body?;
            let bytes = job_for(&request.job(job.install), plan.grant.as_ref(), guest.name())?;
            guest
                .upload(JOB_PATH, bytes, deadline)
                .await
                .map_err(ExecutorError::from)?;
            Ok::<_, ExecutorError>(request)
        };
        let (exec, request) = tokio::join!(runner, job_written);
        t.job_ms = Some(timings::since(created));
        t.dispatch_ms = Some(timings::ms(dispatched - created));
        let exec = exec.map_err(|e| StartError::Failed(e.into()))?;
        let request = request.map_err(StartError::Failed)?;
        t.host_context_ms = request.host_context_ms;
        let mut run = FlowRun::new(
            exec,
            plan,
            &request,
            job,
            self.opts.limits,
            false,
            guest.context().provider.kind(),
        );
        run.timings = t;
        run.dispatched = dispatched;
        Ok(run)
    }

    /// Destroys every guest still registered (the warm pool's among them), within a bounded
    /// time, and refuses new runs.
    pub async fn shutdown(&self) {
        self.surface.shutdown().await;
    }
}

/// The cold runner's exec: it imports lfx at once and waits for the job (`--wait`).
fn cold_runner() -> Command {
    Command::shell(format!("exec python3 -u {RUNNER_PATH} --wait {JOB_PATH}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_opensandbox(vars: &[(&'static str, &'static str)]) -> Executor {
        let vars: Vec<(&'static str, &'static str)> = vars.to_vec();
        Executor::with_options(ExecutorOptions {
            surface: SurfaceOptions {
                env: Arc::new(move |k: &str| {
                    vars.iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| (*v).to_owned())
                }),
                ..SurfaceOptions::default()
            },
            provider: ProviderKind::OpenSandbox,
            ..ExecutorOptions::default()
        })
    }

    #[test]
    fn on_opensandbox_the_sandbox_image_is_open_sandbox_image() {
        let allow = ("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true");
        // Unset: the provider's default image, never CreateOS's `devbox:1`.
        let plan = on_opensandbox(&[allow]).plan().unwrap();
        assert_eq!(plan.rootfs(), sandbox_opensandbox::settings::DEFAULT_IMAGE);
        // Set, also beside CreateOS's rootfs setting, which is not the server's.
        let plan = on_opensandbox(&[
            allow,
            ("OPEN_SANDBOX_IMAGE", "registry.internal/lf-flows:3"),
            ("CREATEOS_EXECUTOR_ROOTFS", "tpl_abc123"),
        ])
        .plan()
        .unwrap();
        assert_eq!(plan.rootfs(), "registry.internal/lf-flows:3");
        assert_eq!(plan.executor.shape, OPENSANDBOX_DEFAULT_SIZE);
    }
}
