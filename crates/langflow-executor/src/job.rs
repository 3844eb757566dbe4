//! What one flow run sends to the guest: the job document the runner reads.
//!
//! The caller (the Python glue) hands over a request: the flow's `Graph.dump`, the seam's
//! `inputs`, and the `runtime_options` it could convert to JSON (plus the names of those it
//! could not). This module decides what crosses the boundary: which mode the guest runs
//! (`Graph.arun`'s legacy passthrough or the streaming path), where the inputs live, and which
//! options are forwarded or dropped.

use sandbox_core::LOG_TARGET;
use serde_json::{Map, Value, json};

use crate::runner::PROTOCOL;

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
pub const HOST_ONLY_OPTIONS: &[&str] = &["event_manager", "session_id", "open_flow_span"];
/// The legacy flag (reserved `_` keys are otherwise never forwarded).
pub const LEGACY_FLAG: &str = "_use_arun_legacy";
/// The tag of an lfx `InputValueRequest` converted to JSON.
pub const INPUT_VALUE_REQUEST: &str = "InputValueRequest";

/// A run request, as the glue converted it. `Debug` shows ids, names and counts, never the
/// flow, the inputs or option values (a flow's component fields and inputs may carry keys).
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
            .finish()
    }
}

impl FlowRequest {
    /// Parses the request document the glue sends: `{"flow", "flow_id"?, "flow_name"?,
    /// "user_id"?, "inputs"?, "options"?, "unserializable"?}`.
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
        Ok(Self {
            flow,
            flow_id,
            flow_name,
            user_id,
            inputs,
            options,
            unserializable,
        })
    }

    /// The mode the caller asked for: the legacy passthrough when `_use_arun_legacy` is set.
    pub fn mode(&self) -> Mode {
        match self.options.get(LEGACY_FLAG) {
            Some(Value::Bool(true)) => Mode::Legacy,
            _ => Mode::Stream,
        }
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
        json!({
            "protocol": PROTOCOL,
            "mode": mode.as_str(),
            "flow": self.flow,
            "flow_id": self.flow_id,
            "flow_name": self.flow_name,
            "user_id": self.user_id,
            "inputs": inputs,
            "options": options,
            "install": install,
        })
    }
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
        for gone in [
            "_use_arun_legacy",
            "session_id",
            "event_manager",
            "callbacks",
        ] {
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

    #[test]
    fn bad_requests_are_refused() {
        for bad in [
            "[]",
            "{}",
            r#"{"flow": 1}"#,
            r#"{"flow": {}, "inputs": 3}"#,
            "nope",
        ] {
            assert!(FlowRequest::from_json(bad).is_err(), "{bad}");
        }
    }
}
