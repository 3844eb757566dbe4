//! One execution of the node, after its plan: the guest it uses (a fresh one, or the kept one
//! named by `SandboxComponent::reused_name`), the program's upload and exec in it, the files it
//! returns, and the guest's end (a fresh guest destroyed, a kept one released unless its
//! program's end was not observed).

use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use sandbox_core::admission::Caps;
use sandbox_core::classify::{self, Stage};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::gateway::{Domains, Grant};
use sandbox_core::guest::{ExecInput, ExecOutcome, Guest, GuestSpec};
use sandbox_core::names::{REUSED_PREFIX, derived_name};
use sandbox_core::surface::{Acquire, End, StartError, Want};
use sandbox_core::timings::{GuestEnd, run_line};
use sandbox_core::{ErrorKind, LOG_TARGET, SandboxError};
use tokio::time::Instant;

use crate::plan::{Plan, Program, choose_shape};
use crate::{
    ARTIFACTS_DIR, ARTIFACTS_ENV, ComponentError, ComponentInputs, ComponentOutput, ReturnedFile,
    Reuse, SandboxComponent, Timings, artifacts, identity, input, read_archive,
};
use sandbox_core::provider::ProviderKind;

/// The in-guest budget of the archiving command.
const ARCHIVE_BUDGET_SECONDS: u32 = 30;

impl SandboxComponent {
    /// The kept guest's name. It depends on the flow, the node, the image, the shape and the
    /// network policy (Allowed Domains included), and under [`Reuse::Session`] on the session id
    /// too, so a change of any of them addresses a different guest (and a restarted worker finds
    /// the same one). Every part is hashed: the name is the prefix and a digest, whatever the
    /// text of the ids. Guest Reuse: flow without domains keeps the names of earlier versions, so
    /// their kept guests are found again.
    pub fn reused_name(
        inputs: &ComponentInputs,
        rootfs: &str,
        shape: &str,
        egress: &EgressPolicy,
    ) -> String {
        let mut policy = egress.fingerprint();
        // Domains narrow a network that is on; unchanged identity otherwise.
        let domains = Domains::parse_list(input::ALLOWED_DOMAINS, &inputs.allowed_domains)
            .map(|d| d.fingerprint())
            .unwrap_or_default();
        if inputs.allow_network && !domains.is_empty() {
            policy = format!("{policy}|{domains}");
        }
        let flow = [
            inputs.flow_id.as_str(),
            inputs.component_id.as_str(),
            rootfs,
            shape,
        ];
        let parts: Vec<&str> = match inputs.reuse {
            Reuse::Session => flow
                .into_iter()
                .chain(["session", inputs.session_id.as_str()])
                .collect(),
            Reuse::Off | Reuse::Flow => flow.to_vec(),
        };
        derived_name(REUSED_PREFIX, &parts, &policy)
    }

