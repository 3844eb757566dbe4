//! The deprecated plain-text diagnostics (`/v1/sandboxes/{id}/diagnostics/...`) and the one
//! fact a provider reads from them: the Kubernetes RuntimeClass.

use crate::client::Client;
use crate::error::Result;
use crate::transport::Call;

/// The most bytes of a diagnostics text read (4 MiB); a longer one is a
/// [`crate::Error::TooLarge`].
pub const MAX_DIAGNOSTICS_BYTES: usize = 4 * 1024 * 1024;

/// Which diagnostics text to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagnostics {
    /// `logs`: the container's last log lines.
    Logs,
    /// `inspect`: image, state, limits, labels (Kubernetes adds `Runtime Class:`).
    Inspect,
    /// `events`: runtime events.
    Events,
    /// `summary`: all three.
    Summary,
}

impl Diagnostics {
    fn segment(self) -> &'static str {
        match self {
            Diagnostics::Logs => "logs",
            Diagnostics::Inspect => "inspect",
            Diagnostics::Events => "events",
            Diagnostics::Summary => "summary",
        }
    }
}

/// What an `inspect` text says about the sandbox's RuntimeClass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeClass {
    /// No `Runtime Class:` line: a Docker server, or a pod without a RuntimeClass.
    NotReported,
    /// One RuntimeClass name (what the operator called it: not proof of a VM).
    Named(String),
    /// Several lines with different names: the text cannot be trusted.
    Conflicting(Vec<String>),
}

/// Reads the `Runtime Class:` line of an `inspect` text. Only a line that starts with it
/// counts (indented text, such as an environment dump, does not); several lines with the same
/// name count once.
///
/// ```
/// use opensandbox_api::{RuntimeClass, runtime_class};
/// let text = "Pod:            sb-1\nRuntime Class:  kata-fc\nNode: n1\n";
/// assert_eq!(runtime_class(text), RuntimeClass::Named("kata-fc".into()));
/// assert_eq!(runtime_class("Image: python:3.11\n"), RuntimeClass::NotReported);
/// ```
pub fn runtime_class(inspect: &str) -> RuntimeClass {
    let mut names: Vec<String> = Vec::new();
    for line in inspect.lines() {
        if let Some(rest) = line.strip_prefix("Runtime Class:") {
            let name = rest.trim().to_owned();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    match names.len() {
        0 => RuntimeClass::NotReported,
        1 => RuntimeClass::Named(names.remove(0)),
        _ => RuntimeClass::Conflicting(names),
    }
}

impl Client {
    /// `GET /v1/sandboxes/{id}/diagnostics/{kind}` (deprecated by the server, plain text),
    /// read to at most [`MAX_DIAGNOSTICS_BYTES`] and decoded as lossy UTF-8. The text comes
    /// from the runtime and may quote the sandbox's own output: do not show it unescaped.
    pub async fn diagnostics(&self, id: &str, kind: Diagnostics) -> Result<String> {
        let mut call = Call::get(&["sandboxes", id, "diagnostics", kind.segment()])?;
        call.headers.insert(
            reqwest::header::ACCEPT,
            reqwest::header::HeaderValue::from_static("text/plain"),
        );
        let answer = self.transport().send(&call, MAX_DIAGNOSTICS_BYTES).await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    /// The RuntimeClass the server reports for a sandbox (from [`Diagnostics::Inspect`]).
    pub async fn runtime_class(&self, id: &str) -> Result<RuntimeClass> {
        let text = self.diagnostics(id, Diagnostics::Inspect).await?;
        Ok(runtime_class(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unindented_lines_count_and_conflicts_are_reported() {
        let text =
            "Runtime Class:  kata-fc\nEnv:\n  X=Runtime Class: runc\nRuntime Class: kata-fc\n";
        assert_eq!(runtime_class(text), RuntimeClass::Named("kata-fc".into()));
        let text = "Runtime Class: kata-fc\r\nRuntime Class: runc\n";
        assert_eq!(
            runtime_class(text),
            RuntimeClass::Conflicting(vec!["kata-fc".into(), "runc".into()])
        );
    }
}
