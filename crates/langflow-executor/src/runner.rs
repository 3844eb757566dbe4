//! The guest runner: a Python script kept in the repository as `runner/lfx_runner.py` and
//! embedded here, so the host and the runner it uploads are always the same version.

/// The runner's source, uploaded to every guest.
pub const SOURCE: &str = include_str!("../runner/lfx_runner.py");

/// The frame protocol the host and the runner speak (the runner refuses another).
pub const PROTOCOL: u32 = 2;

/// Where the runner is written in the guest.
pub const RUNNER_PATH: &str = "/workspace/lfx_runner.py";
/// Where the job document is written in the guest.
pub const JOB_PATH: &str = "/workspace/lfx_job.json";

/// The runner's exit status when lfx cannot be imported in the guest.
pub const EXIT_MISSING_LFX: i64 = 3;

/// The hand-off script of a warm guest (kept as `runner/lfx_handoff.py`): it passes its exec's
/// standard output and error to the preloaded runner and exits with the runner's status.
pub const HANDOFF_SOURCE: &str = include_str!("../runner/lfx_handoff.py");
/// Where the hand-off script is written in a warm guest.
pub const HANDOFF_PATH: &str = "/workspace/lfx_handoff.py";
/// The hand-off's status when no preloaded runner listens: nothing was handed over.
pub const EXIT_NO_RUNNER: i64 = 86;
/// The hand-off's status when the preloaded runner ended without reporting one.
pub const EXIT_RUNNER_LOST: i64 = 87;

/// The abstract Unix socket the preloaded runner of the guest `guest_name` listens on (guest
/// names are unique, so two guests never share one, even on a control plane that runs guests
/// as processes of one host).
pub fn socket_name(guest_name: &str) -> String {
    format!("lfsc-runner-{guest_name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_runner_speaks_this_protocol() {
        assert!(SOURCE.contains(&format!("PROTOCOL = {PROTOCOL}\n")));
        assert!(SOURCE.contains("Graph.from_payload"));
    }

    #[test]
    fn the_runner_cuts_vertex_results_and_chunks_frames_well_inside_the_host_bounds() {
        use crate::frames::{MAX_FRAME_BYTES, MAX_FRAME_VALUES, TAGGED_VALUE_WEIGHT};
        let constant = |name: &str| -> u64 {
            let line = SOURCE
                .lines()
                .find(|l| l.starts_with(&format!("{name} = ")))
                .unwrap_or_else(|| panic!("{name} missing from the runner"));
            let expr = line.split_once(" = ").unwrap().1.replace('_', "");
            expr.split('*')
                .map(|f| f.trim().parse::<u64>().unwrap())
                .product()
        };
        assert_eq!(constant("TAGGED_VALUE_WEIGHT"), TAGGED_VALUE_WEIGHT);
        // A vertex frame carries its cut result plus a few fields of its own.
        assert!(constant("MAX_VERTEX_RESULT_VALUES") + 1000 < MAX_FRAME_VALUES);
        // A piece's line: its data escaped (at most twice as long: the text is ASCII JSON,
        // whose `"` and `\` gain a backslash) and a short envelope.
        assert!(constant("CHUNK_BYTES") * 2 + 1024 <= MAX_FRAME_BYTES as u64);
        assert!(
            constant("CHUNK_BYTES") >= 64 * 1024,
            "pieces large enough to be few"
        );
    }

    #[test]
    fn the_handoff_script_reports_the_statuses_the_host_reads() {
        assert!(HANDOFF_SOURCE.contains(&format!("EXIT_NO_RUNNER = {EXIT_NO_RUNNER} ")));
        assert!(HANDOFF_SOURCE.contains(&format!("EXIT_RUNNER_LOST = {EXIT_RUNNER_LOST} ")));
        assert!(SOURCE.contains("\"--serve\""));
    }
}