    /// Runs one execution of the node.
    ///
    /// Every refusal happens before a guest exists. A fresh guest is destroyed before this
    /// returns on every path (and, if the future is dropped, by the reaper); a kept guest is
    /// released alive, except when its program's end was not observed (a host timeout, with
    /// or without output, or an exec whose outcome is unknown), when it is destroyed because
    /// that is what stops runaway code, and the error or result says so.
    pub async fn run(&self, inputs: &ComponentInputs) -> Result<ComponentOutput, ComponentError> {
        let t0 = Instant::now();
        let plan = self.plan(inputs)?;
        let inputs = &*identity::resolve(inputs).await?;
        let opened = self.surface.open(&plan.settings).await?;
        let redactor = opened.redactor.clone();
        let shape = choose_shape(&opened.catalog, plan.pinned_shape.as_ref())?;
        let spec = GuestSpec {
            shape: shape.id.clone(),
            // On OpenSandbox the server's image (`OPEN_SANDBOX_IMAGE`), chosen by the provider.
            rootfs: if self.opts.provider == ProviderKind::OpenSandbox {
                String::new()
            } else {
                plan.settings.rootfs.clone()
            },
            envs: plan
                .grant
                .as_ref()
                .map(Grant::declared_env)
                .unwrap_or_default(),
            egress: plan.egress.clone(),
            auto_pause_after_seconds: plan.limits.auto_pause_seconds(),
        };
        let cx = self.surface.context(&opened);
        let name = match inputs.reuse {
            Reuse::Off => None,
            Reuse::Flow | Reuse::Session => Some(Self::reused_name(
                inputs,
                &spec.rootfs,
                &spec.shape,
                &plan.egress,
            )),
        };
        let req = Acquire {
            cx: &cx,
            spec: &spec,
            want: name.as_deref().map_or(Want::OneShot, Want::Kept),
            pool_size: plan.settings.warm_pool,
            caps: Caps::of(&plan.settings),
            flow: Some(&inputs.flow_id),
            run_budget: plan.limits.budget,
            node: Some(&inputs.component_id),
            session: Some(&inputs.session_id),
        };
        // Refused before the program was dispatched (paused behind the pool's back, a refused
        // upload or exec): nothing ran on a pooled guest, so the kit gives the run a fresh one.
        let started = self
            .surface
            .acquire(&req, |guest, begin| {
                let plan = &plan;
                async move {
                    let ran = self.in_guest(&guest, plan, inputs, begin.deadline).await;
                    (guest, ran.map_err(StartError::classify))
                }
            })
            .await?;
        let (mut lease, ran) = (started.lease, started.result);
        match &ran {
            Ok(r) => lease.set_outcome(r.outcome.run_outcome(), r.outcome.bytes_returned()),
            Err(e) => lease.set_outcome(sandbox_core::observe::outcome_of(e), 0),
        }
        let acquire_ms = ms(lease.acquired_at().saturating_duration_since(t0));
        let pool_use = lease.pool_use().as_str();
        // A kept guest this run did not create was found by name: reused.
        let reused_guest = lease.guest().is_kept() && !lease.guest().was_created();

        // A kept guest is released alive unless the end of its program was not observed: a
        // host timeout (with or without output), or an exec whose outcome is unknown (no answer,
        // a broken stream, no exit status). Whatever still runs there is stopped only by
        // destroying the guest; a shutdown's own "may have run" leaves it for the next process.
        let unobserved = match &ran {
            Ok(r) => r.outcome.host_timed_out,
            Err(e) => e.kind() == ErrorKind::OutcomeUnknown && !self.surface.reaper().is_closed(),
        };
        let was_kept = lease.guest().is_kept();
        let kept = was_kept && !unobserved;
        let t_end = Instant::now();
        let ended = lease
            .end(if kept { End::Release } else { End::Destroy })
            .await;
        let (sandbox_id, sandbox_name) = (ended.id, ended.name);
        let destroyed = ended.destroy_error.map_or(Ok(()), Err);
        let destroy_ms = if kept { 0 } else { ms(t_end.elapsed()) };
        let ran = ran.map_err(|e| {
            if !was_kept || kept {
                return e;
            }
            let fate = match &destroyed {
                Ok(()) => format!(
                    "Guest Reuse: the kept guest {sandbox_name} was destroyed, since that stops \
                     whatever the program left running; the next run creates it again"
                ),
                Err(d) => format!(
                    "Guest Reuse: destroying the kept guest {sandbox_name} failed ({}), so it \
                     may still be running until its auto-pause backstop pauses it; delete it \
                     with reap",
                    redactor.cap(&d.message)
                ),
            };
            // sandbox-core's wording of a silent exec speaks for a one-shot guest; this
            // sentence is the kept guest's own account.
            let said = e.message();
            let said = said
                .strip_suffix(". The guest was destroyed")
                .unwrap_or(said);
            SandboxError::new(e.kind(), format!("{said}. {fate}"))
        })?;
        let out = ran.outcome;
        let stdout = out.stdout.text.to_string();
        let stderr = out.stderr.text.to_string();
        let timed_out = out.exit_code == sandbox_core::exec::EXIT_TIMED_OUT;
        let error = if timed_out {
            Some(format!(
                "timed out after {}s (see {})",
                inputs.timeout_seconds,
                input::TIMEOUT
            ))
        } else if out.exit_code != 0 {
            Some(if stderr.trim().is_empty() {
                format!("exited with code {}", out.exit_code)
            } else {
                stderr.trim().to_owned()
            })
        } else {
            None
        };
        let timings = Timings {
            acquire_ms: Some(acquire_ms),
            upload_ms: Some(ran.upload_ms),
            exec_ms: Some(out.exec_ms),
            files_ms: Some(ran.files_ms),
            destroy_ms: Some(destroy_ms),
            total_ms: Some(ms(t0.elapsed())),
            requests: Some(u64::from(cx.requests())),
            ..Timings::default()
        };
        tracing::info!(
            target: LOG_TARGET,
            guest = %sandbox_name,
            reuse = inputs.reuse.as_str(),
            reused_guest,
            kept,
            exit_code = out.exit_code,
            files = ran.files.len(),
            timings = %timings.summary(),
            pool = pool_use,
            "sandbox component run finished"
        );
        let end = if kept {
            GuestEnd::Kept
        } else if destroyed.is_err() {
            GuestEnd::Failed
        } else {
            GuestEnd::Destroyed(destroy_ms)
        };
        tracing::info!(
            target: LOG_TARGET,
            "{}",
            run_line(
                "component",
                &sandbox_name,
                &sandbox_id,
                Some(acquire_ms),
                Some(out.exec_ms),
                end
            )
        );
        Ok(ComponentOutput {
            result: stdout.trim().to_owned(),
            stderr: stderr.trim().to_owned(),
            exit_code: out.exit_code,
            timed_out,
            error,
            stdout_truncated: out.stdout.truncated,
            stderr_truncated: out.stderr.truncated,
            sandbox_id,
            sandbox_name,
            reused_guest,
            kept,
            files: ran.files,
            notes: ran.notes,
            timings,
            outcome: out.run_outcome(),
        })
    }

