//! What one flow run sends to the guest: the job document the runner reads.
//!
//! The caller (the Python glue) hands over a request: the flow's `Graph.dump`, the seam's
//! `inputs`, the `runtime_options` it could convert to JSON (plus the names of those it could
//! not), and what the host resolved for the flow in its own process: the field values that
//! load from global variables, the session's chat history, and the uploaded files the flow's
//! file inputs read. This module decides what crosses the boundary: which mode the guest runs
//! (`Graph.arun`'s legacy passthrough or the streaming path), where the inputs live, which
//! options are forwarded or dropped, and how much history and how many file bytes travel
//! ([`MAX_HISTORY_MESSAGES`], [`MAX_HISTORY_BYTES`], [`MAX_FILES`], [`MAX_FILE_BYTES`]).
//!
//! Resolved variable values travel only in the job (an uploaded file the runner deletes once
//! read), never in the guest's create request; [`FlowRequest::secrets`] lists them so the host
//! masks them in everything it logs or raises from the guest's output.

use std::path::PathBuf;

use sandbox_core::LOG_TARGET;
use serde_json::{Map, Value, json};

use crate::runner::PROTOCOL;

/// The most chat-history messages of the run's session sent to the guest (the newest).
pub const MAX_HISTORY_MESSAGES: usize = 500;
/// The most bytes of chat history (serialized messages) sent to the guest.
pub const MAX_HISTORY_BYTES: usize = 4 * 1024 * 1024;
/// The most uploaded files a run sends to its guest.
pub const MAX_FILES: usize = 32;
/// The most bytes of uploaded files a run sends to its guest, all files together.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Where uploaded files are written in the guest (each under a directory of its own).
pub const FILES_DIR: &str = "/workspace/lfx_files/";

/// How the guest runs the flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `Graph._arun_legacy` (what `Graph.arun` and `/api/v1/run` run in-process): the terminal
    /// frame carries the `RunOutputs`.
    Legacy,
    /// `Graph.async_start` (what `lfx run`, `lfx serve` and Loop subgraphs consume): one payload
    /// per vertex; the terminal frame carries no outputs, as in-process.
    Stream,
}

impl Mode {
    /// The runner's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Stream => "stream",
        }
    }
}

/// Options that belong to the host process and cannot cross into the guest.
pub const HOST_ONLY_OPTIONS: &[&str] = &["event_manager", "open_flow_span"];
/// The legacy flag (reserved `_` keys are otherwise never forwarded).
pub const LEGACY_FLAG: &str = "_use_arun_legacy";
/// The tag of an lfx `InputValueRequest` converted to JSON.
pub const INPUT_VALUE_REQUEST: &str = "InputValueRequest";

/// The session's chat history as the host read it from its message store.
#[derive(Clone, PartialEq, Default)]
pub struct History {
    /// Serialized `Message`s, newest first.
    pub messages: Vec<Value>,
    /// The store had more than `messages` (the host asked for one more than it sends).
    pub more: bool,
}

/// An uploaded file a flow's file input reads, to be written in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    /// The file on the host (inside Langflow's storage).
    pub host_path: PathBuf,
    /// Where the guest reads it: under [`FILES_DIR`].
    pub guest_path: String,
    /// The component that reads it (for messages).
    pub component: String,
}

/// A field of the flow that loads from a global variable, and the variable it names: what the
/// host resolves for the run (Langflow's variables, else the host's environment under lfx's
/// rules). Known before the flow is resolved, so a flow that names a withheld variable is
/// refused before any guest exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskedVariable {
    /// The vertex (node) id.
    pub vertex: String,
    /// The component's display name, when the flow has one.
    pub component: Option<String>,
    /// The field.
    pub field: String,
    /// The variable's name, as the flow writes it.
    pub name: String,
}

impl AskedVariable {
    /// Who asks, for a message: "the field `api_key` of Secret Probe (vertex `secret`)".
    pub fn describe(&self) -> String {
        let shown = |t: &str| {
            let s = sandbox_core::withheld::shown(t);
            s[1..s.len() - 1].to_owned()
        };
        match &self.component {
            Some(c) => format!(
                "the field `{}` of {} (vertex `{}`)",
                shown(&self.field),
                shown(c),
                shown(&self.vertex)
            ),
            None => format!(
                "the field `{}` of vertex `{}`",
                shown(&self.field),
                shown(&self.vertex)
            ),
        }
    }
}

