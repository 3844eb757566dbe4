//! Which flow a run belongs to, for Guest Reuse.
//!
//! A kept guest is named after the flow, the node and the policy (see
//! [`crate::SandboxComponent::reused_name`]), so the flow's id decides who shares it. The node's
//! id alone cannot: templates and exports copy it, and two unrelated flows made from one
//! template would share a guest and its files. The id is, in order:
//!
//! 1. the one the graph carries (`graph.flow_id`): a flow saved in Langflow, `/api/v1/run`,
//!    `lfx serve` (which gives a file without an id one derived from its path);
//! 2. otherwise, under `lfx run FILE.json` (or `lfx run --flow-json JSON`), the `id` that a flow
//!    exported from Langflow carries at the top of its JSON. lfx loads only the graph of such a
//!    file and drops its id, so it is read from the file the process's command line names, and
//!    used only when that file holds this node (so it is the flow being run);
//! 3. otherwise there is none, and Guest Reuse is refused before any guest exists: an unsaved
//!    flow, a `Graph.dump()` without an id, `lfx run --stdin`.
//!
//! Two copies of one exported file share its id, and so a guest, as two runs of one saved flow
//! do; `lfx run` and `lfx serve` of the same exported file find the same guest.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use sandbox_core::SandboxError;
use serde::Deserialize;

use crate::{ComponentInputs, Reuse, input};

/// The largest flow file read for its id (64 MiB); a larger one is not read.
pub const MAX_FLOW_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// The longest flow id accepted from a file (Langflow's are 36-character UUIDs).
pub const MAX_FLOW_ID_CHARS: usize = 200;

/// `lfx run`'s options that take a value (lfx 1.12 and 1.13), as the command line spells them.
const RUN_VALUE_OPTIONS: [&str; 6] = [
    "--input-value",
    "--format",
    "-f",
    "--flow-json",
    "--session-id",
    "--upgrade-flow",
];

/// Where an `lfx run` process read its flow from, as its command line says.
#[derive(Clone, PartialEq, Eq)]
pub enum FlowSource {
    /// `lfx run PATH.json`: the file (relative to the process's working directory).
    File(PathBuf),
    /// `lfx run --flow-json JSON`: the flow's text itself.
    Inline(String),
}

impl fmt::Debug for FlowSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowSource::File(path) => f.debug_tuple("File").field(path).finish(),
            // The text is the user's flow (it may hold credentials): its size only.
            FlowSource::Inline(text) => write!(f, "Inline({} bytes)", text.len()),
        }
    }
}

impl fmt::Display for FlowSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowSource::File(path) => write!(f, "{}", escaped(&path.display().to_string())),
            FlowSource::Inline(_) => f.write_str("--flow-json"),
        }
    }
}

/// The flow source of an `lfx run` process, from its command line (Python's `sys.argv`:
/// the program, then its arguments). `None` for any other program or subcommand, for a
/// Python script (`lfx run flow.py` builds its graph in code, with no file id) and for
/// `--stdin` (the text is gone).
pub fn lfx_run_source(argv: &[String]) -> Option<FlowSource> {
    let (program, arguments) = argv.split_first()?;
    if !is_lfx(program) {
        return None;
    }
    // lfx's own options before the subcommand are flags (`--version`, `-V`).
    let mut rest = arguments.iter().skip_while(|a| a.starts_with('-'));
    if rest.next().map(String::as_str) != Some("run") {
        return None;
    }
    let mut positional: Vec<&str> = Vec::new();
    let mut inline: Option<&str> = None;
    let mut only_positional = false;
    while let Some(arg) = rest.next() {
        let arg = arg.as_str();
        if only_positional || !arg.starts_with('-') || arg == "-" {
            positional.push(arg);
            continue;
        }
        if arg == "--" {
            only_positional = true;
            continue;
        }
        let (name, attached) = match arg.split_once('=') {
            Some((name, value)) if arg.starts_with("--") => (name, Some(value)),
            // Click also takes a short option's value glued on (`-fjson`).
            _ if !arg.starts_with("--") && arg.len() > 2 && arg.starts_with("-f") => {
                ("-f", Some(&arg[2..]))
            }
            _ => (arg, None),
        };
        if !RUN_VALUE_OPTIONS.contains(&name) {
            continue; // a flag
        }
        let value = match attached {
            Some(v) => Some(v),
            None => rest.next().map(String::as_str),
        };
        if name == "--flow-json" {
            inline = value;
        }
    }
    if let Some(text) = inline {
        return Some(FlowSource::Inline(text.to_owned()));
    }
    let path = Path::new(positional.first()?);
    let json = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    json.then(|| FlowSource::File(path.to_path_buf()))
}

