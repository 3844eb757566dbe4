//! What a flow run has before it has a guest, shared by every way it starts (a guest created
//! for the run in `start`, a pooled guest in `warm`) and by the [`FlowRun`](crate::FlowRun) that
//! follows: its [`Plan`] (every decision that needs no I/O) and its [`Job`] (what each guest the
//! run tries is handed: the rest of the request as the glue completes it, the per-run install,
//! the uploaded files already read), and the two steps every start takes with them in a guest
//! ([`job_for`], [`upload_files`]).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use sandbox_core::SandboxError;
use sandbox_core::exec::ExecLimits;
use sandbox_core::gateway::Grant;
use sandbox_core::guest::Guest;
use sandbox_core::settings::{DEFAULT_ROOTFS, Settings};
use sandbox_core::withheld::Withheld;
use tokio::time::Instant;

use crate::error::ExecutorError;
use crate::job::FlowRequest;
use crate::settings::ExecutorSettings;
use crate::timings::Timings;

/// Everything a run decides before any I/O.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The package's shared settings (key, endpoint).
    pub settings: Settings,
    /// The executor's own.
    pub executor: ExecutorSettings,
    /// The clocks.
    pub limits: ExecLimits,
    /// The domain grant (`CREATEOS_EXECUTOR_ALLOWED_DOMAINS`): the guest's proxy variables.
    pub grant: Option<Grant>,
    /// The values of this process's secret settings, never sent to a guest.
    pub withheld: Withheld,
}

impl Plan {
    /// The rootfs the guest gets.
    pub fn rootfs(&self) -> &str {
        self.executor.rootfs.as_deref().unwrap_or(DEFAULT_ROOTFS)
    }
}

/// The rest of a run's request, as the glue completes it (shared: a pool guest that cannot
/// take the run hands it to a fresh guest, which awaits the same body).
pub(crate) type Body = Shared<BoxFuture<'static, Result<Arc<FlowRequest>, ExecutorError>>>;

/// What every guest a run tries needs from the run's start.
pub(crate) struct Job<'a> {
    /// The rest of the request.
    pub(crate) body: &'a Body,
    /// The pip requirements of the per-run install (empty: none).
    pub(crate) install: &'a [String],
    /// The uploaded files, read before any guest existed.
    pub(crate) files: &'a [(String, Bytes)],
    /// The host's lfx version (the per-run install pins it; a guest with another is logged).
    pub(crate) host_lfx: Option<&'a str>,
    /// When the run started, and when it asked for its guest.
    pub(crate) began: Instant,
    pub(crate) acquire_began: Instant,
    /// The phases measured before the guest.
    pub(crate) timings: Timings,
}

impl Job<'_> {
    /// The rest of the request, waited for no longer than the run's own host deadline.
    pub(crate) async fn body_within(&self, plan: &Plan) -> Result<Arc<FlowRequest>, ExecutorError> {
        let within = plan.limits.host_deadline();
        tokio::time::timeout(within, self.body.clone())
            .await
            .unwrap_or_else(|_| {
                Err(ExecutorError::Execution(format!(
                    "the host did not complete the flow's request within {}s (resolving its \
                     variables, history and files); nothing of the flow ran and the guest was \
                     destroyed",
                    within.as_secs()
                )))
            })
    }
}

/// The job document for a run in `guest`: with a domain grant, it carries the proxy
/// variables with a token minted for that guest (the runner sets them before anything of the
/// run opens a connection; the job file is removed before the flow runs).
pub(crate) fn job_for(
    job: &serde_json::Value,
    grant: Option<&Grant>,
    guest: &str,
) -> Result<Bytes, ExecutorError> {
    let mut job = job.clone();
    if let (Some(grant), Some(doc)) = (grant, job.as_object_mut()) {
        let env = grant.env_for(guest)?;
        doc.insert("env".to_owned(), serde_json::json!(env));
    }
    serde_json::to_vec(&job)
        .map(Bytes::from)
        .map_err(|e| ExecutorError::Execution(format!("the flow could not be serialized: {e}")))
}

/// Writes the run's uploaded files in the guest (at their guest paths), all at once.
pub(crate) async fn upload_files(
    guest: &Guest,
    files: &[(String, Bytes)],
    deadline: Instant,
) -> Result<(), SandboxError> {
    futures::future::try_join_all(
        files
            .iter()
            .map(|(path, data)| guest.upload(path, data.clone(), deadline)),
    )
    .await
    .map(drop)
}