/// The fields of a `Graph.dump` that load from a global variable (`load_from_db` with a name
/// as the value), node by node: what lfx's build asks the host to resolve for them.
pub fn asked_variables(flow: &Value) -> Vec<AskedVariable> {
    let mut out = Vec::new();
    let nodes = flow
        .pointer("/data/nodes")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for node in nodes {
        let vertex = node
            .get("id")
            .and_then(Value::as_str)
            .or_else(|| node.pointer("/data/id").and_then(Value::as_str))
            .unwrap_or_default();
        let component = node
            .pointer("/data/node/display_name")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let Some(template) = node
            .pointer("/data/node/template")
            .and_then(Value::as_object)
        else {
            continue;
        };
        for (field, spec) in template {
            let mut ask = |field: String, name: &str| {
                if !name.trim().is_empty() {
                    out.push(AskedVariable {
                        vertex: vertex.to_owned(),
                        component: component.clone(),
                        field,
                        name: name.to_owned(),
                    });
                }
            };
            if spec.get("load_from_db") == Some(&Value::Bool(true))
                && let Some(name) = spec.get("value").and_then(Value::as_str)
            {
                ask(field.clone(), name);
            }
            for (cell, name) in table_cells(field, spec) {
                ask(cell, name);
            }
        }
    }
    out
}

/// The cells of a table field (`spec` of `field`) that load from a global variable, as lfx's
/// loading resolves them: each cell of a `table_schema` column marked `load_from_db`, unless
/// the row's own `__load_from_db_fields` turns that cell off. Named `field[row].column`.
fn table_cells<'a>(field: &str, spec: &'a Value) -> Vec<(String, &'a str)> {
    let columns: Vec<&str> = spec
        .get("table_schema")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|c| c.get("load_from_db") == Some(&Value::Bool(true)))
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let Some(rows) = spec.get("value").and_then(Value::as_array) else {
        return Vec::new();
    };
    if columns.is_empty() {
        return Vec::new();
    }
    let mut cells = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let Some(row) = row.as_object() else { continue };
        let switches = row.get("__load_from_db_fields");
        for &column in &columns {
            let off = match switches {
                Some(Value::Object(m)) => m.get(column).is_some_and(|v| v == &Value::Bool(false)),
                Some(Value::Array(names)) => !names.iter().any(|n| n.as_str() == Some(column)),
                _ => false,
            };
            if off {
                continue;
            }
            if let Some(name) = row.get(column).and_then(Value::as_str) {
                cells.push((format!("{field}[{i}].{column}"), name));
            }
        }
    }
    cells
}

/// What a run needs to know before its flow is known in full: enough to admit it, refuse it
/// and create its guest, so the glue's slower work (dumping the graph, resolving variables,
/// reading history) overlaps the create and the guest's import of lfx. The rest comes as the
/// [`FlowRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHead {
    /// The graph's flow id (for the per-flow cap and usage records).
    pub flow_id: Option<String>,
    /// The run's chat session (for usage records).
    pub session_id: Option<String>,
    /// How the guest runs the flow.
    pub mode: Mode,
    /// The uploaded files the flow's file inputs read (measured and read before any guest).
    pub files: Vec<HostFile>,
    /// The variables the flow's fields ask for (checked before any guest exists).
    pub asked: Vec<AskedVariable>,
}

impl RunHead {
    /// Parses the head document the glue sends first: `{"flow_id"?, "session_id"?,
    /// "options"?: {"_use_arun_legacy"?}, "files"?: [{"host_path", "guest_path",
    /// "component"}], "variables"?: [{"vertex", "component"?, "field", "name"}]}` (any other
    /// key is ignored).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(mut o) = v else {
            return Err("not a JSON object".to_owned());
        };
        let text_field = |o: &mut Map<String, Value>, k: &str| match o.remove(k) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        let mode = match o.get("options") {
            None | Some(Value::Null) => Mode::Stream,
            Some(Value::Object(m)) => mode_of(m),
            Some(_) => return Err("`options` is not an object".to_owned()),
        };
        Ok(Self {
            flow_id: text_field(&mut o, "flow_id"),
            session_id: text_field(&mut o, "session_id"),
            mode,
            files: files_of(o.remove("files"))?,
            asked: asked_of(o.remove("variables"))?,
        })
    }

    /// Checks the uploaded files against [`MAX_FILES`] and [`MAX_FILE_BYTES`] and reads them
    /// (see [`read_files`]).
    pub async fn read_files(&self) -> Result<Vec<(String, bytes::Bytes)>, String> {
        read_files(&self.files).await
    }
}

fn mode_of(options: &Map<String, Value>) -> Mode {
    match options.get(LEGACY_FLAG) {
        Some(Value::Bool(true)) => Mode::Legacy,
        _ => Mode::Stream,
    }
}

