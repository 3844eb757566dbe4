//! Each run's own artifacts directory in the guest, so Return Files hands back only what the
//! current run wrote, never an earlier or a concurrent run's files (a kept guest keeps
//! `/workspace` between runs).
//!
//! With Return Files on, a run gets `RUNS_DIR/<run id>/artifacts`, empty, named by
//! `$ARTIFACTS_DIR`, and its id's `pid` file (the shell that runs the program). While no other
//! run is live in the guest, `/workspace/artifacts` is a symbolic link to that directory, so a
//! program that writes there (as with 0.2.0) writes into its own. When a second run starts
//! while one is live, the link is pointed at [`crate::SHARED_DIR`], which is never returned,
//! and both runs are marked: what goes through the shared path while they overlap belongs to
//! neither, and each run's result says so in a note. After the run, only its own directory is
//! archived (and `/workspace/artifacts` too when a run alone in the guest replaced the link with
//! a directory, which only it can have made); the directory and the link (if still its own)
//! are removed.
//!
//! Nothing here is a boundary against the code in the guest: a run's program can read or
//! write anything in its guest. It stops the component from handing a run another run's
//! files by accident. Whatever stood at `/workspace/artifacts` that is not such a link (a
//! directory an earlier version or a Return-Files-off run made) is renamed to
//! `/workspace/artifacts.old-<run id>` and never returned.

use crate::{ARTIFACTS_DIR, ARTIFACTS_ENV, RUNS_DIR, SHARED_DIR};

/// What the archiving prints when the run shared the guest with another.
pub(crate) const SHARED_MARK: &str = "lf-shared-run";
/// The archiving's exit status when the run's directory is gone.
pub(crate) const EXIT_GONE: i32 = 3;

/// The shell variables both scripts use (the guest paths are assigned, so the fake control
/// plane's path mapping sees them after `=`).
fn vars(run_id: &str) -> String {
    format!("lf_r={RUNS_DIR}; lf_d={RUNS_DIR}/{run_id}; lf_a={ARTIFACTS_DIR}; lf_s={SHARED_DIR}\n")
}

/// Lists the other live runs' directories (their program's shell still exists). A pid file is
/// the guest's own text: it only ever reaches `kill -0`.
const LIVE: &str = "lf_live() {\n\
    for lf_p in \"$lf_r\"/*/pid; do\n\
    [ -f \"$lf_p\" ] && [ \"$lf_p\" != \"$lf_d/pid\" ] || continue\n\
    kill -0 \"$(head -c 20 \"$lf_p\")\" 2>/dev/null && echo \"${lf_p%/pid}\"\n\
    done\n\
    }\n";

/// The shell lines, run before the program in the same shell (so `$$` is the run's own and
/// dies with it), that make the run's directory, export its name and point
/// `/workspace/artifacts` at it, or at the shared directory when another run is live. Exit
/// status 125 when the directory cannot be made.
pub(crate) fn prepare(run_id: &str) -> String {
    let own = format!(".lf-runs/{run_id}/artifacts");
    let shared = SHARED_DIR.rsplit('/').next().unwrap_or_default();
    format!(
        "{vars}\
         mkdir -p \"$lf_d/artifacts\" && echo $$ > \"$lf_d/pid\" || exit 125\n\
         export {ARTIFACTS_ENV}=\"$lf_d/artifacts\"\n\
         {LIVE}\
         for lf_p in \"$lf_r\"/*/pid; do\n\
         [ -f \"$lf_p\" ] && [ \"$lf_p\" != \"$lf_d/pid\" ] || continue\n\
         if [ -n \"$(find \"$lf_p\" -mmin +120 2>/dev/null)\" ] || {{ ! kill -0 \"$(head -c 20 \
         \"$lf_p\")\" 2>/dev/null && [ -n \"$(find \"$lf_p\" -mmin +10 2>/dev/null)\" ]; }}; \
         then rm -rf \"${{lf_p%/pid}}\"; fi\n\
         done\n\
         if [ -e \"$lf_a\" ] && [ ! -L \"$lf_a\" ]; then mv \"$lf_a\" \"$lf_a.old-{run_id}\" \
         2>/dev/null; fi\n\
         if [ -e \"$lf_a\" ] && [ ! -L \"$lf_a\" ]; then echo \"cannot move {ARTIFACTS_DIR} \
         aside\" >&2; exit 125; fi\n\
         lf_point() {{ ln -sfn \"$1\" \"$lf_d/link\" && mv -fT \"$lf_d/link\" \"$lf_a\" \
         2>/dev/null || ln -sfn \"$1\" \"$lf_a\"; }}\n\
         lf_share() {{ mkdir -p \"$lf_s\"; lf_live | while read -r lf_o; do : > \"$lf_o/shared\" \
         2>/dev/null; done; : > \"$lf_d/shared\"; lf_point {shared}; }}\n\
         if [ -n \"$(lf_live)\" ]; then lf_share; else rm -rf \"$lf_s\"; lf_point {own}; \
         [ -z \"$(lf_live)\" ] || lf_share; fi\n\
         unset -f lf_live lf_point lf_share; unset lf_r lf_d lf_a lf_s lf_p lf_o\n",
        vars = vars(run_id),
    )
}

