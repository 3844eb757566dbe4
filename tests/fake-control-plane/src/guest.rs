//! What every guest route checks first: that the guest exists (404), that it is running (409),
//! and that the env an exec or a managed process sets was declared at create (400).

use std::collections::BTreeMap;

use crate::jsend::{ApiError, ApiResult};
use crate::state::{App, Sandbox, Status};

/// Runs `f` on the sandbox or answers 404.
pub(crate) fn with_sandbox(
    app: &App,
    id: &str,
    f: impl FnOnce(&Sandbox) -> ApiResult,
) -> ApiResult {
    let inner = app.lock();
    let sb = inner
        .sandbox(id)
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    f(sb)
}

/// Runs `f` on the sandbox mutably or answers 404.
pub(crate) fn with_sandbox_mut<T>(
    app: &App,
    id: &str,
    f: impl FnOnce(&mut Sandbox) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let mut inner = app.lock();
    let sb = inner
        .sandbox_mut(id)
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    f(sb)
}

/// The guest's directory, if it can be operated on (running); 409 otherwise.
pub(crate) fn require_running(sb: &Sandbox) -> Result<(), ApiError> {
    match sb.status {
        Status::Running => Ok(()),
        // A pausing guest is as good as paused: the remedy is the same (resume it).
        Status::Paused | Status::Pausing => Err(ApiError::paused()),
        other => Err(ApiError::conflict(format!(
            "sandbox is {}; it must be running",
            other.as_str()
        ))),
    }
}

/// Checks an exec/process `env` against the sandbox's declared keys; returns the merged env.
pub(crate) fn merge_env(
    sb: &Sandbox,
    env: Option<BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut merged = sb.envs.clone();
    if let Some(env) = env {
        for (k, v) in env {
            if !sb.envs.contains_key(&k) {
                return Err(ApiError::bad_request(
                    "env",
                    format!(
                        "environment variable {k:?} was not declared when the sandbox was created"
                    ),
                ));
            }
            merged.insert(k, v);
        }
    }
    Ok(merged)
}