fn asked_of(raw: Option<Value>) -> Result<Vec<AskedVariable>, String> {
    let items = match raw {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("`variables` is not a list".to_owned()),
    };
    items
        .into_iter()
        .map(|item| {
            let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
            Ok(AskedVariable {
                vertex: text("vertex").unwrap_or_default(),
                component: text("component"),
                field: text("field").unwrap_or_default(),
                name: text("name").ok_or("a `variables` entry without a `name`")?,
            })
        })
        .collect()
}

fn files_of(raw: Option<Value>) -> Result<Vec<HostFile>, String> {
    match raw {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(host_file).collect(),
        Some(_) => Err("`files` is not a list".to_owned()),
    }
}

/// A run request, as the glue converted it. `Debug` shows ids, names and counts, never the
/// flow, the inputs, option values, variable values or history (a flow's component fields,
/// inputs and variables may carry keys).
#[derive(Clone, PartialEq)]
pub struct FlowRequest {
    /// `Graph.dump()` of the flow.
    pub flow: Value,
    /// The graph's flow id, name and user id, if it has them.
    pub flow_id: Option<String>,
    /// The flow's name.
    pub flow_name: Option<String>,
    /// The user the flow runs for.
    pub user_id: Option<String>,
    /// The seam's `inputs` (a list of input dicts).
    pub inputs: Vec<Value>,
    /// The runtime options that were JSON-serializable.
    pub options: Map<String, Value>,
    /// The names of the options that were not (dropped with a debug log).
    pub unserializable: Vec<String>,
    /// The run's chat session (the graph's `session_id`).
    pub session_id: Option<String>,
    /// The graph's run id.
    pub run_id: Option<String>,
    /// The serving plane's end user, when the run has one.
    pub end_user_id: Option<String>,
    /// Whether the run's messages persist (the graph's `persist_messages`).
    pub persist_messages: bool,
    /// What the host resolved for the fields that load from global variables, per vertex id:
    /// `{"params": {field: value}, "drop": [field]}`, or `{"error": {"type", "base",
    /// "message"}}` when the resolution raised (the guest raises it when the vertex builds).
    pub variables: Map<String, Value>,
    /// The session's chat history, or `None` when the host has no message store (the guest
    /// then keeps lfx's own, as the host does).
    pub memory: Option<History>,
    /// The uploaded files the flow's file inputs read.
    pub files: Vec<HostFile>,
    /// The guest's values of those file inputs, per vertex id: `{field: path or [paths]}`.
    pub file_params: Map<String, Value>,
    /// What the glue spent on this request (the graph's dump, variables, history, files), as
    /// it reported it (bounded), for the run's timings.
    pub host_context_ms: Option<u64>,
}

impl std::fmt::Debug for FlowRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = self
            .flow
            .pointer("/data/nodes")
            .and_then(Value::as_array)
            .map(Vec::len);
        f.debug_struct("FlowRequest")
            .field("flow_id", &self.flow_id)
            .field("flow_name", &self.flow_name)
            .field("user_id", &self.user_id)
            .field("flow_nodes", &nodes)
            .field("inputs", &self.inputs.len())
            .field("options", &self.options.keys().collect::<Vec<_>>())
            .field("unserializable", &self.unserializable)
            .field("session_id", &self.session_id)
            .field("run_id", &self.run_id)
            .field("end_user_id", &self.end_user_id)
            .field("persist_messages", &self.persist_messages)
            .field("variables", &self.variables.len())
            .field("history", &self.memory.as_ref().map(|h| h.messages.len()))
            .field("files", &self.files.len())
            .field("file_params", &self.file_params.len())
            .field("host_context_ms", &self.host_context_ms)
            .finish()
    }
}

