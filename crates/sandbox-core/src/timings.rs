//! Where one run's time went, phase by phase, for every surface: one type ([`Timings`]), each
//! surface filling the phases it has (`None` for a phase a run did not reach or a surface does
//! not have), on the host's clock except the phases the guest reports of itself, which the
//! surface that reads them bounds first (the guest is not trusted).
//!
//! The phases, in run order:
//!
//! - `plan_ms`: the settings and the checks that need no I/O (the executor);
//! - `files_ms`: reading the files the run sends (the executor), or archiving, downloading and
//!   reading the files it returns (the component);
//! - `open_ms`: the credential check and the shape catalog (0 once the process has them);
//! - `acquire_ms`: getting the guest: admission and create, taking a warm pool guest, or finding
//!   (and resuming) a kept one;
//! - `dispatch_ms`: from the guest to its program's exec accepted (the executor's runner);
//! - `host_context_ms`: what the glue resolved for the run (the executor: the graph's dump,
//!   variables, history, files), as it reported it;
//! - `upload_ms`: uploading the program (with the egress read-back of a fresh guest);
//! - `job_ms`: from the guest to the executor's job written;
//! - `runner_ready_ms`: from the executor's runner exec to its hello;
//! - `guest_preload_ms`, `guest_wait_ms`, `rebuild_ms`: the executor's guest's own figures (its
//!   import of lfx, its wait for the job, the flow's rebuild);
//! - `exec_ms`: the program's exec, dispatch to exit;
//! - `first_event_ms`: from the run's start to its first event (the executor);
//! - `destroy_ms`: destroying the guest before returning (`None` when handed to the reaper or
//!   released alive);
//! - `total_ms`: the whole run;
//! - `requests`: the control-plane requests the run made (every attempt counts).

use std::time::Duration;

use tokio::time::Instant;

/// Per-phase timings of one run, in milliseconds (see the module docs for each phase).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// The settings and the checks that need no I/O.
    pub plan_ms: Option<u64>,
    /// Reading the files the run sends, or returning the files it wrote.
    pub files_ms: Option<u64>,
    /// The credential check and the shape catalog.
    pub open_ms: Option<u64>,
    /// Getting the guest (admission and create, a pool guest, or a kept one found).
    pub acquire_ms: Option<u64>,
    /// From the guest to its program's exec accepted.
    pub dispatch_ms: Option<u64>,
    /// What the glue spent resolving the run's context, as it reported it.
    pub host_context_ms: Option<u64>,
    /// Uploading the program (with the egress read-back of a fresh guest).
    pub upload_ms: Option<u64>,
    /// From the guest to the job written.
    pub job_ms: Option<u64>,
    /// From the runner's exec to its hello.
    pub runner_ready_ms: Option<u64>,
    /// The guest runner's import of lfx and its graph machinery (guest clock).
    pub guest_preload_ms: Option<u64>,
    /// How long the guest runner waited for the job after its preload (guest clock).
    pub guest_wait_ms: Option<u64>,
    /// The flow's rebuild in the guest (guest clock).
    pub rebuild_ms: Option<u64>,
    /// The program's exec, dispatch to exit.
    pub exec_ms: Option<u64>,
    /// From the run's start to its first event.
    pub first_event_ms: Option<u64>,
    /// Destroying the guest before returning.
    pub destroy_ms: Option<u64>,
    /// The whole run.
    pub total_ms: Option<u64>,
    /// Control-plane requests the run made.
    pub requests: Option<u64>,
}

impl Timings {
    /// Every phase as `(name, value)`, in run order.
    pub fn fields(&self) -> [(&'static str, Option<u64>); 17] {
        [
            ("plan_ms", self.plan_ms),
            ("files_ms", self.files_ms),
            ("open_ms", self.open_ms),
            ("acquire_ms", self.acquire_ms),
            ("dispatch_ms", self.dispatch_ms),
            ("host_context_ms", self.host_context_ms),
            ("upload_ms", self.upload_ms),
            ("job_ms", self.job_ms),
            ("runner_ready_ms", self.runner_ready_ms),
            ("guest_preload_ms", self.guest_preload_ms),
            ("guest_wait_ms", self.guest_wait_ms),
            ("rebuild_ms", self.rebuild_ms),
            ("exec_ms", self.exec_ms),
            ("first_event_ms", self.first_event_ms),
            ("destroy_ms", self.destroy_ms),
            ("total_ms", self.total_ms),
            ("requests", self.requests),
        ]
    }

    /// The phases that were measured, as `name=value` words for a log line.
    pub fn summary(&self) -> String {
        self.fields()
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// How a run's guest ended, for [`run_line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEnd {
    /// Destroyed before the run returned, in this many milliseconds.
    Destroyed(u64),
    /// Handed to the reaper, which destroys it off the run's critical path.
    Background,
    /// Kept for the next run (the component's Guest Reuse).
    Kept,
    /// The destroy failed; the reaper keeps trying.
    Failed,
}

/// The one INFO line every surface logs per run: which surface ran it (`backend`, `component`
/// or `executor`), in which guest (name and id), and where the time went (`create_ms`: getting
/// the guest; `run_ms`: the program or flow; `destroy_ms`). Guest names and ids come from the
/// control plane, so the line is escaped ([`outside_text::line`]) and cannot forge another.
pub fn run_line(
    surface: &str,
    guest: &str,
    guest_id: &str,
    create_ms: Option<u64>,
    run_ms: Option<u64>,
    end: GuestEnd,
) -> String {
    let shown = |v: Option<u64>| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
    let destroy = match end {
        GuestEnd::Destroyed(ms) => ms.to_string(),
        GuestEnd::Background => "background".to_owned(),
        GuestEnd::Kept => "kept".to_owned(),
        GuestEnd::Failed => "failed".to_owned(),
    };
    outside_text::line(&format!(
        "createos {surface} run in guest {guest} (id {guest_id}): create_ms={} run_ms={} \
         destroy_ms={destroy}",
        shown(create_ms),
        shown(run_ms)
    ))
    .into_owned()
}

/// Milliseconds of `d`, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds from `since` to now.
pub fn since(since: Instant) -> u64 {
    ms(since.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_line_names_the_surface_and_guest_and_cannot_be_forged() {
        let line = run_line(
            "component",
            "lf-c-1",
            "sb_9",
            Some(120),
            None,
            GuestEnd::Kept,
        );
        assert_eq!(
            line,
            "createos component run in guest lf-c-1 (id sb_9): create_ms=120 run_ms=unknown \
             destroy_ms=kept"
        );
        let forged = run_line(
            "backend",
            "x\nINFO fake",
            "i",
            Some(1),
            Some(2),
            GuestEnd::Background,
        );
        assert!(!forged.contains('\n'), "{forged}");
        assert!(forged.ends_with("destroy_ms=background"), "{forged}");
    }

    #[test]
    fn the_summary_shows_what_was_measured_in_run_order() {
        let t = Timings {
            plan_ms: Some(1),
            acquire_ms: Some(40),
            total_ms: Some(900),
            requests: Some(3),
            ..Timings::default()
        };
        assert_eq!(
            t.summary(),
            "plan_ms=1 acquire_ms=40 total_ms=900 requests=3"
        );
        assert_eq!(t.fields().iter().filter(|(_, v)| v.is_some()).count(), 4);
    }
}
