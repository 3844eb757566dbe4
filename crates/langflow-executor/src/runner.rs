//! The guest runner: a Python script kept in the repository as `runner/lfx_runner.py` and
//! embedded here, so the host and the runner it uploads are always the same version.

/// The runner's source, uploaded to every guest.
pub const SOURCE: &str = include_str!("../runner/lfx_runner.py");

/// The frame protocol the host and the runner speak (the runner refuses another).
pub const PROTOCOL: u32 = 1;

/// Where the runner is written in the guest.
pub const RUNNER_PATH: &str = "/workspace/lfx_runner.py";
/// Where the job document is written in the guest.
pub const JOB_PATH: &str = "/workspace/lfx_job.json";

/// The runner's exit status when lfx cannot be imported in the guest.
pub const EXIT_MISSING_LFX: i64 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_runner_speaks_this_protocol() {
        assert!(SOURCE.contains(&format!("PROTOCOL = {PROTOCOL}\n")));
        assert!(SOURCE.contains("Graph.from_payload"));
    }
}
