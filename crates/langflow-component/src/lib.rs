//! The CreateOS Sandbox component's semantics, as plain Rust over `sandbox-core`.
//!
//! A "CreateOS Sandbox" node on the Langflow canvas runs a Python program or a shell command
//! in a CreateOS microVM, optionally in a guest that survives between runs of the flow
//! ([`Reuse::Flow`], or one per Langflow session with [`Reuse::Session`]), and optionally
//! hands back the files the run wrote to its own artifacts directory
//! ([`ComponentInputs::return_files`], [`ARTIFACTS_DIR`]). This crate decides everything:
//! which settings apply, what is refused before any guest exists, which guest a run uses,
//! what it sends, and what it returns. The Python component (in `py-bindings`) only gathers
//! the node's inputs and builds lfx's `Data`/`DataFrame` from a [`ComponentOutput`].
//!
//! Egress, timeouts, output caps, retries, error classes and key redaction are the backend's:
//! the same `sandbox-core` primitives, with refusals that name this node's own inputs
//! ([`SETTING_NAMES`]).

use std::fmt;

use sandbox_core::SandboxError;
use sandbox_core::observe::RunOutcome;
use sandbox_core::pool::PoolStats;
use sandbox_core::surface::{Surface, SurfaceKind};

pub mod archive;
mod artifacts;
pub mod identity;
mod inputs;
mod kept;
mod plan;
mod run;

pub use archive::{ArchiveLimits, Extracted, ReturnedFile, read_archive};
pub use inputs::{
    ComponentInputs, DEFAULT_TIMEOUT_SECONDS, DOMAIN_SETTING_NAMES, MAX_COMMAND_BYTES,
    MAX_TIMEOUT_SECONDS, Reuse, SETTING_NAMES, input,
};
pub use kept::{ReapReport, ReusedGuest, parse_age};
pub use plan::{DESCRIPTION, describe, strip_fence};

/// Where the program writes the files it returns: with Return Files on, a link to this run's
/// own directory while no other run shares the guest ([`ARTIFACTS_ENV`] always names it).
pub const ARTIFACTS_DIR: &str = "/workspace/artifacts";
/// The environment variable that names this run's own artifacts directory (Return Files on).
pub const ARTIFACTS_ENV: &str = "ARTIFACTS_DIR";
/// Where each run with Return Files on keeps its own directory (`<run id>/artifacts`) while it
/// runs; the run's end removes it.
pub const RUNS_DIR: &str = "/workspace/.lf-runs";
/// Where [`ARTIFACTS_DIR`] points while two runs share a kept guest: returned to neither.
pub const SHARED_DIR: &str = "/workspace/.lf-runs-shared";
/// The largest archive of returned files downloaded (5 MiB), enforced during the transfer.
pub const MAX_ARCHIVE_BYTES: u64 = 5 * 1024 * 1024;

/// `LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS`: the operator accepts that deny-all
/// egress still reaches `169.254.0.0/16` (the sandbox backend's opt-in, which this node
/// honours too).
pub const ENV_ACCEPT_EGRESS_EXCEPTIONS: &str = "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS";

/// Per-phase timings of one execution (sandbox-core's one timings type): `acquire_ms`
/// (create, or find + resume + read-back for a kept guest), `upload_ms`, `exec_ms`, `files_ms`
/// (archiving, downloading and reading the returned files; 0 when off), `destroy_ms` (0 for a
/// kept guest, which is released), `total_ms` and `requests`.
pub use sandbox_core::timings::Timings;

/// The outcome of one execution whose program ran. A failing program is an outcome, not an
/// error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // independent facts of one outcome, not a state
pub struct ComponentOutput {
    /// Standard output, trimmed (its tail, with a marker, if over the cap).
    pub result: String,
    /// Standard error, trimmed (likewise).
    pub stderr: String,
    /// Exit code: `-1` when the run hit its timeout, else the program's status.
    pub exit_code: i32,
    /// The run hit its timeout.
    pub timed_out: bool,
    /// What went wrong, when the program failed (`None` on exit 0).
    pub error: Option<String>,
    /// Standard output was cut to the cap.
    pub stdout_truncated: bool,
    /// Standard error was cut to the cap.
    pub stderr_truncated: bool,
    /// The guest's sandbox id.
    pub sandbox_id: String,
    /// The guest's name (`lf-c-…` for a kept guest).
    pub sandbox_name: String,
    /// The guest was kept from an earlier run (found by name), not created by this one.
    pub reused_guest: bool,
    /// The guest is kept for the next run (Guest Reuse: flow or session).
    pub kept: bool,
    /// The files returned (empty when Return Files is off).
    pub files: Vec<ReturnedFile>,
    /// What was skipped or went wrong while returning files.
    pub notes: Vec<String>,
    /// Where the time went.
    pub timings: Timings,
    /// How the run went (ok, program failed, timed out), as the metrics count it.
    pub outcome: RunOutcome,
}