/// The archiving command: archives the run's own directory to `archive` (with
/// `/workspace/artifacts` when the run, alone in the guest, replaced the link with a directory
/// of its own, as a 0.2.0 program that empties it with `rm -rf` does; that directory is then
/// removed like the run's own), prints
/// [`SHARED_MARK`] when the run shared the guest, removes the directory and the link when it
/// is still the run's, and the shared directory when the last run sharing it is gone. Exit
/// status [`EXIT_GONE`] when the directory is gone, 4 when `tar` failed.
pub(crate) fn archive(run_id: &str, archive: &str) -> String {
    let own = format!(".lf-runs/{run_id}/artifacts");
    let shared = SHARED_DIR.rsplit('/').next().unwrap_or_default();
    format!(
        "{vars}\
         {LIVE}\
         find /tmp -maxdepth 1 -name 'lf-artifacts-*.tgz' -mmin +5 -exec rm -f {{}} + \
         2>/dev/null\n\
         lf_x=; [ -d \"$lf_a\" ] && [ ! -L \"$lf_a\" ] && [ ! -f \"$lf_d/shared\" ] && lf_x=1\n\
         if [ -d \"$lf_d/artifacts\" ] && [ -n \"$lf_x\" ]; then tar -czf {archive} -C \
         \"$lf_d/artifacts\" . -C \"$lf_a\" .; lf_t=$?\n\
         elif [ -d \"$lf_d/artifacts\" ]; then tar -C \"$lf_d/artifacts\" -czf {archive} .; lf_t=$?\n\
         elif [ -n \"$lf_x\" ]; then tar -C \"$lf_a\" -czf {archive} .; lf_t=$?\n\
         else lf_t={EXIT_GONE}; fi\n\
         [ \"$lf_t\" = 0 ] && [ -n \"$lf_x\" ] && rm -rf \"$lf_a\"\n\
         [ -f \"$lf_d/shared\" ] && echo {SHARED_MARK}\n\
         [ \"$(readlink \"$lf_a\")\" = {own} ] && rm -f \"$lf_a\"\n\
         rm -rf \"$lf_d\"\n\
         if [ \"$(readlink \"$lf_a\")\" = {shared} ] && [ -z \"$(lf_live)\" ]; then rm -f \
         \"$lf_a\"; rm -rf \"$lf_s\"; fi\n\
         case $lf_t in 0) exit 0 ;; {EXIT_GONE}) exit {EXIT_GONE} ;; *) exit 4 ;; esac\n",
        vars = vars(run_id),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both scripts are valid POSIX shell (checked by `sh -n`, where a shell exists).
    #[test]
    fn scripts_parse() {
        for script in [
            prepare("0123456789ab"),
            archive("0123456789ab", "/tmp/x.tgz"),
        ] {
            let Ok(out) = std::process::Command::new("sh")
                .args(["-n", "-c", &script])
                .output()
            else {
                return; // no shell on this host: the fake's tests run them for real
            };
            assert!(
                out.status.success(),
                "{}\n{script}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