    /// Upload (with the read-back of a fresh guest), exec, capture, and the files. The caller
    /// owns the guest's end.
    async fn in_guest(
        &self,
        guest: &Guest,
        plan: &Plan,
        inputs: &ComponentInputs,
        deadline: Instant,
    ) -> Result<Ran, SandboxError> {
        if guest.context().reaper.is_closed() {
            return Err(classify::shut_down(
                guest.context().provider.kind(),
                Stage::BeforeDispatch,
            ));
        }
        let t1 = Instant::now();
        let run_id = format!("{:012x}", random48());
        let prepare = if inputs.return_files {
            artifacts::prepare(&run_id)
        } else {
            String::new()
        };
        // The egress is read back before anything of the run reaches the guest (acquire
        // already did it for a kept guest); a guest whose egress differs gets nothing. On a
        // provider whose create answer shows the egress (CreateOS) this asks nothing.
        if !guest.is_kept() {
            guest.verify_egress(&plan.egress, deadline).await?;
        }
        let script = match &plan.program {
            Program::Shell(script) => format!("{prepare}{script}"),
            Program::Python(code) => {
                let path = format!("/tmp/lf-main-{:012x}.py", random48());
                guest
                    .upload(&path, Bytes::copy_from_slice(code.as_bytes()), deadline)
                    .await?;
                // The program file is removed afterwards, so a kept guest does not collect
                // them; the exit status is the program's.
                format!("{prepare}python3 -u {path}; s=$?; rm -f {path}; exit $s")
            }
        };
        let upload_ms = ms(t1.elapsed());
        // A domains run's token is minted per run, for this guest, and sent with the exec.
        let input = ExecInput {
            env: match &plan.grant {
                Some(grant) => grant.env_for(guest.name())?,
                None => std::collections::BTreeMap::new(),
            },
            stdin: String::new(),
        };
        let run = guest
            .exec(&Command::shell(script), &plan.limits, &input, deadline)
            .await?;
        let outcome = guest
            .capture(run, &plan.limits, plan.settings.max_output_bytes)
            .await?;
        let t2 = Instant::now();
        let (files, notes) = if inputs.return_files && !outcome.host_timed_out {
            self.collect_files(guest, plan, &run_id).await
        } else if inputs.return_files {
            (
                Vec::new(),
                vec!["no files were returned: the control plane stopped answering".to_owned()],
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let files_ms = if inputs.return_files {
            ms(t2.elapsed())
        } else {
            0
        };
        Ok(Ran {
            outcome,
            upload_ms,
            files,
            notes,
            files_ms,
        })
    }

    /// Archives this run's own artifacts directory in the guest (and removes it), downloads
    /// the archive under the cap and reads it in memory. Every failure is a note: the program
    /// already ran.
    async fn collect_files(
        &self,
        guest: &Guest,
        plan: &Plan,
        run_id: &str,
    ) -> (Vec<ReturnedFile>, Vec<String>) {
        let archive = format!("/tmp/lf-artifacts-{run_id}.tgz");
        // Archives of earlier runs that a kept guest still holds (a run that failed between
        // archiving and downloading) are removed once they are a few minutes old.
        let script = artifacts::archive(run_id, &archive);
        let limits = ExecLimits {
            budget: Duration::from_secs(u64::from(ARCHIVE_BUDGET_SECONDS)),
            ..plan.limits
        };
        let deadline = Instant::now() + guest.context().backoff.budget;
        let archived = match guest
            .exec(
                &Command::shell(script),
                &limits,
                &ExecInput::default(),
                deadline,
            )
            .await
        {
            Ok(run) => guest.capture(run, &limits, 64 * 1024).await,
            Err(e) => Err(e),
        };
        let mut notes = Vec::new();
        match archived {
            Ok(o) if o.exit_code == 0 => {
                if o.stdout.text.to_string().contains(artifacts::SHARED_MARK) {
                    notes.push(format!(
                        "another run used this guest at the same time: while both ran, \
                         {ARTIFACTS_DIR} pointed at neither run's directory, and files written \
                         through it then were returned to neither; write to \
                         ${ARTIFACTS_ENV}, this run's own directory"
                    ));
                }
            }
            Ok(o) if o.exit_code == artifacts::EXIT_GONE => {
                return (
                    Vec::new(),
                    vec![format!(
                        "no files: this run's directory (${ARTIFACTS_ENV}) was removed before \
                         it was archived"
                    )],
                );
            }
            Ok(o) => {
                let why = o.stderr.text.to_string();
                let why = guest.context().redactor.cap(why.trim());
                return (
                    Vec::new(),
                    vec![format!(
                        "no files: archiving {ARTIFACTS_DIR} failed (exit {}): {why}",
                        o.exit_code
                    )],
                );
            }
            Err(e) => return (Vec::new(), vec![format!("no files: {e}")]),
        }
        // The download has a budget of its own: the archiving above may have used most of
        // the first one, and the whole transfer must end by its deadline.
        let deadline = Instant::now() + guest.context().backoff.budget;
        let bytes = match guest
            .download(&archive, self.opts.max_archive_bytes, deadline)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                return (
                    Vec::new(),
                    vec![format!(
                        "no files: {}",
                        e.redacted(&guest.context().redactor)
                    )],
                );
            }
        };
        let limits = self.opts.archive;
        // Decompressing is CPU work bounded by the limits; it stays off the async threads.
        let read = tokio::task::spawn_blocking(move || read_archive(&bytes, &limits)).await;
        match read {
            Ok(x) => {
                notes.extend(x.notes);
                (x.files, notes)
            }
            Err(_) => (
                Vec::new(),
                vec!["no files: reading the archive failed".to_owned()],
            ),
        }
    }
}