impl FlowRequest {
    /// Parses the request document the glue sends: `{"flow", "flow_id"?, "flow_name"?,
    /// "user_id"?, "inputs"?, "options"?, "unserializable"?, "session_id"?, "run_id"?,
    /// "end_user_id"?, "persist_messages"?, "variables"?, "memory"?: {"history": [newest
    /// first], "more"}, "files"?: [{"host_path", "guest_path", "component"}], "file_params"?}`.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(mut o) = v else {
            return Err("not a JSON object".to_owned());
        };
        let flow = o.remove("flow").ok_or("it has no `flow`")?;
        if !flow.is_object() {
            return Err("`flow` is not a Graph.dump object".to_owned());
        }
        let text_field = |o: &mut Map<String, Value>, k: &str| match o.remove(k) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        let flow_id = text_field(&mut o, "flow_id");
        let flow_name = text_field(&mut o, "flow_name");
        let user_id = text_field(&mut o, "user_id");
        let inputs = match o.remove("inputs") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a,
            Some(_) => return Err("`inputs` is not a list".to_owned()),
        };
        let options = match o.remove("options") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => return Err("`options` is not an object".to_owned()),
        };
        let unserializable = match o.remove("unserializable") {
            Some(Value::Array(a)) => a
                .into_iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let session_id = text_field(&mut o, "session_id");
        let run_id = text_field(&mut o, "run_id");
        let end_user_id = text_field(&mut o, "end_user_id");
        let persist_messages = !matches!(o.remove("persist_messages"), Some(Value::Bool(false)));
        let object = |o: &mut Map<String, Value>, k: &str| match o.remove(k) {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(m)) => Ok(m),
            Some(_) => Err(format!("`{k}` is not an object")),
        };
        let variables = object(&mut o, "variables")?;
        let file_params = object(&mut o, "file_params")?;
        let memory = match o.remove("memory") {
            None | Some(Value::Null) => None,
            Some(Value::Object(mut m)) => Some(History {
                messages: match m.remove("history") {
                    Some(Value::Array(a)) => a,
                    None | Some(Value::Null) => Vec::new(),
                    Some(_) => return Err("`memory.history` is not a list".to_owned()),
                },
                more: matches!(m.get("more"), Some(Value::Bool(true))),
            }),
            Some(_) => return Err("`memory` is not an object".to_owned()),
        };
        let files = files_of(o.remove("files"))?;
        let host_context_ms = o
            .remove("host_context_ms")
            .as_ref()
            .and_then(crate::timings::reported);
        Ok(Self {
            flow,
            flow_id,
            flow_name,
            user_id,
            inputs,
            options,
            unserializable,
            session_id,
            run_id,
            end_user_id,
            persist_messages,
            variables,
            memory,
            files,
            file_params,
            host_context_ms,
        })
    }

    /// What the run needs before the rest of this request (see [`RunHead`]).
    pub fn head(&self) -> RunHead {
        RunHead {
            flow_id: self.flow_id.clone(),
            session_id: self.session_id.clone(),
            mode: self.mode(),
            files: self.files.clone(),
            asked: asked_variables(&self.flow),
        }
    }

    /// The values the host resolved for fields that load from global variables (credentials
    /// among them), to be masked in whatever the host logs or raises from the guest's output.
    pub fn secrets(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let mut stack: Vec<&Value> = self
            .variables
            .values()
            .filter_map(|v| v.get("params"))
            .collect();
        while let Some(v) = stack.pop() {
            match v {
                Value::String(s) => out.push(s.as_str()),
                Value::Array(a) => stack.extend(a),
                Value::Object(m) => stack.extend(m.values()),
                _ => {}
            }
        }
        out
    }

    /// The chat history the guest gets, oldest first, and the note saying what was left out
    /// (the newest [`MAX_HISTORY_MESSAGES`] messages within [`MAX_HISTORY_BYTES`] are kept).
    pub fn history_window(&self) -> Option<(Vec<Value>, Option<String>)> {
        let history = self.memory.as_ref()?;
        let mut kept = Vec::new();
        let mut bytes = 0usize;
        for message in &history.messages {
            let size = serde_json::to_string(message).map_or(usize::MAX, |t| t.len());
            if kept.len() == MAX_HISTORY_MESSAGES || bytes.saturating_add(size) > MAX_HISTORY_BYTES
            {
                break;
            }
            bytes += size;
            kept.push(message.clone());
        }
        let cut = kept.len() < history.messages.len() || history.more;
        kept.reverse();
        let note = cut.then(|| {
            format!(
                "the chat history of session {:?} was cut: only its newest {} messages ({} \
                 bytes) were sent to the guest (the executor sends at most \
                 MAX_HISTORY_MESSAGES={MAX_HISTORY_MESSAGES} messages and \
                 MAX_HISTORY_BYTES={MAX_HISTORY_BYTES} bytes of history); a component that \
                 reads older messages does not see them",
                self.session_id.as_deref().unwrap_or(""),
                kept.len(),
                bytes
            )
        });
        Some((kept, note))
    }

    /// Checks the uploaded files against [`MAX_FILES`] and [`MAX_FILE_BYTES`] and reads them
    /// (see [`read_files`]).
    pub async fn read_files(&self) -> Result<Vec<(String, bytes::Bytes)>, String> {
        read_files(&self.files).await
    }

    /// The mode the caller asked for: the legacy passthrough when `_use_arun_legacy` is set.
    pub fn mode(&self) -> Mode {
        mode_of(&self.options)
    }

    /// The job document for the runner. `install` is the pip requirements the runner installs
    /// when lfx is missing (empty: no fallback).
    pub fn job(&self, install: &[String]) -> Value {
        let mode = self.mode();
        for name in &self.unserializable {
            tracing::debug!(
                target: LOG_TARGET,
                option = %name,
                "runtime option is not JSON-serializable and stays on the host"
            );
        }
        let mut options = Map::new();
        for (k, v) in &self.options {
            if k.starts_with('_') {
                continue;
            }
            if HOST_ONLY_OPTIONS.contains(&k.as_str()) {
                if !v.is_null() {
                    tracing::debug!(
                        target: LOG_TARGET,
                        option = %k,
                        "runtime option belongs to the host process; not forwarded to the guest"
                    );
                }
                continue;
            }
            options.insert(k.clone(), v.clone());
        }
        let mut inputs = self.inputs.clone();
        match mode {
            Mode::Stream => {
                // lfx run / serve / Loop put the caller's input in `initial_inputs`; Graph.arun
                // callers in `inputs`. A streaming run reads the former: normalize.
                let missing = options.get("initial_inputs").is_none_or(Value::is_null);
                if missing && let Some(Value::Object(first)) = inputs.first() {
                    let keep: Map<String, Value> = first
                        .iter()
                        .filter(|(k, _)| {
                            matches!(
                                k.as_str(),
                                "input_value" | "components" | "session" | "type"
                            )
                        })
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    options.insert(
                        "initial_inputs".to_owned(),
                        json!({"__lfx__": INPUT_VALUE_REQUEST, "v": keep}),
                    );
                }
            }
            Mode::Legacy => {
                if inputs.is_empty()
                    && let Some(iv) = options.get("initial_inputs")
                    && let Some(value) = iv.get("v").and_then(|v| v.get("input_value"))
                    && !value.is_null()
                {
                    inputs.push(json!({"input_value": value}));
                }
                options.remove("initial_inputs");
            }
        }
        let memory = self.history_window().map(|(history, note)| {
            if let Some(note) = &note {
                tracing::warn!(target: LOG_TARGET, "{note}");
            }
            json!({"history": history, "note": note})
        });
        json!({
            "protocol": PROTOCOL,
            "mode": mode.as_str(),
            "flow": self.flow,
            "flow_id": self.flow_id,
            "flow_name": self.flow_name,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "end_user_id": self.end_user_id,
            "persist_messages": self.persist_messages,
            "inputs": inputs,
            "options": options,
            "install": install,
            "variables": self.variables,
            "memory": memory,
            "files": self.file_params,
        })
    }
}