/// `lfx` as a console script (`lfx`, `lfx.exe`, `lfx-script.py`) or as `python -m lfx`.
fn is_lfx(program: &str) -> bool {
    let path = Path::new(program);
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    if matches!(file, "lfx" | "lfx.exe" | "lfx-script.py") {
        return true;
    }
    file == "__main__.py"
        && path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|dir| dir == "lfx")
}

#[derive(Deserialize)]
struct Exported {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    data: Option<ExportedGraph>,
}

#[derive(Deserialize)]
struct ExportedGraph {
    #[serde(default)]
    nodes: Vec<ExportedNode>,
}

#[derive(Deserialize)]
struct ExportedNode {
    #[serde(default)]
    id: Option<serde_json::Value>,
}

/// The id an exported flow's text carries, if it holds the node `component_id`; otherwise
/// why not, in words for the refusal.
pub fn exported_id(text: &[u8], component_id: &str) -> Result<String, String> {
    let flow: Exported = serde_json::from_slice(text).map_err(|e| {
        let mut why = e.to_string();
        why.truncate(160);
        format!("is not a flow exported from Langflow ({})", escaped(&why))
    })?;
    let Some(graph) = flow.data else {
        return Err("has no `data` graph around its nodes, so no flow id either".to_owned());
    };
    let holds_node = graph
        .nodes
        .iter()
        .any(|n| n.id.as_ref().and_then(|v| v.as_str()) == Some(component_id));
    if !holds_node {
        return Err(format!(
            "does not hold this node ({}), so it is not the flow being run",
            escaped(component_id)
        ));
    }
    let id = match flow.id {
        None | Some(serde_json::Value::Null) => {
            return Err("has no top-level `id`".to_owned());
        }
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return Err("has an `id` that is not a string".to_owned()),
    };
    let id = id.trim();
    if id.is_empty() {
        return Err("has an empty `id`".to_owned());
    }
    if id.chars().count() > MAX_FLOW_ID_CHARS || id.chars().any(char::is_control) {
        return Err(format!(
            "has an `id` that is not a flow id (over {MAX_FLOW_ID_CHARS} characters, or control \
             characters)"
        ));
    }
    Ok(id.to_owned())
}

/// Reads the id of the flow `source` names (a file is read only up to
/// [`MAX_FLOW_FILE_BYTES`]). Blocking: call it off the async runtime's workers.
pub fn read_exported_id(source: &FlowSource, component_id: &str) -> Result<String, String> {
    match source {
        FlowSource::Inline(text) => exported_id(text.as_bytes(), component_id),
        FlowSource::File(path) => {
            let size = std::fs::metadata(path)
                .map_err(|e| format!("cannot be read ({})", e.kind()))?
                .len();
            if size > MAX_FLOW_FILE_BYTES {
                return Err(format!(
                    "is {size} bytes, over the {MAX_FLOW_FILE_BYTES} read for a flow id"
                ));
            }
            let text = std::fs::read(path).map_err(|e| format!("cannot be read ({})", e.kind()))?;
            exported_id(&text, component_id)
        }
    }
}

/// The inputs with the flow id Guest Reuse names its guest after: unchanged when the graph
/// carries one or reuse is off, with the exported file's id under `lfx run` of an exported
/// flow. Refuses, before any guest exists, reuse that would let two flows or two sessions
/// share a guest.
pub async fn resolve(inputs: &ComponentInputs) -> Result<Cow<'_, ComponentInputs>, SandboxError> {
    if !inputs.reuse.keeps() || !inputs.flow_id.trim().is_empty() {
        check_session(inputs)?;
        return Ok(Cow::Borrowed(inputs));
    }
    let why = match lfx_run_source(&inputs.invocation) {
        None => "an unsaved flow, a flow JSON without an `id`, or `lfx run --stdin`".to_owned(),
        Some(source) => {
            let node = inputs.component_id.clone();
            let src = source.clone();
            let read = tokio::task::spawn_blocking(move || read_exported_id(&src, &node))
                .await
                .unwrap_or_else(|_| Err("could not be read (an internal error)".to_owned()));
            match read {
                Ok(id) => {
                    let resolved = ComponentInputs {
                        flow_id: id,
                        ..inputs.clone()
                    };
                    check_session(&resolved)?;
                    return Ok(Cow::Owned(resolved));
                }
                Err(why) => format!("`lfx run` read it from {source}, which {why}"),
            }
        }
    };
    let mode = inputs.reuse.as_str();
    Err(SandboxError::refused(format!(
        "{} is {mode}, but this flow has no flow id ({why}), and the node's id alone does not \
         tell two flows apart: templates and exports copy it, so two different flows could \
         share one guest and its files. Set {} to off, export the flow from Langflow (the JSON \
         then carries its id, which `lfx run` uses), or run it saved in Langflow or with `lfx \
         serve`, which give it an id",
        input::REUSE,
        input::REUSE
    )))
}

