//! The results of the checks: printed as they come, counted at the end.

use std::fmt::Write as _;
use std::io::Write as _;

use crate::facts::{FACTS, Fact, fact_of};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The service behaves as the fact says.
    Pass,
    /// It does not; the line names both values and the fake's file.
    Fail,
    /// Not checked, with a reason.
    Skip,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        }
    }
}

/// One recorded check.
#[derive(Debug)]
struct Row {
    id: &'static str,
    verdict: Verdict,
}

/// Totals of a finished run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Totals {
    /// Checks that passed.
    pub passed: usize,
    /// Checks that failed.
    pub failed: usize,
    /// Checks that were skipped (or not reached).
    pub skipped: usize,
}

/// Collects verdicts and prints each one as it is recorded.
#[derive(Debug, Default)]
pub(crate) struct Report {
    rows: Vec<Row>,
    /// Why the remaining checks cannot run (a prerequisite failed), if so.
    blocker: Option<String>,
}

impl Report {
    /// Records and prints a pass/fail verdict with the expected and measured values.
    pub(crate) fn check(&mut self, id: &str, pass: bool, expected: &str, measured: &str) {
        let fact = fact_of(id);
        let verdict = if pass { Verdict::Pass } else { Verdict::Fail };
        let mut out = format!(
            "{}  {}: {} [{}]\n      expected: {expected}\n      measured: {measured}\n",
            verdict.label(),
            fact.id,
            fact.text,
            fact.section
        );
        if !pass {
            let _ = writeln!(
                out,
                "      disagrees with the fake: {} encodes the expected value",
                fact.fake
            );
        }
        self.push(fact, verdict, &out);
    }

    /// Records and prints a skipped check with its reason.
    pub(crate) fn skip(&mut self, id: &str, reason: &str) {
        let fact = fact_of(id);
        let out = format!(
            "SKIP  {}: {} [{}]\n      reason: {reason}\n",
            fact.id, fact.text, fact.section
        );
        self.push(fact, Verdict::Skip, &out);
    }

    fn push(&mut self, fact: &'static Fact, verdict: Verdict, text: &str) {
        if self.rows.iter().any(|r| r.id == fact.id) {
            // A check is reported once; a second verdict for it is a suite bug.
            debug_assert!(false, "check {} recorded twice", fact.id);
            return;
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
        self.rows.push(Row {
            id: fact.id,
            verdict,
        });
    }

    /// Notes why the checks that follow cannot run; they are skipped with this reason.
    pub(crate) fn block(&mut self, reason: String) {
        if self.blocker.is_none() {
            self.blocker = Some(reason);
        }
    }

    /// Whether this check has been recorded.
    pub(crate) fn has(&self, id: &str) -> bool {
        self.rows.iter().any(|r| r.id == id)
    }

    /// Skips every check not recorded yet (with `why`, or the blocker) and returns the totals.
    pub(crate) fn finish(&mut self, why: Option<&str>) -> Totals {
        let reason = why
            .map(str::to_owned)
            .or_else(|| self.blocker.clone())
            .unwrap_or_else(|| "not reached".to_owned());
        for fact in FACTS {
            if !self.has(fact.id) {
                self.skip(fact.id, &format!("not reached: {reason}"));
            }
        }
        let mut t = Totals::default();
        for r in &self.rows {
            match r.verdict {
                Verdict::Pass => t.passed += 1,
                Verdict::Fail => t.failed += 1,
                Verdict::Skip => t.skipped += 1,
            }
        }
        t
    }
}