/// Checks `files` against [`MAX_FILES`] and [`MAX_FILE_BYTES`] and reads them. A refusal (over
/// a bound, not a regular file, unreadable) says which file and why; nothing has been sent
/// anywhere when it happens.
pub async fn read_files(files: &[HostFile]) -> Result<Vec<(String, bytes::Bytes)>, String> {
    use tokio::io::AsyncReadExt as _;
    let fix = "upload fewer or smaller files for this flow, or run it in-process (unset \
               LANGFLOW_EXECUTOR_KIND)";
    if files.len() > MAX_FILES {
        return Err(format!(
            "the flow's file inputs read {} uploaded files; the executor sends at most \
             MAX_FILES={MAX_FILES} to a guest. Nothing was created: {fix}",
            files.len()
        ));
    }
    let mut total = 0u64;
    let mut sized = Vec::with_capacity(files.len());
    for f in files {
        let meta = tokio::fs::metadata(&f.host_path)
            .await
            .map_err(|e| format!("{}: cannot read {}: {e}", f.component, describe(f)))?;
        if !meta.is_file() {
            return Err(format!(
                "{}: {} is not a regular file",
                f.component,
                describe(f)
            ));
        }
        total = total.saturating_add(meta.len());
        if total > MAX_FILE_BYTES {
            return Err(format!(
                "{}: the flow's uploaded files come to more than {MAX_FILE_BYTES} bytes \
                 with {} ({} bytes); the executor sends at most \
                 MAX_FILE_BYTES={MAX_FILE_BYTES} bytes of files to a guest. Nothing was \
                 created: {fix}",
                f.component,
                describe(f),
                meta.len()
            ));
        }
        sized.push((f, meta.len()));
    }
    let mut out = Vec::with_capacity(sized.len());
    for (f, size) in sized {
        let file = tokio::fs::File::open(&f.host_path)
            .await
            .map_err(|e| format!("{}: cannot read {}: {e}", f.component, describe(f)))?;
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        // A file that grew since it was measured is read no further than its size.
        file.take(size)
            .read_to_end(&mut data)
            .await
            .map_err(|e| format!("{}: cannot read {}: {e}", f.component, describe(f)))?;
        out.push((f.guest_path.clone(), bytes::Bytes::from(data)));
    }
    Ok(out)
}