/// Session reuse needs the session's id.
fn check_session(inputs: &ComponentInputs) -> Result<(), SandboxError> {
    if inputs.reuse == Reuse::Session && inputs.session_id.trim().is_empty() {
        return Err(SandboxError::refused(format!(
            "{} is session, but this run has no Langflow session id to keep a guest for. Set \
             {} to flow (one guest for everyone who runs the flow) or off, or run the flow \
             with a session id",
            input::REUSE,
            input::REUSE
        )));
    }
    Ok(())
}

/// Outside text (a path, an id) on one line with its control characters escaped, so it cannot
/// act on a terminal or break a log line.
fn escaped(text: &str) -> String {
    outside_text::line(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|&a| a.to_owned()).collect()
    }

    #[allow(clippy::unnecessary_wraps)] // reads as the expected value of each case
    fn file(p: &str) -> Option<FlowSource> {
        Some(FlowSource::File(PathBuf::from(p)))
    }

    #[test]
    fn the_flow_file_is_found_in_lfx_runs_command_line() {
        let cases: &[(&[&str], Option<FlowSource>)] = &[
            (&["/v/bin/lfx", "run", "flow.json", "hi"], file("flow.json")),
            (
                &["lfx", "run", "--no-check-dependencies", "a/F.JSON", "x"],
                file("a/F.JSON"),
            ),
            (
                &[
                    "lfx",
                    "-V",
                    "run",
                    "--format",
                    "text",
                    "--session-id",
                    "s.json",
                    "f.json",
                ],
                file("f.json"),
            ),
            (&["lfx", "run", "--format=json", "f.json"], file("f.json")),
            (&["lfx", "run", "-fjson", "f.json"], file("f.json")),
            (&["lfx", "run", "--", "-odd.json"], file("-odd.json")),
            (
                &[
                    "/usr/lib/python3/site-packages/lfx/__main__.py",
                    "run",
                    "f.json",
                ],
                file("f.json"),
            ),
            (
                &["lfx", "run", "--flow-json", "{\"id\":\"x\"}", "hi"],
                Some(FlowSource::Inline("{\"id\":\"x\"}".into())),
            ),
            (
                &["lfx", "run", "--flow-json={}"],
                Some(FlowSource::Inline("{}".into())),
            ),
            // Not a JSON file, not lfx run, nothing at all.
            (&["lfx", "run", "graph.py", "hi"], None),
            (&["lfx", "run", "--stdin"], None),
            (&["lfx", "serve", "f.json"], None),
            (&["python", "script.py", "run", "f.json"], None),
            (&["/v/bin/langflow", "run", "f.json"], None),
            (&[], None),
        ];
        for (args, want) in cases {
            assert_eq!(&lfx_run_source(&argv(args)), want, "{args:?}");
        }
    }

    const EXPORTED: &str = r#"{"id": "3f2a0c4e-1b7d-4e8a-9c55-0d6b2f1e9a77", "name": "n",
        "data": {"nodes": [{"id": "chat_in"}, {"id": "createos_sandbox", "data": {}}],
                 "edges": []}, "is_component": false}"#;

    #[test]
    fn an_exported_flow_gives_its_id_only_when_it_holds_the_node() {
        assert_eq!(
            exported_id(EXPORTED.as_bytes(), "createos_sandbox").unwrap(),
            "3f2a0c4e-1b7d-4e8a-9c55-0d6b2f1e9a77"
        );
        let other = exported_id(EXPORTED.as_bytes(), "CreateOSSandbox-x").unwrap_err();
        assert!(other.contains("does not hold this node"), "{other}");
        let no_id = EXPORTED.replace(r#""id": "3f2a0c4e-1b7d-4e8a-9c55-0d6b2f1e9a77","#, "");
        let why = exported_id(no_id.as_bytes(), "createos_sandbox").unwrap_err();
        assert!(why.contains("no top-level `id`"), "{why}");
        for (bad, says) in [
            (
                r#"{"id": 7, "data": {"nodes": [{"id": "n"}]}}"#,
                "not a string",
            ),
            (r#"{"id": "  ", "data": {"nodes": [{"id": "n"}]}}"#, "empty"),
            (
                r#"{"id": "a\u0007b", "data": {"nodes": [{"id": "n"}]}}"#,
                "control",
            ),
            (r#"{"nodes": [{"id": "n"}]}"#, "no `data` graph"),
            ("[1, 2]", "not a flow exported"),
            (
                "{\"id\": \"x\", \"data\": {\"nodes\": [{\"id\": \"n\"}]",
                "not a flow exported",
            ),
        ] {
            let why = exported_id(bad.as_bytes(), "n").unwrap_err();
            assert!(why.contains(says), "{bad}: {why}");
        }
        let long = format!(
            r#"{{"id": "{}", "data": {{"nodes": [{{"id": "n"}}]}}}}"#,
            "a".repeat(MAX_FLOW_ID_CHARS + 1)
        );
        assert!(exported_id(long.as_bytes(), "n").is_err());
    }

    fn keeping(invocation: Vec<String>) -> ComponentInputs {
        ComponentInputs {
            component_id: "createos_sandbox".into(),
            reuse: Reuse::Flow,
            invocation,
            ..ComponentInputs::default()
        }
    }

    #[tokio::test]
    async fn resolve_prefers_the_graphs_id_then_the_exported_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flow.json");
        std::fs::write(&path, EXPORTED).unwrap();
        let run = vec!["lfx".into(), "run".into(), path.display().to_string()];

        let from_file = keeping(run.clone());
        let got = resolve(&from_file).await.unwrap();
        assert_eq!(got.flow_id, "3f2a0c4e-1b7d-4e8a-9c55-0d6b2f1e9a77");

        let saved = ComponentInputs {
            flow_id: "saved-id".into(),
            ..keeping(run.clone())
        };
        assert!(matches!(resolve(&saved).await.unwrap(), Cow::Borrowed(_)));

        // Reuse off needs no id and reads nothing.
        let off = ComponentInputs {
            reuse: Reuse::Off,
            ..keeping(vec!["lfx".into(), "run".into(), "/nonexistent.json".into()])
        };
        assert!(matches!(resolve(&off).await.unwrap(), Cow::Borrowed(_)));

        // The id removed: refused, naming the file and the ways out.
        std::fs::write(
            &path,
            EXPORTED.replace(r#""id": "3f2a0c4e-1b7d-4e8a-9c55-0d6b2f1e9a77","#, ""),
        )
        .unwrap();
        let err = resolve(&from_file).await.unwrap_err();
        let msg = err.to_string();
        assert!(err.kind().is_unavailable(), "{err:?}");
        for part in [
            "Guest Reuse (session_mode)",
            "flow id",
            "flow.json",
            "no top-level `id`",
            "lfx serve",
            "off",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }

        let none = resolve(&keeping(Vec::new())).await.unwrap_err().to_string();
        assert!(
            none.contains("an unsaved flow") && none.contains("lfx serve"),
            "{none}"
        );

        // Session reuse with the file's id still needs a session id.
        std::fs::write(&path, EXPORTED).unwrap();
        let session = ComponentInputs {
            reuse: Reuse::Session,
            ..keeping(run)
        };
        let msg = resolve(&session).await.unwrap_err().to_string();
        assert!(msg.contains("no Langflow session id"), "{msg}");
    }

    #[test]
    fn a_file_over_the_bound_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_FLOW_FILE_BYTES + 1).unwrap();
        let why = read_exported_id(&FlowSource::File(path), "n").unwrap_err();
        assert!(why.contains("over the"), "{why}");
        let missing = read_exported_id(&FlowSource::File("/nonexistent/f.json".into()), "n");
        assert!(missing.unwrap_err().contains("cannot be read"));
    }

    #[test]
    fn an_inline_flow_shows_its_size_only() {
        let shown = format!("{:?}", FlowSource::Inline("{\"secret\": 1}".into()));
        assert!(!shown.contains("secret"), "{shown}");
    }
}
