//! The values the extension hands to Python: capabilities, a run's result and its output
//! streams, timings, and the report of `reap()`. Each is a frozen class built from
//! `langflow-backend`'s plain Rust values, with a `repr` that never shows output text.

use std::sync::{Mutex, PoisonError};

use langflow_backend::{Piece, RunOutput, SweepReport, Text};
use pyo3::prelude::*;
use pyo3::types::PyString;

/// What the backend declares to lfx's policy gate. Built without I/O.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct NativeCapabilities {
    /// Isolation class; lfx accepts only `"hardware-virtualized"`.
    isolation: String,
    /// Whether `LANGFLOW_SANDBOX_ALLOW_NETWORK=false` can be honoured.
    supports_deny_all_egress: bool,
    /// Whether `LANGFLOW_SANDBOX_ALLOWED_DOMAINS` can be honoured.
    supports_domain_allowlist: bool,
    /// Largest timeout the backend accepts, or `None` for no cap.
    max_timeout_seconds: Option<u32>,
}

#[pymethods]
impl NativeCapabilities {
    fn __repr__(&self) -> String {
        format!(
            "NativeCapabilities(isolation={:?}, supports_deny_all_egress={}, \
             supports_domain_allowlist={}, max_timeout_seconds={:?})",
            self.isolation,
            py_bool(self.supports_deny_all_egress),
            py_bool(self.supports_domain_allowlist),
            self.max_timeout_seconds
        )
    }
}

fn py_bool(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

impl From<langflow_backend::Capabilities> for NativeCapabilities {
    fn from(caps: langflow_backend::Capabilities) -> Self {
        NativeCapabilities {
            isolation: caps.isolation.to_owned(),
            supports_deny_all_egress: caps.supports_deny_all_egress,
            supports_domain_allowlist: caps.supports_domain_allowlist,
            max_timeout_seconds: caps.max_timeout_seconds,
        }
    }
}

/// Returns the backend's capabilities (a secret given as a file is read from it). No network
/// I/O, no thread.
#[pyfunction]
pub fn capabilities() -> NativeCapabilities {
    NativeCapabilities::from(langflow_backend::capabilities())
}

/// Where the time of one run went, in milliseconds.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
#[derive(Clone)]
pub struct Timings {
    /// Creating the guest (until it runs).
    create_ms: u64,
    /// Uploading the program.
    upload_ms: u64,
    /// Executing it.
    exec_ms: u64,
    /// Destroying the guest; `None` when the destroy was handed to the background reaper.
    destroy_ms: Option<u64>,
    /// The whole run.
    total_ms: u64,
    /// Control-plane requests made on the run's critical path.
    requests: u32,
}

impl Timings {
    /// The backend's phases of sandbox-core's one timings type, under the names this class has
    /// always had (`create_ms` is getting the guest: a create, or a warm pool guest).
    fn of(t: &sandbox_core::timings::Timings) -> Self {
        Self {
            create_ms: t.acquire_ms.unwrap_or_default(),
            upload_ms: t.upload_ms.unwrap_or_default(),
            exec_ms: t.exec_ms.unwrap_or_default(),
            destroy_ms: t.destroy_ms,
            total_ms: t.total_ms.unwrap_or_default(),
            requests: t
                .requests
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        }
    }
}

#[pymethods]
impl Timings {
    fn __repr__(&self) -> String {
        format!(
            "Timings(create_ms={}, upload_ms={}, exec_ms={}, destroy_ms={}, total_ms={}, requests={})",
            self.create_ms,
            self.upload_ms,
            self.exec_ms,
            self.destroy_ms
                .map_or_else(|| "None".to_owned(), |ms| ms.to_string()),
            self.total_ms,
            self.requests
        )
    }
}

/// Largest `str` handed to Python per step when an [`Output`] is taken apart: small enough
/// that the step's temporary `str` costs little, large enough that there are few steps.
/// Exported as `_native.OUTPUT_PIECE_BYTES`, so the stubs' value is checked by `stubtest`.
pub const STEP_BYTES: usize = 448;

/// One stream of a run's output, handed to Python as an iterator of `str` pieces.
///
/// The pieces' Rust memory is released as each one is taken, and the package joins them with
/// `+=`, which CPython performs in place on a `str` nobody else holds. So a capped stream
/// (1 MiB by default) exists about once in memory while it becomes one Python `str`, never
/// twice as a copy from one whole buffer to another would need.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct Output {
    /// What is left to hand over: the text, and the piece being handed over with how many of
    /// its bytes already were. Locked only for one step, always with the GIL held.
    rest: Mutex<(Text, Option<(Piece, usize)>)>,
    /// Bytes of text at the start.
    len: usize,
}

