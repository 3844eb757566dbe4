//! What configures the plugin never reaches a flow's guest: the executor's checks of a run
//! against [`sandbox_core::withheld`].
//!
//! Twice for names, once for values, and always before anything of the flow is sent:
//!
//! - the variables the flow's fields ask for (the head's list, known before any guest exists;
//!   and again from the flow's own `Graph.dump`, which is what the guest would rebuild):
//!   a withheld name refuses the run whether or not the host resolved a value for it;
//! - every text of the request and every uploaded file: a withheld value refuses the run, and
//!   the refusal says where it sat, never what it is. What the host resolved or read (the
//!   values of the flow's variables, the chat history, the files' parameters and contents) is
//!   looked at as [`Source::Host`]; what the author wrote or the caller typed (the flow's
//!   definition, the inputs, the options, the ids) as [`Source::Author`], so that a word list
//!   in a node's code answers no guess at a store password and a flow that mentions a
//!   word-like password is not refused (issue 45).

use sandbox_core::withheld::{self, Source, Withheld};
use serde_json::Value;

use crate::error::ExecutorError;
use crate::job::{AskedVariable, FlowRequest};

/// Refuses a run one of whose fields asks for a withheld variable name.
pub fn refuse_asked(asked: &[AskedVariable]) -> Result<(), ExecutorError> {
    match asked.iter().find(|a| withheld::is_withheld_name(&a.name)) {
        Some(a) => Err(withheld::refuse_name(&a.describe(), &a.name).into()),
        None => Ok(()),
    }
}

/// Refuses a request that names a withheld variable (from its flow's dump) or holds a
/// withheld value anywhere it would send to the guest.
pub fn check_request(request: &FlowRequest, withheld: &Withheld) -> Result<(), ExecutorError> {
    refuse_asked(&crate::job::asked_variables(&request.flow))?;
    if withheld.is_empty() {
        return Ok(());
    }
    find_in(
        Source::Author,
        "the flow's definition",
        &request.flow,
        withheld,
    )?;
    for (i, input) in request.inputs.iter().enumerate() {
        find_in(Source::Author, &format!("inputs[{i}]"), input, withheld)?;
    }
    for (key, value) in &request.options {
        find_text(
            Source::Author,
            &format!("runtime option `{}`", escaped(key)),
            key,
            withheld,
        )?;
        find_in(
            Source::Author,
            &format!("options.{}", escaped(key)),
            value,
            withheld,
        )?;
    }
    for (vertex, entry) in &request.variables {
        let place = |field: &str| {
            format!(
                "the value the host resolved for the field `{}` of vertex `{}`",
                escaped(field),
                escaped(vertex)
            )
        };
        match entry.get("params") {
            Some(Value::Object(params)) => {
                for (field, value) in params {
                    if let Some(found) = first_in(Source::Host, value, withheld) {
                        return Err(withheld::refuse_value(&place(field), found).into());
                    }
                }
            }
            Some(other) => find_in(
                Source::Host,
                &format!("variables.{}", escaped(vertex)),
                other,
                withheld,
            )?,
            None => {}
        }
        if let Some(error) = entry.get("error") {
            find_in(
                Source::Host,
                &format!("the variable error of vertex `{}`", escaped(vertex)),
                error,
                withheld,
            )?;
        }
    }
    if let Some(memory) = &request.memory {
        for message in &memory.messages {
            find_in(
                Source::Host,
                "a message of the session's chat history",
                message,
                withheld,
            )?;
        }
    }
    find_in(
        Source::Host,
        "the flow's file inputs",
        &Value::Object(request.file_params.clone()),
        withheld,
    )?;
    for (place, text) in [
        ("the flow's id", request.flow_id.as_deref()),
        ("the flow's name", request.flow_name.as_deref()),
        ("the user id", request.user_id.as_deref()),
        ("the session id", request.session_id.as_deref()),
        ("the run id", request.run_id.as_deref()),
        ("the end user id", request.end_user_id.as_deref()),
    ] {
        if let Some(text) = text {
            find_text(Source::Author, place, text, withheld)?;
        }
    }
    Ok(())
}

/// Refuses uploaded files (guest path, contents) one of which holds a withheld value.
pub fn check_files(
    files: &[(String, bytes::Bytes)],
    components: &[crate::job::HostFile],
    withheld: &Withheld,
) -> Result<(), ExecutorError> {
    for (path, data) in files {
        if let Some(found) = withheld.find_bytes(data) {
            let component = components
                .iter()
                .find(|f| &f.guest_path == path)
                .map_or("a component", |f| f.component.as_str());
            return Err(withheld::refuse_value(
                &format!("the uploaded file a file input of {component} reads"),
                found,
            )
            .into());
        }
    }
    Ok(())
}

fn find_text(
    source: Source,
    place: &str,
    text: &str,
    withheld: &Withheld,
) -> Result<(), ExecutorError> {
    match withheld.find_in(source, text) {
        Some(found) => Err(withheld::refuse_value(place, found).into()),
        None => Ok(()),
    }
}

/// Refuses `value` when one of its strings (keys included) holds a withheld value; `place`
/// names the part of the request, and the path inside it is added. The path is worked out only
/// for a value that holds one (the common case walks the tree once, building nothing).
fn find_in(
    source: Source,
    place: &str,
    value: &Value,
    withheld: &Withheld,
) -> Result<(), ExecutorError> {
    let Some(found) = first_in(source, value, withheld) else {
        return Ok(());
    };
    let path = path_to(source, value, withheld).unwrap_or_default();
    let at = if path.is_empty() {
        place.to_owned()
    } else {
        format!("{place} (at {})", escaped(path.trim_start_matches('.')))
    };
    Err(withheld::refuse_value(&at, found).into())
}

/// The path (`.key[3].field`) of the first string of `value` that holds a withheld value.
fn path_to(source: Source, value: &Value, withheld: &Withheld) -> Option<String> {
    let mut stack: Vec<(String, &Value)> = vec![(String::new(), value)];
    while let Some((path, v)) = stack.pop() {
        match v {
            Value::String(s) if withheld.find_in(source, s).is_some() => return Some(path),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    stack.push((format!("{path}[{i}]"), item));
                }
            }
            Value::Object(map) => {
                for (k, item) in map {
                    let inner = format!("{path}.{k}");
                    if withheld.find_in(source, k).is_some() {
                        return Some(inner);
                    }
                    stack.push((inner, item));
                }
            }
            _ => {}
        }
    }
    None
}

/// The first withheld value any string of `value` holds.
fn first_in(source: Source, value: &Value, withheld: &Withheld) -> Option<withheld::Found> {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => {
                if let Some(found) = withheld.find_in(source, s) {
                    return Some(found);
                }
            }
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                for (k, item) in map {
                    if let Some(found) = withheld.find_in(source, k) {
                        return Some(found);
                    }
                    stack.push(item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    None
}

/// A name or path from the flow, fit for a message (escaped, cut).
fn escaped(text: &str) -> String {
    let shown = withheld::shown(text);
    shown[1..shown.len() - 1].to_owned()
}