/// What ran in the guest.
struct Ran {
    outcome: ExecOutcome,
    upload_ms: u64,
    files: Vec<ReturnedFile>,
    notes: Vec<String>,
    files_ms: u64,
}

fn random48() -> u64 {
    rand::rng().random::<u64>() & 0xffff_ffff_ffff
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_names_follow_flow_node_and_policy() {
        let inputs = ComponentInputs {
            flow_id: "flow-1".into(),
            component_id: "CreateOSSandbox-abcde".into(),
            ..ComponentInputs::default()
        };
        let a = SandboxComponent::reused_name(
            &inputs,
            "devbox:1",
            "s-2vcpu-4gb",
            &EgressPolicy::DenyAll,
        );
        let b = SandboxComponent::reused_name(
            &inputs,
            "devbox:1",
            "s-2vcpu-4gb",
            &EgressPolicy::AllowAll,
        );
        assert!(a.starts_with("lf-c-") && a.len() <= 22, "{a}");
        assert_ne!(a, b);
        assert_eq!(
            a,
            SandboxComponent::reused_name(
                &inputs,
                "devbox:1",
                "s-2vcpu-4gb",
                &EgressPolicy::DenyAll
            )
        );
        let other = ComponentInputs {
            component_id: "CreateOSSandbox-fghij".into(),
            ..inputs.clone()
        };
        assert_ne!(
            a,
            SandboxComponent::reused_name(
                &other,
                "devbox:1",
                "s-2vcpu-4gb",
                &EgressPolicy::DenyAll
            )
        );
    }

    #[test]
    fn session_names_follow_the_session_and_only_its_digest_enters() {
        let name = |reuse, session: &str| {
            let inputs = ComponentInputs {
                flow_id: "flow-1".into(),
                component_id: "CreateOSSandbox-abcde".into(),
                session_id: session.into(),
                reuse,
                ..ComponentInputs::default()
            };
            SandboxComponent::reused_name(
                &inputs,
                "devbox:1",
                "s-2vcpu-4gb",
                &EgressPolicy::DenyAll,
            )
        };
        let a = name(Reuse::Session, "chat-a");
        assert_eq!(a, name(Reuse::Session, "chat-a"));
        assert_ne!(a, name(Reuse::Session, "chat-b"));
        // The flow's guest is not any session's, and flow names ignore the session id.
        assert_ne!(a, name(Reuse::Flow, "chat-a"));
        assert_eq!(name(Reuse::Flow, "chat-a"), name(Reuse::Flow, "chat-b"));
        let hostile = name(Reuse::Session, &"A/../..;$(rm -rf /)\n\u{0}é".repeat(100));
        assert!(sandbox_core::names::is_valid_name(&hostile), "{hostile}");
        assert!(
            hostile.starts_with("lf-c-") && hostile.len() == 22,
            "{hostile}"
        );
    }

    #[test]
    fn flow_names_are_those_of_earlier_versions() {
        // Kept guests of flows saved with `flow` are found again after an upgrade: the name
        // is still the digest of flow, node, image and shape, with the policy.
        let inputs = ComponentInputs {
            flow_id: "flow-1".into(),
            component_id: "CreateOSSandbox-abcde".into(),
            session_id: "ignored".into(),
            reuse: Reuse::Flow,
            ..ComponentInputs::default()
        };
        let egress = EgressPolicy::DenyAll;
        assert_eq!(
            SandboxComponent::reused_name(&inputs, "devbox:1", "s-2vcpu-4gb", &egress),
            derived_name(
                REUSED_PREFIX,
                &["flow-1", "CreateOSSandbox-abcde", "devbox:1", "s-2vcpu-4gb"],
                &egress.fingerprint()
            )
        );
    }
}