/// Why an execution produced no outcome: sandbox-core's error, whose kind says which lfx
/// exception it is (`kind().is_unavailable()`: `SandboxUnavailableError`, nothing ran;
/// otherwise `SandboxExecutionError`, and the message says whether the code may have run).
/// `Display` is the message; it names the input or setting involved and never contains the
/// API key.
pub type ComponentError = SandboxError;

/// The providers a component can run on (re-exported).
pub use sandbox_core::provider::ProviderKind;
/// Reads one environment variable (sandbox-core's, shared by every surface).
pub use sandbox_core::surface::EnvLookup;
/// The options every surface shares, embedded in [`ComponentOptions`] (re-exported).
pub use sandbox_core::surface::SurfaceOptions;

/// Knobs for tests and embedders; `ComponentOptions::default()` is the process environment and a
/// fresh session.
#[derive(Clone)]
pub struct ComponentOptions {
    /// What every surface shares (the environment lookup, the clocks, the backoff, the reaper,
    /// the session, the warm pool for reuse-off runs, the fork rule). The component always
    /// destroys a fresh guest before a run returns, whatever `background_destroy` says.
    pub surface: SurfaceOptions,
    /// Bounds on the archive of returned files.
    pub archive: ArchiveLimits,
    /// The largest archive downloaded.
    pub max_archive_bytes: u64,
    /// The provider the session in `surface` runs on (default CreateOS). On OpenSandbox a run
    /// needs no CreateOS key, is refused unless the server's isolation is attested or
    /// container isolation is accepted by its setting, takes the server's image
    /// (`OPEN_SANDBOX_IMAGE`), a size of the provider's (`4096Mi`, ...) for Shape, and has no
    /// link-local egress exception.
    pub provider: ProviderKind,
}

impl fmt::Debug for ComponentOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComponentOptions")
            .field("surface", &self.surface)
            .field("archive", &self.archive)
            .field("max_archive_bytes", &self.max_archive_bytes)
            .field("provider", &self.provider)
            .finish()
    }
}

impl Default for ComponentOptions {
    fn default() -> Self {
        Self {
            surface: SurfaceOptions::default(),
            archive: ArchiveLimits::default(),
            max_archive_bytes: MAX_ARCHIVE_BYTES,
            provider: ProviderKind::CreateOs,
        }
    }
}

/// The CreateOS Sandbox component of one process: cheap to build, `Send + Sync`, shared by
/// every concurrent execution. Fresh guests are registered with its reaper (destroyed on
/// every path, and at [`SandboxComponent::shutdown`]); kept guests are never destroyed by
/// it. With `CREATEOS_SANDBOX_WARM_POOL=N`, reuse-off runs take their fresh guest from a warm
/// pool of its own (sandbox-core's [`sandbox_core::pool::WarmPool`], the backend's rules: one run per guest,
/// destroyed after it and at shutdown).
#[derive(Debug)]
pub struct SandboxComponent {
    opts: ComponentOptions,
    surface: Surface,
}

impl SandboxComponent {
    /// A component with explicit options (CreateOS's HTTP client installed as the default
    /// connector, `sandbox_createos::install`).
    pub fn with_options(opts: ComponentOptions) -> Self {
        sandbox_createos::install();
        Self {
            surface: Surface::new(SurfaceKind::Component, opts.surface.clone()),
            opts,
        }
    }

    /// The surface kit this component runs on.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// Fresh guests still registered (runs in flight and destroys being retried), not
    /// counting the warm pool's idle guests, which belong to no run.
    pub fn registered_guests(&self) -> usize {
        self.surface.unpooled_guests()
    }

    /// The warm pool's counters (size 0 while `CREATEOS_SANDBOX_WARM_POOL` is unset or 0).
    pub fn pool_stats(&self) -> PoolStats {
        self.surface.pool_stats()
    }

    /// Destroys every fresh guest still registered (runs in flight, destroys being retried)
    /// within a bounded time and refuses new runs. Kept guests are left for the next
    /// process. Idempotent.
    pub async fn shutdown(&self) {
        self.surface.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SandboxComponent>();
    }
}
