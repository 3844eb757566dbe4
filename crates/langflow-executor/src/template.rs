//! Baking a flow's guest image: a CreateOS template with lfx (the host's version) and the
//! packages the flow's components import, built from a Dockerfile through the templates API.
//!
//! The caller supplies the requirements (the glue asks lfx's own flow-requirements reader, the
//! one `lfx run` uses for its dependency check); this module decides the rest: which
//! requirements are acceptable, the Dockerfile, a stable template name, and the build itself,
//! whose log lines are handed to the caller as they arrive.

use std::time::Duration;

use futures::StreamExt as _;
use sandbox_core::classify;
use sandbox_core::control::{CallError, TemplateInfo, TemplateStatus};
use sandbox_core::provider::ProviderKind;
use sandbox_core::retry::{Backoff, retry_until};
use sandbox_core::session::Session;
use tokio::time::Instant;

use crate::settings::{ENV_ROOTFS, valid_requirement};
use crate::{EnvLookup, ExecutorError};

/// The image every template starts from (the CreateOS base with `python3` and GNU `timeout`).
pub const BASE_IMAGE: &str = "nodeops/sandbox:debian";
/// Prefix of the template names this package derives (sandbox-core's, where every name format
/// lives).
pub const NAME_PREFIX: &str = sandbox_core::names::TEMPLATE_PREFIX;
/// How long a build may take before the command gives up waiting (the build goes on).
pub const BUILD_BUDGET: Duration = Duration::from_secs(30 * 60);

/// The requirements a template installs: `lfx==<host version>` first, then the flow's own,
/// deduplicated and sorted, without any other lfx pin. A requirement that is not a plain
/// specifier (pip options, URLs, shell characters) is refused.
pub fn requirements(
    flow_requirements: &[String],
    lfx_version: &str,
) -> Result<Vec<String>, ExecutorError> {
    let lfx = format!("lfx=={lfx_version}");
    if !valid_requirement(&lfx) {
        return Err(ExecutorError::Unavailable(format!(
            "the host's lfx version {lfx_version:?} is not a version pip accepts"
        )));
    }
    let mut rest: Vec<String> = Vec::new();
    for r in flow_requirements {
        let r = r.trim();
        if r.is_empty() {
            continue;
        }
        if !valid_requirement(r) {
            return Err(ExecutorError::Unavailable(format!(
                "the flow needs {r:?}, which is not a plain requirement (name, extras and \
                 version specifiers only); install it in a template of your own and set \
                 {ENV_ROOTFS}"
            )));
        }
        let name: String = r
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .collect::<String>()
            .to_ascii_lowercase()
            .replace('_', "-");
        if name == "lfx" {
            continue;
        }
        rest.push(r.to_owned());
    }
    rest.sort();
    rest.dedup();
    Ok(std::iter::once(lfx).chain(rest).collect())
}

/// The Dockerfile of a template with `requirements` (see [`requirements`]).
pub fn dockerfile(requirements: &[String]) -> String {
    let quoted: Vec<String> = requirements.iter().map(|r| format!("'{r}'")).collect();
    format!(
        "# Built by `python -m langflow_sandbox_createos template build`: the CreateOS \
         whole-flow executor's guest image.\n\
         FROM {BASE_IMAGE}\n\
         RUN python3 -m pip install --no-cache-dir --break-system-packages {}\n\
         RUN python3 -c 'from lfx.graph import Graph'\n",
        quoted.join(" ")
    )
}

/// A stable name for a template of this Dockerfile: the same flow needs build the same name
/// ([`sandbox_core::names::template_name`]).
pub fn template_name(dockerfile: &str) -> String {
    sandbox_core::names::template_name(dockerfile)
}

/// A template that finished building.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// Its id: the value of `CREATEOS_EXECUTOR_ROOTFS`.
    pub id: String,
    /// Its name.
    pub name: String,
}

/// How the calls of a build are retried: reads and a declined create (429/503), within a
/// minute each.
const BUILD_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(500),
    max: Duration::from_secs(10),
    budget: Duration::from_secs(60),
};

