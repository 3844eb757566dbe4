//! `LANGFLOW_SANDBOX_BACKEND=opensandbox`: lfx's sandbox backend on a self-hosted OpenSandbox
//! server, one fresh sandbox per run, through sandbox-core's OpenSandbox provider.
//!
//! lfx decides from [`capabilities_with`]: `hardware-virtualized` only when the operator
//! attests it (`OPEN_SANDBOX_ATTEST_ISOLATION`), else `container`, which lfx's dispatcher
//! refuses. Every run then creates a sandbox that passes the provider's checks (egress
//! read-back, RuntimeClass, host-network canary, isolation probe) before the program is sent,
//! runs it under lfx's timeout with the per-stream output cap, and deletes it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandbox_core::observe::RunOutcome;
use sandbox_core::plan::SurfaceError;
use sandbox_core::provider::opensandbox::{
    Egress, OpenSandboxProvider, OpenSandboxSettings, SandboxSpec,
};
use sandbox_core::settings::DEFAULT_MAX_OUTPUT_BYTES;
use sandbox_core::surface::PoolUse;
use sandbox_core::timings::Timings;

use crate::{Capabilities, LfxPolicy, RunOutput};

/// The smallest memory limit a sandbox gets, in MiB (lfx's floor of 128 is too little for
/// `python3` plus the image's own processes).
pub const MIN_MEMORY_MIB: u32 = 256;

/// What the OpenSandbox backend declares to lfx's policy gate, under the settings `lookup`
/// reads. No I/O. A setting that does not parse declares `none`, which lfx refuses (the run
/// would refuse with the setting's name anyway).
pub fn capabilities_with(
    lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
) -> Capabilities {
    let isolation =
        OpenSandboxSettings::from_lookup(lookup).map_or("none", |s| s.declared_isolation());
    Capabilities {
        isolation,
        supports_deny_all_egress: true,
        supports_domain_allowlist: true,
        max_timeout_seconds: None,
    }
}

/// The OpenSandbox backend of one process: the provider, built on the first run from the
/// process environment.
#[derive(Debug, Default)]
pub struct OpenSandboxBackend {
    provider: Mutex<Option<OpenSandboxProvider>>,
}

fn unavailable(e: &sandbox_core::SandboxError) -> SurfaceError {
    SurfaceError::from(e.clone())
}

/// The egress lfx's settings ask for: deny-all unless the network is allowed; with domains, a
/// deny-all policy with those FQDN rules.
pub fn egress_of(policy: &LfxPolicy) -> Egress {
    match (policy.allow_network, policy.allowed_domains.is_empty()) {
        (false, _) => Egress::DenyAll,
        (true, true) => Egress::Unrestricted,
        (true, false) => Egress::Domains(policy.allowed_domains.clone()),
    }
}

impl OpenSandboxBackend {
    /// A backend that reads nothing and builds nothing until its first run.
    pub fn new() -> Self {
        Self::default()
    }

    fn provider(
        &self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<OpenSandboxProvider, SurfaceError> {
        let mut held = self
            .provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = held.as_ref() {
            return Ok(p.clone());
        }
        let settings = OpenSandboxSettings::from_lookup(lookup).map_err(|e| unavailable(&e))?;
        let p = OpenSandboxProvider::new(settings).map_err(|e| unavailable(&e))?;
        *held = Some(p.clone());
        Ok(p)
    }

    /// Runs `code` under `policy` in a fresh sandbox (settings from the process environment).
    pub async fn run(
        &self,
        code: &str,
        env: Option<BTreeMap<String, String>>,
        policy: &LfxPolicy,
    ) -> Result<RunOutput, SurfaceError> {
        self.run_with(code, env, policy, |k| std::env::var(k).ok())
            .await
    }

    /// [`OpenSandboxBackend::run`] with the settings `lookup` reads (read on the first run).
    pub async fn run_with(
        &self,
        code: &str,
        env: Option<BTreeMap<String, String>>,
        policy: &LfxPolicy,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<RunOutput, SurfaceError> {
        let started = Instant::now();
        policy.validate().map_err(|e| unavailable(&e))?;
        let provider = self.provider(lookup)?;
        let timeout = Duration::from_secs(u64::from(policy.timeout_seconds));
        let spec = SandboxSpec {
            egress: egress_of(policy),
            memory_mb: policy.memory_mb.max(MIN_MEMORY_MIB),
            surface: "backend",
            run_budget: timeout + Duration::from_secs(30),
        };
        let mut sandbox = provider.create(&spec).await.map_err(|e| unavailable(&e))?;
        let acquired = started.elapsed();
        let exec_started = Instant::now();
        let ran = sandbox
            .run_python(
                code,
                &env.unwrap_or_default(),
                timeout,
                DEFAULT_MAX_OUTPUT_BYTES,
            )
            .await;
        let exec = exec_started.elapsed();
        let guest_id = sandbox.id().to_owned();
        let destroy_started = Instant::now();
        sandbox.destroy().await;
        let destroyed = destroy_started.elapsed();
        let out = ran.map_err(SurfaceError::from)?;
        let outcome = match out.exit_code {
            0 => RunOutcome::Ok,
            sandbox_core::provider::opensandbox::lifecycle::EXIT_TIMED_OUT => RunOutcome::TimedOut,
            _ => RunOutcome::ProgramFailed,
        };
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let timings = Timings {
            acquire_ms: Some(ms(acquired)),
            exec_ms: Some(ms(exec)),
            destroy_ms: Some(ms(destroyed)),
            total_ms: Some(ms(started.elapsed())),
            ..Timings::default()
        };
        tracing::info!(
            target: sandbox_core::LOG_TARGET,
            provider = "opensandbox",
            guest = %guest_id,
            outcome = outcome.as_str(),
            exit_code = out.exit_code,
            acquire_ms = timings.acquire_ms,
            exec_ms = timings.exec_ms,
            destroy_ms = timings.destroy_ms,
            "sandbox run finished"
        );
        Ok(RunOutput {
            stdout: out.stdout.into(),
            stderr: out.stderr.into(),
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            exit_code: out.exit_code,
            raw_exit_code: Some(out.exit_code),
            host_timed_out: false,
            execution_time_ms: ms(out.elapsed),
            timings,
            guest: guest_id.clone(),
            guest_id,
            pool: PoolUse::Off,
            outcome,
        })
    }

    /// Deletes (or with `dry_run` only lists) this deployment's sandboxes (by `created-by`)
    /// older than `older_than`: the orphan sweep for what a dead process left before the
    /// server-side timeout removes it. Settings from the process environment.
    pub async fn sweep(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Vec<String>, SurfaceError> {
        let provider = self.provider(|k| std::env::var(k).ok())?;
        provider
            .sweep(older_than, dry_run)
            .await
            .map_err(SurfaceError::from)
    }
}
