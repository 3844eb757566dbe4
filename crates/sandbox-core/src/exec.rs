//! The two clocks of one execution, the guest command (a Python program or a shell script),
//! and the exit classification.

use std::time::Duration;

/// Exit code lfx reads as "timed out".
pub const EXIT_TIMED_OUT: i32 = -1;
/// GNU `timeout` exit status when the TERM signal ended the program.
pub const EXIT_TIMEOUT_TERM: i32 = 124;
/// 128 + SIGKILL: `timeout` had to KILL, or the kernel's OOM killer struck.
pub const EXIT_KILLED: i32 = 137;

/// The clocks of one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecLimits {
    /// The program's wall clock (lfx's timeout), enforced in the guest by `timeout(1)`.
    pub budget: Duration,
    /// After TERM, how long `timeout` waits before KILL.
    pub kill_after: Duration,
    /// How much longer than `budget + kill_after` the host waits for the control plane before
    /// it destroys the guest and reports a timeout with the output that arrived.
    pub host_grace: Duration,
}

impl ExecLimits {
    /// Limits for a budget in whole seconds, with a 5 s TERM→KILL grace and 15 s host grace.
    pub fn for_seconds(seconds: u32) -> Self {
        Self {
            budget: Duration::from_secs(u64::from(seconds)),
            kill_after: Duration::from_secs(5),
            host_grace: Duration::from_secs(15),
        }
    }

    /// How long the host waits for the exec stream in total.
    pub fn host_deadline(&self) -> Duration {
        self.budget + self.kill_after + self.host_grace
    }

    /// The idle auto-pause backstop: `max(60, budget + 120)` seconds. The control plane
    /// touches a guest's activity clock only when exec is accepted, so a shorter window could
    /// pause a quiet, healthy run.
    pub fn auto_pause_seconds(&self) -> u32 {
        let secs = self.budget.as_secs().saturating_add(120);
        u32::try_from(secs.max(60)).unwrap_or(86_400).min(86_400)
    }
}

fn secs_arg(d: Duration) -> String {
    // timeout(1) accepts fractional seconds; keep millisecond precision.
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    }
}

/// What to run in a guest. Both forms run under `timeout(1)` ([`Command::under_timeout`]) and
/// their exits are classified alike ([`classify_exit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A Python program file in the guest, run unbuffered (`python3 -u <path>`), so whatever
    /// a timed-out program printed still arrives.
    Python {
        /// Its path in the guest.
        path: String,
    },
    /// A shell script (`sh -c <script>`).
    Shell {
        /// The script.
        script: String,
    },
}

impl Command {
    /// The Python program at `path`.
    pub fn python(path: impl Into<String>) -> Self {
        Command::Python { path: path.into() }
    }

    /// A shell script.
    pub fn shell(script: impl Into<String>) -> Self {
        Command::Shell {
            script: script.into(),
        }
    }

    /// The exec request under the guest clock:
    /// `timeout --signal=TERM --kill-after=<grace> <budget> <command...>`.
    pub fn under_timeout(&self, limits: &ExecLimits) -> (String, Vec<String>) {
        let mut args = vec![
            "--signal=TERM".to_owned(),
            format!("--kill-after={}", secs_arg(limits.kill_after)),
            secs_arg(limits.budget),
        ];
        match self {
            Command::Python { path } => {
                args.extend(["python3".to_owned(), "-u".to_owned(), path.clone()]);
            }
            Command::Shell { script } => {
                args.extend(["sh".to_owned(), "-c".to_owned(), script.clone()]);
            }
        }
        ("timeout".to_owned(), args)
    }
}

/// The exec request for a Python program at `path`:
/// `timeout --signal=TERM --kill-after=<grace> <budget> python3 -u <path>`.
pub fn python_command(path: &str, limits: &ExecLimits) -> (String, Vec<String>) {
    Command::python(path).under_timeout(limits)
}

/// Whether `name` can be an environment variable of a guest: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_valid_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let starts_well = bytes
        .first()
        .is_some_and(|b| *b == b'_' || b.is_ascii_alphabetic());
    starts_well
        && bytes
            .iter()
            .all(|b| *b == b'_' || b.is_ascii_alphanumeric())
}

/// Classifies a guest exit. 124 (TERM fired) and 137 (KILL) count as a timeout only when the
/// run actually reached its budget; a 137 well inside the budget is an out-of-memory kill and
/// stays 137, and a program that itself exits 124 early keeps its code.
pub fn classify_exit(exit_code: i32, elapsed: Duration, budget: Duration) -> i32 {
    match exit_code {
        EXIT_TIMEOUT_TERM | EXIT_KILLED if elapsed >= budget => EXIT_TIMED_OUT,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_shape() {
        let (cmd, args) = python_command("/workspace/main_ab.py", &ExecLimits::for_seconds(30));
        assert_eq!(cmd, "timeout");
        assert_eq!(
            args,
            [
                "--signal=TERM",
                "--kill-after=5s",
                "30s",
                "python3",
                "-u",
                "/workspace/main_ab.py"
            ]
        );
        let l = ExecLimits {
            budget: Duration::from_millis(1500),
            kill_after: Duration::from_millis(250),
            host_grace: Duration::ZERO,
        };
        let (_, args) = python_command("/p", &l);
        assert_eq!(args[1], "--kill-after=0.250s");
        assert_eq!(args[2], "1.500s");
    }

    #[test]
    fn shell_form_runs_under_the_same_clock() {
        let (cmd, args) =
            Command::shell("echo hi; exit 3").under_timeout(&ExecLimits::for_seconds(7));
        assert_eq!(cmd, "timeout");
        assert_eq!(
            args,
            [
                "--signal=TERM",
                "--kill-after=5s",
                "7s",
                "sh",
                "-c",
                "echo hi; exit 3"
            ]
        );
    }

    #[test]
    fn env_names() {
        assert!(is_valid_env_name("FOO_1"));
        assert!(is_valid_env_name("_x"));
        assert!(!is_valid_env_name("1X"));
        assert!(!is_valid_env_name("A-B"));
        assert!(!is_valid_env_name("É"));
        assert!(!is_valid_env_name(""));
    }

    #[test]
    fn classification() {
        let b = Duration::from_secs(10);
        assert_eq!(classify_exit(124, Duration::from_secs(10), b), -1);
        assert_eq!(classify_exit(137, Duration::from_secs(16), b), -1);
        assert_eq!(classify_exit(137, Duration::from_secs(2), b), 137);
        assert_eq!(classify_exit(124, Duration::from_secs(1), b), 124);
        assert_eq!(classify_exit(0, Duration::from_secs(20), b), 0);
        assert_eq!(classify_exit(1, Duration::from_secs(1), b), 1);
    }

    #[test]
    fn auto_pause_backstop() {
        assert_eq!(ExecLimits::for_seconds(1).auto_pause_seconds(), 121);
        assert_eq!(ExecLimits::for_seconds(300).auto_pause_seconds(), 420);
        let tiny = ExecLimits {
            budget: Duration::ZERO,
            kill_after: Duration::ZERO,
            host_grace: Duration::ZERO,
        };
        assert_eq!(tiny.auto_pause_seconds(), 120);
        assert_eq!(ExecLimits::for_seconds(30).auto_pause_seconds(), 150);
        assert_eq!(ExecLimits::for_seconds(86_400).auto_pause_seconds(), 86_400);
    }
}
