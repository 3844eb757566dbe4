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

    /// How long a guest may sit without use before the control plane stops paying for it:
    /// `budget + 120` seconds. The control plane touches a guest's activity clock only when
    /// exec is accepted, so a shorter window could pause a quiet, healthy run.
    pub fn idle_backstop(&self) -> Duration {
        self.budget.saturating_add(Duration::from_secs(120))
    }

    /// [`ExecLimits::idle_backstop`] as CreateOS's auto-pause, in seconds:
    /// `max(60, budget + 120)`, at most 86400 (see
    /// [`crate::provider::createos::auto_pause_secs`]).
    pub fn auto_pause_seconds(&self) -> u32 {
        crate::provider::createos::auto_pause_secs(self.idle_backstop())
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
/// their exits are classified alike ([`classify_exit`]). `Debug` shows a script's or a
/// program's size, never its text (it may carry secrets).
#[derive(Clone, PartialEq, Eq)]
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
    /// A Python program carried inside the exec request itself, so no upload precedes it:
    /// `sh` writes `source` to `path` and then `exec`s `python3 -u <path>`, so the program
    /// runs from a file exactly as an uploaded one does (same `__file__`, same tracebacks,
    /// same signals: `exec` replaces the shell). Build it with [`Command::python_inline`],
    /// which refuses what an argument cannot carry.
    PythonInline {
        /// Where the program is written in the guest.
        path: String,
        /// The program text.
        source: String,
    },
}

/// The largest program [`Command::python_inline`] carries in the exec request (Linux caps one
/// argument at 128 KiB; this stays well inside it, and inside any request-size limit).
pub const INLINE_PROGRAM_MAX: usize = 32 * 1024;

/// The script of [`Command::PythonInline`]: `$0` is the path, `$1` the program. `printf` is a
/// shell builtin, so the program is never re-parsed by the shell nor passed to another exec.
const INLINE_SCRIPT: &str = r#"printf '%s' "$1" > "$0" && exec python3 -u "$0""#;

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Python { path } => f.debug_struct("Python").field("path", path).finish(),
            Command::Shell { script } => f
                .debug_struct("Shell")
                .field("script_bytes", &script.len())
                .finish(),
            Command::PythonInline { path, source } => f
                .debug_struct("PythonInline")
                .field("path", path)
                .field("source_bytes", &source.len())
                .finish(),
        }
    }
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

    /// The Python program `source`, carried in the exec request and run from `path`; `None`
    /// when it cannot travel as an argument (over [`INLINE_PROGRAM_MAX`] bytes, not UTF-8, or
    /// containing NUL), in which case it must be uploaded.
    pub fn python_inline(path: impl Into<String>, source: &[u8]) -> Option<Self> {
        if source.len() > INLINE_PROGRAM_MAX || source.contains(&0) {
            return None;
        }
        let source = std::str::from_utf8(source).ok()?.to_owned();
        Some(Command::PythonInline {
            path: path.into(),
            source,
        })
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
            Command::PythonInline { path, source } => {
                args.extend([
                    "sh".to_owned(),
                    "-c".to_owned(),
                    INLINE_SCRIPT.to_owned(),
                    path.clone(),
                    source.clone(),
                ]);
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
    fn an_inline_program_reaches_python_byte_for_byte() {
        // Quotes, expansions, a format directive, backslashes, non-ASCII and no final
        // newline: the shell must write it as it is, never interpret it.
        let source = "s = '$(echo no) `no` $HOME %s %d \\\\n \"q\" \u{e9}\u{2603}'\nprint(s)\nprint(__file__)";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("main_inline.py");
        let path = path.to_str().unwrap();
        let command = Command::python_inline(path, source.as_bytes()).unwrap();
        let (cmd, args) = command.under_timeout(&ExecLimits::for_seconds(20));
        let out = std::process::Command::new(cmd)
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(std::fs::read_to_string(path).unwrap(), source);
        let printed = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            printed,
            format!("$(echo no) `no` $HOME %s %d \\n \"q\" \u{e9}\u{2603}\n{path}\n")
        );
    }

    #[test]
    fn what_an_argument_cannot_carry_is_uploaded_instead() {
        assert!(Command::python_inline("/w/a.py", b"print(1)").is_some());
        assert!(Command::python_inline("/w/a.py", b"print(1)\0").is_none());
        assert!(Command::python_inline("/w/a.py", b"print('\xff')").is_none());
        let big = vec![b'#'; INLINE_PROGRAM_MAX + 1];
        assert!(Command::python_inline("/w/a.py", &big).is_none());
        assert!(Command::python_inline("/w/a.py", &big[1..]).is_some());
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
