//! Every fact the suite checks: what the product relies on, where the contract states it, and
//! which file of the fake control plane encodes it (so a disagreement says what to update).

/// One fact of the CreateOS contract that this project depends on.
#[derive(Debug)]
pub(crate) struct Fact {
    /// Stable check id, e.g. `exec.timeout-124`.
    pub id: &'static str,
    /// The fact, in words.
    pub text: &'static str,
    /// The section of `docs/createos-api.md` that states it.
    pub section: &'static str,
    /// The file of the fake control plane that encodes it.
    pub fake: &'static str,
}

const HANDLERS: &str = "tests/fake-control-plane/src/handlers.rs";
const SERVER: &str = "tests/fake-control-plane/src/server.rs";
const STATE: &str = "tests/fake-control-plane/src/state.rs";
const EXEC: &str = "tests/fake-control-plane/src/exec.rs";
const JSEND: &str = "tests/fake-control-plane/src/jsend.rs";
/// Egress enforcement is not modelled by the fake; its README says so.
const FAKE_README: &str = "tests/fake-control-plane/README.md";

const fn fact(
    id: &'static str,
    text: &'static str,
    section: &'static str,
    fake: &'static str,
) -> Fact {
    Fact {
        id,
        text,
        section,
        fake,
    }
}

/// Every check, in the order the suite runs them.
pub(crate) const FACTS: &[Fact] = &[
    fact(
        "health.up",
        "GET /healthz answers {up: true} without a key",
        "§2.1",
        HANDLERS,
    ),
    fact(
        "auth.invalid-key",
        "a wrong X-Api-Key is refused with HTTP 401 and a JSend fail/error envelope",
        "§1.2, §1.4",
        SERVER,
    ),
    fact(
        "auth.whoami",
        "the key authenticates: GET /v1/whoami answers a user_id",
        "§2.2",
        HANDLERS,
    ),
    fact(
        "envelope.not-found",
        "an unknown sandbox id answers HTTP 404 with a JSend fail/error envelope",
        "§1.4, §1.6",
        HANDLERS,
    ),
    fact(
        "catalog.public",
        "GET /v1/shapes and GET /v1/rootfs answer without a key",
        "§1.2",
        SERVER,
    ),
    fact(
        "shapes.fields",
        "every shape has id, vcpu and mem_mib, and its id reads s-<vcpu>vcpu-<M>{mb|gb}",
        "§2.1, §4.2",
        HANDLERS,
    ),
    fact(
        "shapes.memory-floor",
        "the smallest shape with mem_mib >= 4096 (the backend's memory floor) is s-2vcpu-4gb",
        "§4.2",
        HANDLERS,
    ),
    fact(
        "rootfs.devbox",
        "the rootfs catalog offers devbox:1 (the product's default image)",
        "§4.2",
        HANDLERS,
    ),
    fact(
        "create.running",
        "create answers `running` (or `creating`) and the guest then reaches `running`",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "create.name-22",
        "a 22-character name is accepted and read back",
        "§4.3",
        HANDLERS,
    ),
    fact(
        "create.shape",
        "the guest reads back the shape it was created with",
        "§2.6",
        STATE,
    ),
    fact(
        "create.envs-names-only",
        "envs given at create read back as names only, never values",
        "§2.6, §4.4",
        STATE,
    ),
    fact(
        "create.auto-pause",
        "auto_pause_after_seconds given at create reads back",
        "§2.6, §4.6",
        STATE,
    ),
    fact(
        "egress.deny-all-readback",
        "deny-all egress [240.0.0.0/4] reads back as given (GET .../egress and the projection)",
        "§4.1",
        HANDLERS,
    ),
    fact(
        "egress.create-response-is-readback",
        "the create response's egress is the stored policy: equal to GET .../egress right after \
         (what lets a run skip the GET)",
        "§2.6, §4.1",
        HANDLERS,
    ),
    fact(
        "name.unique",
        "creating a second guest with a live guest's name answers 409",
        "§4.3",
        HANDLERS,
    ),
    fact(
        "name.max-length",
        "a 23-character name is refused with a 4xx",
        "§4.3",
        HANDLERS,
    ),
    fact(
        "auto-pause.minimum",
        "auto_pause_after_seconds below 60 is refused with a 4xx",
        "§4.6",
        HANDLERS,
    ),
    fact(
        "exec.buffered",
        "a buffered exec answers HTTP 200 with stdout and exit_code 0",
        "§2.8",
        HANDLERS,
    ),
    fact(
        "exec.exit-code",
        "a non-zero exit is still HTTP 200, with exit_code, stdout and stderr kept apart",
        "§2.8",
        EXEC,
    ),
    fact(
        "exec.no-shell",
        "cmd runs directly, without a shell ($VARS stay literal)",
        "§2.8",
        EXEC,
    ),
    fact(
        "env.at-create",
        "a variable declared at create is in every exec's environment",
        "§4.4",
        HANDLERS,
    ),
    fact(
        "env.undeclared",
        "an exec env key not declared at create is refused with a 4xx",
        "§4.4",
        HANDLERS,
    ),
    fact(
        "env.override-declared",
        "an exec's env overrides the value of a key declared at create (domain-allowlist runs send their proxy token this way)",
        "§4.4",
        HANDLERS,
    ),
    fact(
        "exec.timeout-124",
        "`timeout --signal=TERM --kill-after=5s 1 ...` in the guest exits 124 and the output so far is returned",
        "§4.7",
        EXEC,
    ),
    fact(
        "exec.timeout-kill-137",
        "a program that ignores TERM is KILLed after --kill-after: exit 137, output so far returned",
        "§4.7",
        EXEC,
    ),
    fact(
        "exec.stream",
        "a streamed exec sends stdout and stderr frames, then one final exit_code frame",
        "§3.2",
        EXEC,
    ),
    fact(
        "exec.stream-heartbeat",
        "a quiet streamed exec sends {hb: true} heartbeats",
        "§3.2",
        EXEC,
    ),
    fact(
        "files.upload",
        "PUT .../files creates parent directories and answers {bytes, path}",
        "§2.9",
        HANDLERS,
    ),
    fact(
        "files.download",
        "GET .../files returns the exact bytes (1 MiB, every byte value) with Content-Length",
        "§2.9",
        HANDLERS,
    ),
    fact(
        "files.exec-sees-upload",
        "an uploaded file is visible to exec at the same path",
        "§4.7",
        HANDLERS,
    ),
    fact(
        "files.missing",
        "downloading a missing path answers 404",
        "§2.9",
        HANDLERS,
    ),
    fact(
        "egress.deny-all-blocks-public",
        "from a deny-all guest a connect to a public address (1.1.1.1:443) fails",
        "§4.1",
        FAKE_README,
    ),
    fact(
        "egress.link-local-hole",
        "from a deny-all guest 169.254.169.254:80 (169.254.0.0/16) still answers",
        "§4.1",
        FAKE_README,
    ),
    fact(
        "pause.paused",
        "pause answers `pausing` or `paused`, then the guest is `paused`",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "pause.exec-409",
        "exec on a paused guest answers 409",
        "§4.5",
        HANDLERS,
    ),
    fact(
        "pause.files-409",
        "file access on a paused guest answers 409 \"sandbox is paused; resume it before accessing files\"",
        "§2.9, §4.5",
        JSEND,
    ),
    fact(
        "resume.running",
        "resume answers `resuming` (or `running`) and the guest returns to `running`",
        "§4.5",
        HANDLERS,
    ),
    fact(
        "resume.state-kept",
        "files survive a pause and resume",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "destroy.answer",
        "DELETE answers {id, status: destroying|destroyed}",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "name.held-while-destroying",
        "a `destroying` guest still holds its name (a create with it answers 409)",
        "§4.3",
        STATE,
    ),
    fact(
        "destroy.idempotent",
        "a second DELETE succeeds again (destroying|destroyed)",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "destroy.final",
        "a deleted guest ends `destroyed` (or 404) and never comes back",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "destroy.exec-refused",
        "exec on a destroyed guest is refused with a 4xx",
        "§2.6",
        HANDLERS,
    ),
    fact(
        "name.reusable",
        "once a guest is `destroyed` its name can be used again",
        "§4.3",
        STATE,
    ),
    fact(
        "egress.allow-all-readback",
        "egress [*] reads back as [*] (or empty; both mean allow-all)",
        "§4.1",
        HANDLERS,
    ),
    fact(
        "list.by-name",
        "GET /v1/sandboxes lists the guest under its exact name, running",
        "§4.3",
        HANDLERS,
    ),
    fact(
        "list.pagination",
        "limit=1 pages walk the same rows as one limit=500 page (no duplicates), and status=running filters",
        "§1.9",
        JSEND,
    ),
    fact(
        "egress.address-rules",
        "address rules (IP:port, CIDR) are stored and echoed by PUT .../egress",
        "§4.1",
        HANDLERS,
    ),
    fact(
        "egress.unparsable-rule",
        "an unparsable address rule is stored as given (no server validation; sandbox-core validates)",
        "§4.1",
        HANDLERS,
    ),
    fact(
        "egress.hostname-echoed",
        "a hostname rule is accepted at create and echoed back",
        "§4.1",
        HANDLERS,
    ),
    fact(
        "egress.hostname-not-enforced",
        "a guest allowed only a hostname still reaches other public addresses (1.1.1.1:443)",
        "§4.1",
        FAKE_README,
    ),
    fact(
        "egress.single-address-readback",
        "a /32 rule (what sandbox-core sends for one address) reads back as 1.1.1.1/32 or \
         1.1.1.1 in the create response and GET .../egress (the comparison is canonical)",
        "§4.1",
        HANDLERS,
    ),
    fact(
        "egress.cidr32-enforced",
        "a guest allowed only 1.1.1.1/32 reaches 1.1.1.1:443 and not 1.0.0.1:443",
        "§4.1",
        FAKE_README,
    ),
    fact(
        "egress.bare-ip-enforced",
        "is a bare IP enforced? a guest allowed only 1.1.1.1 (no /32) reaches 1.1.1.1:443 and \
         not 1.0.0.1:443 (sandbox-core sends /32 either way; this settles whether the bare \
         spelling would be safe too)",
        "§4.1",
        FAKE_README,
    ),
];

/// The fact with this id. Panics on an unknown id: that is a bug in the suite, caught by the
/// crate's tests, which run every check.
pub(crate) fn fact_of(id: &str) -> &'static Fact {
    FACTS
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("unknown check id {id:?}"))
}

#[cfg(test)]
mod tests {
    use super::FACTS;

    #[test]
    fn ids_are_unique() {
        for (i, f) in FACTS.iter().enumerate() {
            assert!(
                FACTS[..i].iter().all(|g| g.id != f.id),
                "duplicate id {}",
                f.id
            );
        }
    }
}