/// Builds `dockerfile` as template `name` with the package's settings (key, endpoint) read
/// through `env`, on the account's control plane of `session` (the one every surface of the
/// process shares), handing every build log line to `on_line` as it arrives, and waits until
/// the template is ready. A failed build is an error that quotes the end of its log. Templates
/// are CreateOS's: the CreateOS client is installed as the session's connector first
/// (`sandbox_createos::install`).
pub async fn build(
    env: &EnvLookup,
    session: &Session,
    name: &str,
    dockerfile: &str,
    mut on_line: impl FnMut(&str),
) -> Result<Built, ExecutorError> {
    sandbox_createos::install();
    let lookup = |k: &str| env(k);
    let settings = sandbox_core::settings::Settings::from_lookup(&lookup)?;
    let redactor = settings.redactor();
    let account = session.account(&settings)?;
    let cp = account.control_plane().clone();
    let fail = |op: &str, e: &CallError| -> ExecutorError {
        classify::call_failed(ProviderKind::CreateOs, op, e, false, &redactor).into()
    };
    let read = |id: String| {
        let cp = cp.clone();
        async move {
            let deadline = Instant::now() + BUILD_BACKOFF.budget;
            retry_until(
                &BUILD_BACKOFF,
                deadline,
                "template read",
                CallError::is_transient,
                |_| cp.get_template(id.clone()),
            )
            .await
            .0
        }
    };
    let created = retry_until(
        &BUILD_BACKOFF,
        Instant::now() + BUILD_BACKOFF.budget,
        "template create",
        CallError::is_declined,
        |_| cp.create_template(name.to_owned(), dockerfile.to_owned()),
    )
    .await
    .0;
    let created: TemplateInfo = match created {
        Ok(t) => {
            on_line(&format!(
                "template {} ({}) accepted; building",
                t.name, t.id
            ));
            t
        }
        // The name is taken: a derived name means the same image was asked for before.
        Err(e) if e.is_conflict() => {
            let t = read(name.to_owned())
                .await
                .map_err(|e| fail("template lookup", &e))?;
            on_line(&format!(
                "template {} ({}) exists already ({}); using it",
                t.name, t.id, t.status
            ));
            if t.status == TemplateStatus::Ready {
                return Ok(Built {
                    id: t.id,
                    name: t.name,
                });
            }
            t
        }
        Err(e) => return Err(fail("template create", &e)),
    };
    let mut tail: Vec<String> = Vec::new();
    match cp.follow_template_log(created.id.clone()).await {
        Ok(mut logs) => {
            while let Some(event) = logs.next().await {
                let Ok(event) = event else { break };
                if !event.line.is_empty() {
                    let line = redactor.apply(&event.line);
                    on_line(&line);
                    tail.push(line);
                    if tail.len() > 10 {
                        tail.remove(0);
                    }
                }
                if event.is_final {
                    break;
                }
            }
        }
        Err(e) => on_line(&format!(
            "(the build log cannot be followed: {}; waiting for the build)",
            redactor.cap(&e.message)
        )),
    }
    let deadline = Instant::now() + BUILD_BUDGET;
    loop {
        let t = read(created.id.clone())
            .await
            .map_err(|e| fail("template status", &e))?;
        match t.status {
            TemplateStatus::Ready => {
                return Ok(Built {
                    id: t.id,
                    name: t.name,
                });
            }
            TemplateStatus::Failed => {
                return Err(ExecutorError::Execution(format!(
                    "the template build of {} ({}) failed: {}",
                    t.name,
                    t.id,
                    tail.join(" | ")
                )));
            }
            _ if Instant::now() > deadline => {
                return Err(ExecutorError::Execution(format!(
                    "the template {} ({}) is still {} after {} minutes; check it later with the \
                     templates API and set {ENV_ROOTFS}={} once it is ready",
                    t.name,
                    t.id,
                    t.status,
                    BUILD_BUDGET.as_secs() / 60,
                    t.id
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_pin_the_host_lfx_and_refuse_options() {
        let r = requirements(
            &[
                "lfx==1.12.0".into(),
                "langchain-experimental".into(),
                "pandas==2.2.0".into(),
                "langchain-experimental".into(),
                " ".into(),
            ],
            "1.13.0",
        )
        .unwrap();
        assert_eq!(
            r,
            vec!["lfx==1.13.0", "langchain-experimental", "pandas==2.2.0"]
        );
        for bad in ["--index-url=http://evil", "x; rm -rf /", "pkg @ http://x y"] {
            let e = requirements(&[bad.into()], "1.13.0").unwrap_err();
            assert!(e.to_string().contains(ENV_ROOTFS), "{e}");
        }
        assert!(requirements(&[], "1.13.0 ; x").is_err());
    }

    #[test]
    fn dockerfile_and_name_are_stable() {
        let d = dockerfile(&["lfx==1.13.0".into(), "pandas".into()]);
        assert!(d.contains("FROM nodeops/sandbox:debian\n"), "{d}");
        assert!(
            d.contains(
                "pip install --no-cache-dir --break-system-packages 'lfx==1.13.0' 'pandas'\n"
            ),
            "{d}"
        );
        // `import lfx` is lazy in 1.13 and proves nothing: the build imports what the runner
        // needs first.
        assert!(
            d.contains("RUN python3 -c 'from lfx.graph import Graph'"),
            "{d}"
        );
        let a = template_name(&d);
        assert_eq!(a, template_name(&d));
        assert!(a.starts_with(NAME_PREFIX) && a.len() <= 22, "{a}");
        assert_ne!(a, template_name(&dockerfile(&["lfx==1.13.0".into()])));
    }
}