/// A file of the request: its guest path must stay under [`FILES_DIR`].
fn host_file(v: &Value) -> Result<HostFile, String> {
    let field = |k: &str| v.get(k).and_then(Value::as_str);
    let (Some(host), Some(guest)) = (field("host_path"), field("guest_path")) else {
        return Err("a file without `host_path` and `guest_path`".to_owned());
    };
    let rest = guest.strip_prefix(FILES_DIR).unwrap_or("");
    let safe = !rest.is_empty()
        && rest
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && !rest.contains(['\\', '\0']);
    if !safe {
        return Err(format!(
            "a file's guest path is not a plain path under {FILES_DIR}"
        ));
    }
    Ok(HostFile {
        host_path: PathBuf::from(host),
        guest_path: guest.to_owned(),
        component: field("component").unwrap_or("a file input").to_owned(),
    })
}

/// A file as a refusal names it: its name, not its host path.
fn describe(f: &HostFile) -> String {
    let name = f.guest_path.rsplit('/').next().unwrap_or_default();
    format!("the uploaded file {name:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_flow_field_input_or_option_value() {
        let secret = "sk-flow-secret-8d2c";
        let r = FlowRequest::from_json(
            &json!({
                "flow": {"data": {"nodes": [{"id": "A", "data": {"node": {"template":
                    {"api_key": {"value": secret}}}}}], "edges": []}},
                "flow_id": "f-1",
                "inputs": [{"input_value": secret}],
                "options": {"stream": false, "token": secret},
            })
            .to_string(),
        )
        .unwrap();
        for text in [format!("{r:?}"), format!("{r:#?}")] {
            assert!(!text.contains(secret), "{text}");
            assert!(text.contains("f-1") && text.contains("token"), "{text}");
        }
    }

    /// Issue 45: a table column that loads from a global variable asks for each cell's name,
    /// as lfx resolves it, so a withheld name in a cell is refused like a field's.
    #[test]
    fn table_cells_of_a_load_from_db_column_are_asked_variables() {
        let flow = json!({"data": {"nodes": [{"id": "T", "data": {"node": {
            "display_name": "Headers", "template": {"headers": {
                "table_schema": [{"name": "key"}, {"name": "value", "load_from_db": true}],
                "value": [
                    {"key": "a", "value": "CREATEOS_SANDBOX_BASE_URL"},
                    {"key": "b", "value": "OPEN_SANDBOX_DOMAIN",
                     "__load_from_db_fields": {"value": false}},
                    {"key": "c", "value": "CREATEOS_GATEWAY_URL",
                     "__load_from_db_fields": ["value"]},
                    {"key": "d", "value": "MY_OWN", "__load_from_db_fields": []},
                    {"key": "e", "value": ""},
                ]}}}}}], "edges": []}});
        let asked = asked_variables(&flow);
        let names: Vec<(&str, &str)> = asked
            .iter()
            .map(|a| (a.field.as_str(), a.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("headers[0].value", "CREATEOS_SANDBOX_BASE_URL"),
                ("headers[2].value", "CREATEOS_GATEWAY_URL"),
            ]
        );
        assert_eq!(
            asked[0].describe(),
            "the field `headers[0].value` of Headers (vertex `T`)"
        );
    }

    #[allow(clippy::needless_pass_by_value)]
    fn request(inputs: Value, options: Value) -> FlowRequest {
        FlowRequest::from_json(
            &json!({"flow": {"data": {"nodes": [], "edges": []}}, "inputs": inputs,
                    "options": options, "unserializable": ["callbacks"]})
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn legacy_keeps_inputs_and_forwards_options_but_host_only_ones() {
        let r = request(
            json!([{"input_value": "hi"}]),
            json!({"_use_arun_legacy": true, "outputs": ["chat_out"], "stream": false,
                   "session_id": "s1", "event_manager": null, "fallback_to_env_vars": true}),
        );
        assert_eq!(r.mode(), Mode::Legacy);
        let job = r.job(&[]);
        assert_eq!(job["mode"], "legacy");
        assert_eq!(job["inputs"], json!([{"input_value": "hi"}]));
        let opts = job["options"].as_object().unwrap();
        assert_eq!(opts["outputs"], json!(["chat_out"]));
        assert_eq!(opts["fallback_to_env_vars"], json!(true));
        // The chat session reaches the guest (Graph._arun_legacy sets it on the graph).
        assert_eq!(opts["session_id"], json!("s1"));
        for gone in ["_use_arun_legacy", "event_manager", "callbacks"] {
            assert!(!opts.contains_key(gone), "{gone}");
        }
        assert_eq!(job["protocol"], json!(PROTOCOL));
    }

    #[test]
    fn stream_reads_initial_inputs_and_normalizes_seam_inputs() {
        let tagged = json!({"__lfx__": "InputValueRequest", "v": {"input_value": "x"}});
        let r = request(
            json!([]),
            json!({"initial_inputs": tagged, "max_iterations": 3}),
        );
        assert_eq!(r.mode(), Mode::Stream);
        let job = r.job(&[]);
        assert_eq!(job["options"]["initial_inputs"], tagged);
        assert_eq!(job["options"]["max_iterations"], json!(3));
        // Seam inputs only: they become the streaming run's initial inputs.
        let r = request(json!([{"input_value": "y", "junk": 1}]), json!({}));
        let job = r.job(&[]);
        assert_eq!(
            job["options"]["initial_inputs"],
            json!({"__lfx__": "InputValueRequest", "v": {"input_value": "y"}})
        );
    }

    #[test]
    fn legacy_without_inputs_takes_the_initial_input() {
        let tagged = json!({"__lfx__": "InputValueRequest", "v": {"input_value": "z"}});
        let r = request(
            json!([]),
            json!({"_use_arun_legacy": true, "initial_inputs": tagged}),
        );
        let job = r.job(&["lfx==1.13.0".to_owned()]);
        assert_eq!(job["inputs"], json!([{"input_value": "z"}]));
        assert!(job["options"].get("initial_inputs").is_none());
        assert_eq!(job["install"], json!(["lfx==1.13.0"]));
    }

    #[allow(clippy::needless_pass_by_value)]
    fn with(extra: Value) -> FlowRequest {
        let mut doc = json!({"flow": {"data": {"nodes": [], "edges": []}}});
        doc.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        FlowRequest::from_json(&doc.to_string()).unwrap()
    }

    fn message(i: usize, pad: usize) -> Value {
        json!({"text": format!("m{i} {}", "x".repeat(pad)), "sender": "User", "session_id": "s"})
    }

    #[test]
    fn the_run_context_and_resolved_values_travel_in_the_job() {
        let secret = "sk-variable-secret-51c9";
        let r = with(json!({
            "session_id": "s-7", "run_id": "r-1", "end_user_id": null,
            "persist_messages": false,
            "variables": {
                "A": {"params": {"api_key": secret, "table": [{"k": "tbl-secret-93"}]}},
                "B": {"error": {"type": "VariableNotFoundError", "base": "ValueError",
                                "message": "MISSING variable not found."}}
            },
            "file_params": {"F": {"path": ["/workspace/lfx_files/0/a.txt"]}},
        }));
        let job = r.job(&[]);
        assert_eq!(job["session_id"], "s-7");
        assert_eq!(job["run_id"], "r-1");
        assert_eq!(job["persist_messages"], false);
        assert_eq!(job["variables"]["A"]["params"]["api_key"], secret);
        assert_eq!(job["variables"]["B"]["error"]["base"], "ValueError");
        assert_eq!(job["files"]["F"]["path"][0], "/workspace/lfx_files/0/a.txt");
        // No message store on the host: the guest keeps lfx's own.
        assert!(job["memory"].is_null());
        let mut secrets = r.secrets();
        secrets.sort_unstable();
        assert_eq!(secrets, [secret, "tbl-secret-93"]);
        for text in [format!("{r:?}"), format!("{r:#?}")] {
            assert!(
                !text.contains(secret) && !text.contains("tbl-secret"),
                "{text}"
            );
        }
    }

    #[test]
    fn history_within_the_bounds_is_sent_whole_oldest_first() {
        let newest_first: Vec<Value> = (0..3).rev().map(|i| message(i, 10)).collect();
        let r =
            with(json!({"session_id": "s", "memory": {"history": newest_first, "more": false}}));
        let job = r.job(&[]);
        let texts: Vec<&str> = job["memory"]["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), 3);
        assert!(
            texts[0].starts_with("m0 ") && texts[2].starts_with("m2 "),
            "{texts:?}"
        );
        assert!(job["memory"]["note"].is_null());
    }

    #[test]
    fn history_above_the_bounds_is_cut_to_the_newest_with_a_note() {
        // More messages than the bound: the newest MAX_HISTORY_MESSAGES are kept.
        let n = MAX_HISTORY_MESSAGES + 20;
        let newest_first: Vec<Value> = (0..n).rev().map(|i| message(i, 0)).collect();
        let r = with(json!({"session_id": "s-9", "memory": {"history": newest_first}}));
        let (kept, note) = r.history_window().unwrap();
        assert_eq!(kept.len(), MAX_HISTORY_MESSAGES);
        assert_eq!(kept[0]["text"], format!("m{} ", n - MAX_HISTORY_MESSAGES));
        assert_eq!(kept.last().unwrap()["text"], format!("m{} ", n - 1));
        let note = note.unwrap();
        assert!(
            note.contains("MAX_HISTORY_MESSAGES=500") && note.contains("\"s-9\""),
            "{note}"
        );
        assert_eq!(r.job(&[])["memory"]["note"], json!(note));

        // More bytes than the bound: fewer, newest messages.
        let pad = MAX_HISTORY_BYTES / 10;
        let newest_first: Vec<Value> = (0..20).rev().map(|i| message(i, pad)).collect();
        let r = with(json!({"memory": {"history": newest_first}}));
        let (kept, note) = r.history_window().unwrap();
        assert_eq!(kept.len(), 9, "nine of about a tenth of the bound each");
        assert!(
            kept.last().unwrap()["text"]
                .as_str()
                .unwrap()
                .starts_with("m19 ")
        );
        assert!(note.unwrap().contains("MAX_HISTORY_BYTES"));

        // The store said it had more than the host asked for: still a note.
        let r = with(json!({"memory": {"history": [message(1, 0)], "more": true}}));
        let (kept, note) = r.history_window().unwrap();
        assert_eq!(kept.len(), 1);
        assert!(note.is_some());
    }

    #[tokio::test]
    async fn files_over_the_bounds_are_refused_before_anything_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.txt");
        std::fs::write(&small, b"hello").unwrap();
        let big = dir.path().join("big.bin");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_FILE_BYTES)
            .unwrap();
        let file = |host: &std::path::Path, i: usize, name: &str| {
            json!({"host_path": host, "guest_path": format!("{FILES_DIR}{i}/{name}"),
                   "component": "File"})
        };
        let r = with(json!({"files": [file(&small, 0, "small.txt")]}));
        let read = r.read_files().await.unwrap();
        assert_eq!(
            read,
            [(
                format!("{FILES_DIR}0/small.txt"),
                bytes::Bytes::from_static(b"hello")
            )]
        );

        let r = with(json!({"files": [file(&small, 0, "small.txt"), file(&big, 1, "big.bin")]}));
        let err = r.read_files().await.unwrap_err();
        assert!(
            err.contains("MAX_FILE_BYTES=67108864") && err.contains("\"big.bin\""),
            "{err}"
        );
        assert!(
            err.starts_with("File: ") && !err.contains(dir.path().to_str().unwrap()),
            "{err}"
        );

        let many: Vec<Value> = (0..=MAX_FILES).map(|i| file(&small, i, "s.txt")).collect();
        let err = with(json!({"files": many})).read_files().await.unwrap_err();
        assert!(err.contains("MAX_FILES=32"), "{err}");

        let err = with(json!({"files": [file(dir.path(), 0, "d")]}))
            .read_files()
            .await;
        assert!(err.unwrap_err().contains("not a regular file"));
    }

    #[test]
    fn guest_file_paths_stay_under_the_files_directory() {
        for bad in [
            "/workspace/lfx_job.json",
            "/workspace/lfx_files/",
            "/workspace/lfx_files/../lfx_runner.py",
            "/workspace/lfx_files/0//x",
            "/workspace/lfx_files/./x",
            "relative/x",
        ] {
            let doc = json!({"flow": {}, "files": [{"host_path": "/x", "guest_path": bad}]});
            assert!(FlowRequest::from_json(&doc.to_string()).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        for bad in [
            "[]",
            "{}",
            r#"{"flow": 1}"#,
            r#"{"flow": {}, "inputs": 3}"#,
            r#"{"flow": {}, "variables": []}"#,
            r#"{"flow": {}, "memory": {"history": 1}}"#,
            r#"{"flow": {}, "files": {}}"#,
            "nope",
        ] {
            assert!(FlowRequest::from_json(bad).is_err(), "{bad}");
        }
    }
}