impl Output {
    fn new(text: Text) -> Self {
        Self {
            len: text.len(),
            rest: Mutex::new((text, None)),
        }
    }
}

#[pymethods]
impl Output {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece: at most `STEP_BYTES` bytes, always whole characters.
    fn __next__<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        let mut rest = self.rest.lock().unwrap_or_else(PoisonError::into_inner);
        let (text, current) = &mut *rest;
        loop {
            if current.is_none() {
                *current = Some((text.next()?, 0));
            }
            let (piece, offset) = current.as_mut()?;
            let bytes = piece.as_bytes();
            if *offset < bytes.len() {
                let mut end = (*offset + STEP_BYTES).min(bytes.len());
                // Back off to a character start (a piece is whole UTF-8 characters).
                while end < bytes.len() && (bytes[end] & 0b1100_0000) == 0b1000_0000 {
                    end -= 1;
                }
                let step = PyString::new(py, &String::from_utf8_lossy(&bytes[*offset..end]));
                *offset = end;
                return Some(step);
            }
            // This piece is done: dropping it returns its memory.
            *current = None;
        }
    }

    /// Bytes of text the stream held when the run finished.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!("Output(nbytes={})", self.len)
    }
}

/// The outcome of one run: what the guest printed and how it exited.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct RunResult {
    /// Standard output (capped; see `stdout_truncated`), to be taken once piece by piece.
    stdout: Py<Output>,
    /// Standard error (capped; see `stderr_truncated`), likewise.
    stderr: Py<Output>,
    /// Exit code; `-1` means timed out, `137` killed (usually out of memory).
    exit_code: i32,
    /// Wall time of the run as lfx reports it.
    execution_time_ms: u64,
    /// Whether stdout went over the per-stream cap.
    stdout_truncated: bool,
    /// Whether stderr went over the per-stream cap.
    stderr_truncated: bool,
    /// Name of the guest that ran the code (already destroyed).
    guest: String,
    /// How the run went, as the metrics count it: `ok`, `program_failed` or `timed_out`.
    outcome: &'static str,
    /// Where the time went.
    timings: Timings,
}

#[pymethods]
impl RunResult {
    fn __repr__(&self) -> String {
        format!(
            "RunResult(exit_code={}, stdout_len={}, stderr_len={}, guest={:?}, timings={})",
            self.exit_code,
            self.stdout.get().len,
            self.stderr.get().len,
            self.guest,
            self.timings.__repr__()
        )
    }
}

impl RunResult {
    pub(crate) fn new(py: Python<'_>, out: RunOutput) -> PyResult<Self> {
        Ok(Self {
            stdout: Py::new(py, Output::new(out.stdout))?,
            stderr: Py::new(py, Output::new(out.stderr))?,
            exit_code: out.exit_code,
            execution_time_ms: out.execution_time_ms,
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            guest: out.guest,
            outcome: out.outcome.as_str(),
            timings: Timings::of(&out.timings),
        })
    }
}

/// What `reap()` did: the orphaned guests deleted (or, in a dry run, that would be).
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct ReapReport {
    /// Nothing was deleted; `deleted` lists what would have been.
    dry_run: bool,
    /// `lf-` guests the listing returned, in any status.
    examined: usize,
    /// `(name, id)` of each orphan deleted (or that would be).
    deleted: Vec<(String, String)>,
    /// `(name, id, error)` of each orphan that could not be deleted.
    failed: Vec<(String, String, String)>,
}

#[pymethods]
impl ReapReport {
    fn __repr__(&self) -> String {
        format!(
            "ReapReport(dry_run={}, examined={}, deleted={}, failed={})",
            py_bool(self.dry_run),
            self.examined,
            self.deleted.len(),
            self.failed.len()
        )
    }
}

impl From<SweepReport> for ReapReport {
    fn from(report: SweepReport) -> Self {
        Self {
            dry_run: report.dry_run,
            examined: report.examined,
            deleted: report
                .deleted
                .into_iter()
                .map(|orphan| (orphan.name, orphan.id))
                .collect(),
            failed: report
                .failed
                .into_iter()
                .map(|(orphan, error)| (orphan.name, orphan.id, error))
                .collect(),
        }
    }
}
