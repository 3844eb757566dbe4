//! The exceptions the extension raises: the public classes of
//! `langflow_sandbox_createos.exceptions`, which extend lfx's sandbox errors.
//!
//! The classes are defined in Python (they subclass lfx's `SandboxExecutionError` and
//! `SandboxUnavailableError`, so lfx and Langflow catch them as their own) and looked up here
//! the first time one is raised, never at import: importing the extension stays free of lfx.
//! If that module cannot be imported (lfx missing or broken), the error is still raised, as a
//! `RuntimeError` with the same message whose `__cause__` is the import failure, so the
//! original message is never lost.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use sandbox_core::plan::SurfaceError;

/// The public module that defines the classes.
const EXCEPTIONS: &str = "langflow_sandbox_createos.exceptions";

/// Which public class an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `SandboxRefusedError` (0.2.0's `CreateOSUnavailableError`, the same class): configured
    /// but unusable, or the policy cannot be honoured; nothing ran (lfx's
    /// `SandboxUnavailableError`).
    Unavailable,
    /// `SandboxFailedError` (0.2.0's `CreateOSExecutionError`, the same class): the
    /// infrastructure failed, or the outcome is unknown (lfx's `SandboxExecutionError`, and
    /// not its `SandboxUnavailableError`).
    Execution,
}

impl Kind {
    /// The class's name in [`EXCEPTIONS`].
    pub fn class_name(self) -> &'static str {
        match self {
            Kind::Unavailable => "SandboxRefusedError",
            Kind::Execution => "SandboxFailedError",
        }
    }

    fn cell(self) -> &'static PyOnceLock<Py<PyType>> {
        static UNAVAILABLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        static EXECUTION: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        match self {
            Kind::Unavailable => &UNAVAILABLE,
            Kind::Execution => &EXECUTION,
        }
    }
}

/// Builds the exception of `kind` carrying `message`.
pub fn raise(py: Python<'_>, kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    match kind.cell().import(py, EXCEPTIONS, kind.class_name()) {
        Ok(class) => PyErr::from_type(class.clone(), (message,)),
        Err(import_failed) => {
            let err = PyRuntimeError::new_err(message);
            err.set_cause(py, Some(import_failed));
            err
        }
    }
}

/// A refusal: nothing ran.
pub fn unavailable(py: Python<'_>, message: impl Into<String>) -> PyErr {
    raise(py, Kind::Unavailable, message)
}

/// An infrastructure failure (or an internal one).
pub fn execution(py: Python<'_>, message: impl Into<String>) -> PyErr {
    raise(py, Kind::Execution, message)
}

/// A surface's error (sandbox-core's one mapping of a core error onto lfx's classes) as the
/// matching public exception; its message is already redacted.
pub fn from_surface(py: Python<'_>, err: impl Into<SurfaceError>) -> PyErr {
    match err.into() {
        SurfaceError::Unavailable(message) => unavailable(py, message),
        SurfaceError::Execution(message) => execution(py, message),
    }
}
