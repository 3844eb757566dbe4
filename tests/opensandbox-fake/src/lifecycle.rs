//! The lifecycle API handlers (`/v1/sandboxes...`, `/v1/snapshots...`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use time::OffsetDateTime;

use crate::config::{EgressMode, NetworkMode, Runtime, SecureRuntime};
use crate::execd::Guest;
use crate::http::{ApiError, Res, empty, json_response, ok, q, q_all, text};
use crate::state::{App, Sandbox, SnapState, Snapshot, State};
use crate::util::{
    hex_id, is_label_key, is_label_value, parse_metadata_filter, parse_rfc3339, rfc3339, uuid4,
};

/// The prefix reserved for the server's own labels.
const RESERVED_PREFIX: &str = "opensandbox.io/";

fn not_found(app: &App, id: &str) -> ApiError {
    let ns = app.config().ns();
    ApiError::new(
        404,
        &format!("{ns}::SANDBOX_NOT_FOUND"),
        format!("Sandbox {id} not found."),
    )
}

fn value_error(msg: &str, input: &Value) -> ApiError {
    ApiError::validation(
        "value_error",
        &["body"],
        format!("Value error, {msg}"),
        input,
    )
}

/// Parses a JSON body as `FastAPI` does: malformed JSON is a 422 `json_invalid`.
pub(crate) fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::validation(
            "missing",
            &["body"],
            "Field required",
            &Value::Null,
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::validation(
            "json_invalid",
            &["body", "0"],
            format!("JSON decode error: {e}"),
            &json!({}),
        )
    })
}

/// A `Dict[str, str]` field (absent or null: `None`).
fn str_map(
    body: &Map<String, Value>,
    field: &str,
    nullable_values: bool,
) -> Result<Option<BTreeMap<String, String>>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            let mut out = BTreeMap::new();
            for (k, v) in m {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    Value::Null if nullable_values => {}
                    other => {
                        return Err(ApiError::validation(
                            "string_type",
                            &["body", field, k],
                            "Input should be a valid string",
                            other,
                        ));
                    }
                }
            }
            Ok(Some(out))
        }
        Some(other) => Err(ApiError::validation(
            "dict_type",
            &["body", field],
            "Input should be a valid dictionary",
            other,
        )),
    }
}

fn opt_str(body: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::validation(
            "string_type",
            &["body", field],
            "Input should be a valid string",
            other,
        )),
    }
}

/// Checks metadata against the Kubernetes label rules and the reserved prefix.
fn check_labels(meta: &BTreeMap<String, String>) -> Result<(), ApiError> {
    for (k, v) in meta {
        if k.starts_with(RESERVED_PREFIX) {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_METADATA_LABEL",
                format!(
                    "Metadata key '{k}' uses the reserved prefix '{RESERVED_PREFIX}'. Keys under \
                     this prefix are managed by the system and cannot be set via metadata."
                ),
            ));
        }
        if !is_label_key(k) {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_METADATA_LABEL",
                format!(
                    "Metadata key '{k}' is invalid: must be either a name or a DNS-subdomain \
                     prefix and name separated by /, where the name is up to 63 characters and \
                     matches [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, and the optional prefix is \
                     a valid DNS subdomain up to 253 characters."
                ),
            ));
        }
        if !is_label_value(v) {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_METADATA_LABEL",
                format!(
                    "Metadata value '{v}' is invalid: must be 63 characters or less, start/end \
                     with an alphanumeric character, and contain only alphanumeric, '-', '_', or \
                     '.' characters."
                ),
            ));
        }
    }
    Ok(())
}

/// Validates a `networkPolicy` (pydantic shape) and returns it normalised
/// (`defaultAction` filled in as `deny`, `egress` as a list).
fn parse_policy(v: &Value, loc: &[&str]) -> Result<Value, ApiError> {
    let Value::Object(m) = v else {
        return Err(ApiError::validation(
            "model_attributes_type",
            loc,
            "Input should be a valid dictionary or object to extract fields from",
            v,
        ));
    };
    let default = match m.get("defaultAction") {
        None | Some(Value::Null) => "deny".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ApiError::validation(
                "string_type",
                &[loc, &["defaultAction"]].concat(),
                "Input should be a valid string",
                other,
            ));
        }
    };
    let mut rules = Vec::new();
    match m.get("egress") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, r) in a.iter().enumerate() {
                let idx = i.to_string();
                let action = r.get("action").and_then(Value::as_str);
                let target = r.get("target").and_then(Value::as_str);
                match (action, target) {
                    (Some(a), Some(t)) if !t.is_empty() => {
                        rules.push(json!({"action": a, "target": t}));
                    }
                    (_, Some("")) => {
                        return Err(ApiError::validation(
                            "string_too_short",
                            &[loc, &["egress", &idx, "target"]].concat(),
                            "String should have at least 1 character",
                            &json!(""),
                        ));
                    }
                    _ => {
                        return Err(ApiError::validation(
                            "missing",
                            &[loc, &["egress", &idx]].concat(),
                            "Field required",
                            r,
                        ));
                    }
                }
            }
        }
        Some(other) => {
            return Err(ApiError::validation(
                "list_type",
                &[loc, &["egress"]].concat(),
                "Input should be a valid list",
                other,
            ));
        }
    }
    Ok(json!({"defaultAction": default, "egress": rules}))
}

/// A float without a fraction and well inside the `i64` range (pydantic's lax int mode).
#[allow(clippy::cast_possible_truncation)]
fn whole_number(f: f64) -> i64 {
    f as i64
}

/// `POST /sandboxes`.
pub(crate) fn create(app: &Arc<App>, bytes: &[u8]) -> Res {
    let cfg = app.config();
    let ns = cfg.ns();
    let input = parse_body(bytes)?;
    let Value::Object(body) = &input else {
        return Err(ApiError::validation(
            "model_attributes_type",
            &["body"],
            "Input should be a valid dictionary or object to extract fields from",
            &input,
        ));
    };
    // Field shapes (pydantic).
    let image = match body.get("image") {
        None | Some(Value::Null) => None,
        Some(Value::Object(i)) => match i.get("uri") {
            Some(Value::String(u)) => Some(u.clone()),
            Some(other) => {
                return Err(ApiError::validation(
                    "string_type",
                    &["body", "image", "uri"],
                    "Input should be a valid string",
                    other,
                ));
            }
            None => {
                return Err(ApiError::validation(
                    "missing",
                    &["body", "image", "uri"],
                    "Field required",
                    &Value::Object(i.clone()),
                ));
            }
        },
        Some(other) => {
            return Err(ApiError::validation(
                "model_attributes_type",
                &["body", "image"],
                "Input should be a valid dictionary or object to extract fields from",
                other,
            ));
        }
    };
    let snapshot_id = opt_str(body, "snapshotId")?;
    let timeout = match body.get("timeout") {
        None | Some(Value::Null) => None,
        Some(t) => {
            let n = t.as_i64().or_else(|| {
                t.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(whole_number)
            });
            let Some(n) = n else {
                return Err(ApiError::validation(
                    "int_type",
                    &["body", "timeout"],
                    "Input should be a valid integer",
                    t,
                ));
            };
            if n < 60 {
                return Err(ApiError {
                    status: 422,
                    body: json!({"detail": [{
                        "type": "greater_than_equal",
                        "loc": ["body", "timeout"],
                        "msg": "Input should be greater than or equal to 60",
                        "input": t,
                        "ctx": {"ge": 60},
                    }]}),
                });
            }
            Some(n)
        }
    };
    let resource_limits = str_map(body, "resourceLimits", false)?;
    let env = str_map(body, "env", true)?;
    let metadata = str_map(body, "metadata", false)?.unwrap_or_default();
    let extensions = str_map(body, "extensions", false)?.unwrap_or_default();
    let entrypoint = match body.get("entrypoint") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => {
            if a.is_empty() {
                return Err(ApiError::validation(
                    "too_short",
                    &["body", "entrypoint"],
                    "List should have at least 1 item after validation, not 0",
                    &json!([]),
                ));
            }
            let mut out = Vec::new();
            for (i, x) in a.iter().enumerate() {
                let Some(s) = x.as_str() else {
                    return Err(ApiError::validation(
                        "string_type",
                        &["body", "entrypoint", &i.to_string()],
                        "Input should be a valid string",
                        x,
                    ));
                };
                out.push(s.to_owned());
            }
            Some(out)
        }
        Some(other) => {
            return Err(ApiError::validation(
                "list_type",
                &["body", "entrypoint"],
                "Input should be a valid list",
                other,
            ));
        }
    };
    let policy = match body.get("networkPolicy") {
        None | Some(Value::Null) => None,
        Some(p) => Some(parse_policy(p, &["body", "networkPolicy"])?),
    };
    let platform = match body.get("platform") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m))
            if m.get("os").is_some_and(Value::is_string)
                && m.get("arch").is_some_and(Value::is_string) =>
        {
            Some(json!({"os": m["os"], "arch": m["arch"]}))
        }
        Some(other) => {
            return Err(ApiError::validation(
                "missing",
                &["body", "platform"],
                "Field required",
                other,
            ));
        }
    };
    let credential_proxy = body
        .get("credentialProxy")
        .and_then(|c| c.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // Model validator.
    if let Some(t) = opt_str(body, "templateId")?.filter(|t| !t.trim().is_empty()) {
        return Err(ApiError::new(
            404,
            "FSB::TEMPLATE_NOT_FOUND",
            format!("Template {t} not found: this server has no fsb runtime."),
        ));
    }
    let pool_ref = extensions
        .get("poolRef")
        .is_some_and(|p| !p.trim().is_empty());
    if !pool_ref {
        if credential_proxy && policy.is_none() {
            return Err(value_error(
                "credentialProxy.enabled requires networkPolicy.",
                &input,
            ));
        }
        let has_image = image.as_deref().is_some_and(|u| !u.trim().is_empty());
        let has_snapshot = snapshot_id.as_deref().is_some_and(|s| !s.trim().is_empty());
        if has_image == has_snapshot {
            return Err(value_error(
                "Exactly one of image or snapshotId must be provided.",
                &input,
            ));
        }
        if has_image && entrypoint.is_none() {
            return Err(value_error(
                "Entrypoint is required when image is provided.",
                &input,
            ));
        }
        if resource_limits.is_none() {
            return Err(value_error(
                "resourceLimits is required when poolRef is not provided.",
                &input,
            ));
        }
    }
    // Service checks.
    if body.get("lifecycle").is_some_and(|l| !l.is_null()) && cfg.runtime == Runtime::Docker {
        return Err(ApiError::new(
            400,
            "SANDBOX::INVALID_PARAMETER",
            "lifecycle hooks are not supported by the Docker provider.",
        ));
    }
    if pool_ref && cfg.runtime == Runtime::Docker {
        return Err(ApiError::new(
            400,
            "SANDBOX::UNSUPPORTED_POOL_REF",
            "poolRef is not supported by the Docker provider. Use Kubernetes BatchSandbox provider instead.",
        ));
    }
    // Restore from a snapshot.
    let mut source_dir = None;
    let mut entrypoint = entrypoint;
    let mut image = image.filter(|u| !u.trim().is_empty());
    if let Some(sid) = snapshot_id.as_deref().filter(|s| !s.trim().is_empty()) {
        let inner = app.lock();
        let Some(snap) = inner.snapshots.iter().find(|s| s.id == sid) else {
            return Err(ApiError::new(
                404,
                "SNAPSHOT::NOT_FOUND",
                format!("Snapshot {sid} not found"),
            ));
        };
        if snap.state != SnapState::Ready {
            return Err(ApiError::new(
                409,
                "SNAPSHOT::NOT_READY",
                format!("Snapshot {sid} is not ready for restore."),
            ));
        }
        source_dir = Some(snap.dir.clone());
        if entrypoint.is_none() {
            entrypoint = Some(snap.entrypoint.clone());
        }
        image = None;
    }
    let entrypoint =
        entrypoint.unwrap_or_else(|| vec!["tail".into(), "-f".into(), "/dev/null".into()]);
    if entrypoint.first().is_none_or(String::is_empty) {
        return Err(ApiError::new(
            400,
            &format!("{ns}::INVALID_ENTRYPOINT"),
            "Entrypoint must contain at least one command.",
        ));
    }
    check_labels(&metadata)?;
    if let Some(t) = timeout
        && cfg.max_timeout_seconds > 0
        && u64::try_from(t).unwrap_or(u64::MAX) > cfg.max_timeout_seconds
    {
        return Err(ApiError::new(
            400,
            "SANDBOX::INVALID_PARAMETER",
            format!(
                "Sandbox timeout {t}s exceeds configured maximum of {}s.",
                cfg.max_timeout_seconds
            ),
        ));
    }
    if policy.is_some() {
        if cfg.runtime == Runtime::Docker && cfg.network_mode == NetworkMode::Host {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_PARAMETER",
                "networkPolicy is not supported when docker network_mode=host.",
            ));
        }
        if cfg.egress_mode == EgressMode::None {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_PARAMETER",
                "egress.image must be configured when networkPolicy is provided.",
            ));
        }
        if cfg.secure_runtime == SecureRuntime::Gvisor {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_PARAMETER",
                "networkPolicy is not compatible with runtime 'gvisor': gVisor does not support the iptables nat table required by the egress sidecar. Use a compatible runtime (e.g. kata) or remove networkPolicy.",
            ));
        }
    }
    // An image the server does not hold is pulled; here no registry has it. Docker pulls
    // inside the create and answers 500 (the message is the server's, around docker's own).
    // Kubernetes: the 1.1.1 create waits for the pod, OpenSandbox's controller marks the
    // BatchSandbox Failed as soon as its container waits in ErrImagePull, and the create
    // answers 500 KUBERNETES::POD_FAILED with the controller's summary, after deleting the
    // workload (server: kubernetes_service._wait_for_sandbox_ready; controller:
    // batchsandbox_status.go summarizePodFailures).
    if let Some(i) = image.as_deref().filter(|i| !cfg.holds_image(i)) {
        return Err(match cfg.runtime {
            Runtime::Docker => ApiError::new(
                500,
                "DOCKER::SANDBOX_IMAGE_PULL_FAILED",
                format!(
                    "Failed to pull image {i}: 404 Client Error for \
                     http+docker://localhost/v1.48/images/create?fromImage={i}: Not Found \
                     (\"pull access denied for {i}, repository does not exist or may require \
                     'docker login'\")"
                ),
            ),
            Runtime::Kubernetes => {
                let id = uuid4();
                ApiError::new(
                    500,
                    "KUBERNETES::POD_FAILED",
                    format!(
                        "Sandbox {id} failed: 1/1 observed pods failed; primary \
                         reason=ErrImagePull; sample pod={id}-0"
                    ),
                )
            }
        });
    }
    // Provision.
    let id = uuid4();
    let root = app.state_root.join("sandboxes").join(&id);
    if let Some(src) = &source_dir {
        copy_dir(src, &root).map_err(|e| {
            ApiError::new(
                500,
                &format!("{ns}::SANDBOX_START_FAILED"),
                format!("restoring the snapshot failed: {e}"),
            )
        })?;
    }
    let sandbox_env: BTreeMap<String, String> = env
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OPENSANDBOX_EGRESS_"))
        .collect();
    let guest = Guest::new_mapped(id.clone(), root, sandbox_env.clone(), app.host.clone())
        .map_err(|e| {
            ApiError::new(
                500,
                &format!("{ns}::SANDBOX_START_FAILED"),
                format!("creating the guest failed: {e}"),
            )
        })?;
    let now = OffsetDateTime::now_utc();
    let expires_at = timeout.map(|t| now + time::Duration::seconds(t));
    let sidecar = match &policy {
        Some(p) if !cfg.sidecar_absent => Some(crate::state::Sidecar {
            token: hex_id(32),
            policy: p.clone(),
        }),
        _ => None,
    };
    let (state, reason, message, due) = match cfg.runtime {
        Runtime::Docker => (
            State::Running,
            "CONTAINER_RUNNING",
            "Sandbox container is running.",
            None,
        ),
        Runtime::Kubernetes => (
            State::Pending,
            "POD_PENDING",
            "Sandbox is being provisioned.",
            Some(Instant::now() + Duration::from_millis(cfg.pending_ms)),
        ),
    };
    if state == State::Running {
        guest.not_ready_until(Some(
            Instant::now() + Duration::from_millis(cfg.execd_ready_ms),
        ));
    }
    let sb = Sandbox {
        id: id.clone(),
        state,
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_at: now,
        transition_due: due,
        image,
        snapshot_id: snapshot_id.filter(|s| !s.trim().is_empty()),
        entrypoint,
        env: sandbox_env,
        metadata,
        extensions,
        platform,
        resource_limits: resource_limits.unwrap_or_default(),
        created_at: now,
        expires_at,
        sidecar,
        guest: Arc::new(guest),
    };
    let answer = sb.to_create_json();
    let held = sb
        .sidecar
        .as_ref()
        .map_or(Value::Null, |s| s.policy.clone());
    let mut inner = app.lock();
    inner.sandboxes.push(sb);
    inner.counters.created += 1;
    let policies = &mut inner.counters.policies;
    if policies.len() == crate::MAX_POLICIES {
        policies.pop_front();
    }
    policies.push_back(held);
    let live = inner.sandboxes.len() as u64;
    inner.counters.peak_live = inner.counters.peak_live.max(live);
    Ok(json_response(202, &answer))
}

fn copy_dir(src: &std::path::Path, dst: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let ft = e.file_type()?;
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            copy_dir(&e.path(), &to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &to)?;
        } else {
            std::fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}

/// `GET /sandboxes`.
pub(crate) fn list(app: &App, query: &[(String, String)]) -> Res {
    let states: Vec<String> = q_all(query, "state")
        .iter()
        .map(|s| s.to_lowercase())
        .collect();
    let filter = match q(query, "metadata").filter(|m| !m.is_empty()) {
        None => Vec::new(),
        Some(m) => parse_metadata_filter(m).map_err(|e| {
            ApiError::new(
                400,
                "INVALID_METADATA_FORMAT",
                format!("Invalid metadata format: {e}"),
            )
        })?,
    };
    let page = int_param(query, "page", 1, 1, i64::MAX)?;
    let page_size = int_param(query, "pageSize", 20, 1, 200)?;
    let inner = app.lock();
    let mut items: Vec<&Sandbox> = inner
        .sandboxes
        .iter()
        .filter(|s| states.is_empty() || states.contains(&s.state.as_str().to_lowercase()))
        .filter(|s| filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    items.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let total = i64::try_from(items.len()).unwrap_or(i64::MAX);
    let total_pages = if total == 0 {
        0
    } else {
        (total + page_size - 1) / page_size
    };
    let start = usize::try_from((page - 1).saturating_mul(page_size)).unwrap_or(usize::MAX);
    let page_items: Vec<Value> = items
        .iter()
        .skip(start)
        .take(usize::try_from(page_size).unwrap_or(20))
        .map(|s| s.to_json())
        .collect();
    ok(&json!({
        "items": page_items,
        "pagination": {
            "page": page,
            "pageSize": page_size,
            "totalItems": total,
            "totalPages": total_pages,
            "hasNextPage": page < total_pages,
        },
    }))
}

fn int_param(
    query: &[(String, String)],
    key: &str,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ApiError> {
    let Some(raw) = q(query, key) else {
        return Ok(default);
    };
    let Ok(n) = raw.parse::<i64>() else {
        return Err(ApiError::validation(
            "int_parsing",
            &["query", key],
            "Input should be a valid integer, unable to parse string as an integer",
            &json!(raw),
        ));
    };
    if n < min {
        return Err(ApiError::validation(
            "greater_than_equal",
            &["query", key],
            format!("Input should be greater than or equal to {min}"),
            &json!(raw),
        ));
    }
    if n > max {
        return Err(ApiError::validation(
            "less_than_equal",
            &["query", key],
            format!("Input should be less than or equal to {max}"),
            &json!(raw),
        ));
    }
    Ok(n)
}

/// `GET /sandboxes/{id}`.
pub(crate) fn get(app: &App, id: &str) -> Res {
    let inner = app.lock();
    let sb = inner.find(id).ok_or_else(|| not_found(app, id))?;
    ok(&sb.to_json())
}

/// `DELETE /sandboxes/{id}`.
pub(crate) fn delete(app: &App, id: &str) -> Res {
    let mut inner = app.lock();
    if inner.remove(id).is_none() {
        return Err(not_found(app, id));
    }
    inner.counters.deleted += 1;
    empty(204)
}

/// `PATCH /sandboxes/{id}/metadata` (RFC 7396: a string adds or replaces, null deletes).
pub(crate) fn patch_metadata(app: &App, id: &str, bytes: &[u8]) -> Res {
    let input = parse_body(bytes)?;
    let Value::Object(patch) = &input else {
        return Err(ApiError::validation(
            "dict_type",
            &["body"],
            "Input should be a valid dictionary",
            &input,
        ));
    };
    let mut additions = BTreeMap::new();
    for (k, v) in patch {
        match v {
            Value::String(s) => {
                additions.insert(k.clone(), s.clone());
            }
            Value::Null => {}
            other => {
                return Err(ApiError::validation(
                    "string_type",
                    &["body", k],
                    "Input should be a valid string",
                    other,
                ));
            }
        }
    }
    let mut inner = app.lock();
    if inner.find(id).is_none() {
        return Err(not_found(app, id));
    }
    if let Some(k) = patch.keys().find(|k| k.starts_with(RESERVED_PREFIX)) {
        return Err(ApiError::new(
            400,
            "INVALID_METADATA_LABEL",
            format!("Metadata key '{k}' is reserved (opensandbox.io/ prefix)."),
        ));
    }
    check_labels(&additions)?;
    let sb = inner.find_mut(id).ok_or_else(|| not_found(app, id))?;
    for (k, v) in patch {
        match v {
            Value::String(s) => {
                sb.metadata.insert(k.clone(), s.clone());
            }
            _ => {
                sb.metadata.remove(k);
            }
        }
    }
    ok(&sb.to_json())
}

/// `POST /sandboxes/{id}/renew-expiration`: any future time, shorter or beyond the maximum.
pub(crate) fn renew(app: &App, id: &str, bytes: &[u8]) -> Res {
    let input = parse_body(bytes)?;
    let raw = input.get("expiresAt");
    let Some(raw) = raw else {
        return Err(ApiError::validation(
            "missing",
            &["body", "expiresAt"],
            "Field required",
            &input,
        ));
    };
    let Some(when) = raw.as_str().and_then(parse_rfc3339) else {
        return Err(ApiError::validation(
            "datetime_from_date_parsing",
            &["body", "expiresAt"],
            "Input should be a valid datetime",
            raw,
        ));
    };
    let ns = app.config().ns();
    let mut inner = app.lock();
    let sb = inner.find_mut(id).ok_or_else(|| not_found(app, id))?;
    if when <= OffsetDateTime::now_utc() {
        return Err(ApiError::new(
            400,
            &format!("{ns}::INVALID_EXPIRATION"),
            "New expiration time must be in the future.",
        ));
    }
    if sb.expires_at.is_none() {
        return Err(ApiError::new(
            409,
            &format!("{ns}::INVALID_EXPIRATION"),
            format!("Sandbox {id} does not have automatic expiration enabled."),
        ));
    }
    sb.expires_at = Some(when);
    ok(&json!({"expiresAt": rfc3339(when)}))
}

/// `POST /sandboxes/{id}/pause`.
pub(crate) fn pause(app: &App, id: &str) -> Res {
    let cfg = app.config();
    let mut inner = app.lock();
    let sb = inner.find_mut(id).ok_or_else(|| not_found(app, id))?;
    match cfg.runtime {
        Runtime::Docker => {
            if sb.state != State::Running {
                return Err(ApiError::new(
                    409,
                    "DOCKER::SANDBOX_NOT_RUNNING",
                    "Sandbox is not in a running state.",
                ));
            }
            sb.guest.freeze();
            sb.set_state(
                State::Paused,
                "CONTAINER_PAUSED",
                "Sandbox container is paused.",
            );
        }
        Runtime::Kubernetes => {
            if sb.state != State::Running {
                return Err(ApiError::new(
                    409,
                    "KUBERNETES::INVALID_STATE",
                    format!(
                        "Sandbox {id} is in state {} and cannot be paused.",
                        sb.state.as_str()
                    ),
                ));
            }
            sb.guest.freeze();
            sb.set_state(State::Pausing, "SANDBOX_PAUSING", "Sandbox is pausing.");
            sb.transition_due = Some(Instant::now() + Duration::from_millis(cfg.pending_ms));
        }
    }
    empty(202)
}

/// `POST /sandboxes/{id}/resume`.
pub(crate) fn resume(app: &App, id: &str) -> Res {
    let cfg = app.config();
    let mut inner = app.lock();
    let sb = inner.find_mut(id).ok_or_else(|| not_found(app, id))?;
    match cfg.runtime {
        Runtime::Docker => {
            if sb.state != State::Paused {
                return Err(ApiError::new(
                    409,
                    "DOCKER::SANDBOX_NOT_PAUSED",
                    "Sandbox is not in a paused state.",
                ));
            }
            sb.guest.thaw();
            sb.set_state(
                State::Running,
                "CONTAINER_RUNNING",
                "Sandbox container is running.",
            );
        }
        Runtime::Kubernetes => {
            if sb.state != State::Paused {
                return Err(ApiError::new(
                    409,
                    "KUBERNETES::INVALID_STATE",
                    format!(
                        "Sandbox {id} is in state {} and cannot be resumed.",
                        sb.state.as_str()
                    ),
                ));
            }
            sb.set_state(State::Resuming, "SANDBOX_RESUMING", "Sandbox is resuming.");
            sb.transition_due = Some(Instant::now() + Duration::from_millis(cfg.pending_ms));
        }
    }
    empty(202)
}

/// `GET /sandboxes/{id}/endpoints/{port}`.
pub(crate) fn endpoint(
    app: &App,
    id: &str,
    port: &str,
    query: &[(String, String)],
    mount: &str,
) -> Res {
    let Ok(port_n) = port.parse::<u32>() else {
        return Err(ApiError::validation(
            "int_parsing",
            &["path", "port"],
            "Input should be a valid integer, unable to parse string as an integer",
            &json!(port),
        ));
    };
    let use_proxy = match q(query, "use_server_proxy") {
        None => false,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => {
                return Err(ApiError::validation(
                    "bool_parsing",
                    &["query", "use_server_proxy"],
                    "Input should be a valid boolean, unable to interpret input",
                    &json!(v),
                ));
            }
        },
    };
    let cfg = app.config();
    if q(query, "expires").is_some() {
        if use_proxy {
            return Err(ApiError::new(
                400,
                "SANDBOX::INVALID_PARAMETER",
                "use_server_proxy cannot be combined with expires; signed endpoints require the gateway route.",
            ));
        }
        return Err(ApiError::new(
            400,
            "SANDBOX::API_NOT_SUPPORTED",
            "Signed routes (expires parameter) are not supported by this server.",
        ));
    }
    if !(1..=65535).contains(&port_n) {
        return Err(ApiError::new(
            400,
            &format!("{}::INVALID_PORT", cfg.ns()),
            "Port must be between 1 and 65535.",
        ));
    }
    let inner = app.lock();
    let sb = inner.find(id).ok_or_else(|| not_found(app, id))?;
    let server = app.addr.to_string();
    let host_mode = cfg.runtime == Runtime::Docker && cfg.network_mode == NetworkMode::Host;
    let endpoint = if use_proxy {
        format!("{server}{mount}/sandboxes/{id}/proxy/{port_n}")
    } else if host_mode {
        format!("127.0.0.1:{port_n}")
    } else {
        format!("{server}/sandboxes/{id}/proxy/{port_n}")
    };
    let mut v = json!({"endpoint": endpoint});
    if port_n == 18080
        && let Some(sc) = &sb.sidecar
    {
        v["headers"] = json!({"OPENSANDBOX-EGRESS-AUTH": sc.token});
    }
    ok(&v)
}

/// `POST /sandboxes/{id}/snapshots`.
pub(crate) fn snapshot_create(app: &App, id: &str, bytes: &[u8]) -> Res {
    let name = if bytes.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let v = parse_body(bytes)?;
        match v.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(other) => {
                return Err(ApiError::validation(
                    "string_too_short",
                    &["body", "name"],
                    "String should have at least 1 character",
                    other,
                ));
            }
        }
    };
    let cfg = app.config();
    let (dir, entrypoint) = {
        let inner = app.lock();
        let sb = inner.find(id).ok_or_else(|| not_found(app, id))?;
        if !matches!(sb.state, State::Running | State::Paused) {
            return Err(ApiError::new(
                409,
                "SNAPSHOT::INVALID_SOURCE_STATE",
                format!(
                    "Sandbox {id} is in state {} and cannot be snapshotted.",
                    sb.state.as_str()
                ),
            ));
        }
        (sb.guest.root.clone(), sb.entrypoint.clone())
    };
    let snap_id = uuid4();
    let snap_dir = app.state_root.join("snapshots").join(&snap_id);
    copy_dir(&dir, &snap_dir).map_err(|e| {
        ApiError::new(
            500,
            "SNAPSHOT::RUNTIME_CREATE_FAILED",
            format!("copying the sandbox failed: {e}"),
        )
    })?;
    let now = OffsetDateTime::now_utc();
    let snap = Snapshot {
        id: snap_id.clone(),
        sandbox_id: id.to_owned(),
        name,
        state: SnapState::Creating,
        created_at: now,
        last_transition_at: now,
        ready_due: Instant::now() + Duration::from_millis(cfg.snapshot_ms),
        dir: snap_dir,
        entrypoint,
    };
    let v = snap.to_json();
    app.lock().snapshots.push(snap);
    let mut resp = json_response(202, &v);
    if let Ok(h) = axum::http::HeaderValue::from_str(&format!("/v1/snapshots/{snap_id}")) {
        resp.headers_mut().insert(axum::http::header::LOCATION, h);
    }
    Ok(resp)
}

/// `GET /snapshots`.
pub(crate) fn snapshot_list(app: &App, query: &[(String, String)]) -> Res {
    let page = int_param(query, "page", 1, 1, i64::MAX)?;
    let page_size = int_param(query, "pageSize", 20, 1, 200)?;
    let states = q_all(query, "state");
    let inner = app.lock();
    let mut items: Vec<&Snapshot> = inner
        .snapshots
        .iter()
        .filter(|s| q(query, "sandboxId").is_none_or(|id| s.sandbox_id == id))
        .filter(|s| q(query, "name").is_none_or(|n| s.name.as_deref() == Some(n)))
        .filter(|s| {
            let st = match s.state {
                SnapState::Creating => "Creating",
                SnapState::Ready => "Ready",
            };
            states.is_empty() || states.contains(&st)
        })
        .collect();
    items.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let total = i64::try_from(items.len()).unwrap_or(i64::MAX);
    let total_pages = if total == 0 {
        0
    } else {
        (total + page_size - 1) / page_size
    };
    let start = usize::try_from((page - 1).saturating_mul(page_size)).unwrap_or(usize::MAX);
    let page_items: Vec<Value> = items
        .iter()
        .skip(start)
        .take(usize::try_from(page_size).unwrap_or(20))
        .map(|s| s.to_json())
        .collect();
    ok(&json!({
        "items": page_items,
        "pagination": {"page": page, "pageSize": page_size, "totalItems": total, "totalPages": total_pages, "hasNextPage": page < total_pages},
    }))
}

/// `GET /snapshots/{id}`.
pub(crate) fn snapshot_get(app: &App, id: &str) -> Res {
    let inner = app.lock();
    let snap = inner.snapshots.iter().find(|s| s.id == id).ok_or_else(|| {
        ApiError::new(
            404,
            "SNAPSHOT::NOT_FOUND",
            format!("Snapshot {id} not found"),
        )
    })?;
    ok(&snap.to_json())
}

/// `DELETE /snapshots/{id}`.
pub(crate) fn snapshot_delete(app: &App, id: &str) -> Res {
    let mut inner = app.lock();
    let pos = inner
        .snapshots
        .iter()
        .position(|s| s.id == id)
        .ok_or_else(|| {
            ApiError::new(
                404,
                "SNAPSHOT::NOT_FOUND",
                format!("Snapshot {id} not found"),
            )
        })?;
    let snap = inner.snapshots.remove(pos);
    let _ = std::fs::remove_dir_all(&snap.dir);
    empty(204)
}

/// `GET /sandboxes/{id}/diagnostics/{kind}` (plain text).
pub(crate) fn diagnostics(app: &App, id: &str, kind: &str) -> Res {
    let cfg = app.config();
    let inner = app.lock();
    let sb = inner.find(id).ok_or_else(|| not_found(app, id))?;
    let inspect = || -> String {
        let mut lines: Vec<String> = Vec::new();
        let image = sb.image.clone().unwrap_or_else(|| {
            format!(
                "opensandbox-snapshots:{}",
                sb.snapshot_id.clone().unwrap_or_default()
            )
        });
        match cfg.runtime {
            Runtime::Docker => {
                let running = matches!(sb.state, State::Running | State::Paused);
                lines.push(format!("Container ID:   {}", &sb.id.replace('-', "")[..12]));
                lines.push(format!("Name:           sandbox-{}", sb.id));
                lines.push(format!("Image:          {image}"));
                lines.push(format!(
                    "Status:         {}",
                    match sb.state {
                        State::Paused => "paused",
                        State::Failed => "exited",
                        _ => "running",
                    }
                ));
                lines.push(format!(
                    "Running:        {}",
                    if running { "True" } else { "False" }
                ));
                lines.push(format!(
                    "Paused:         {}",
                    if sb.state == State::Paused {
                        "True"
                    } else {
                        "False"
                    }
                ));
                lines.push("OOMKilled:      False".to_owned());
                lines.push(format!(
                    "Exit Code:      {}",
                    if sb.state == State::Failed { 137 } else { 0 }
                ));
                lines.push(format!("Started At:     {}", rfc3339(sb.created_at)));
                lines.push("Finished At:    0001-01-01T00:00:00Z".to_owned());
                lines.push(String::new());
                lines.push("Resources:".to_owned());
                for (k, v) in &sb.resource_limits {
                    lines.push(format!("  {k}: {v}"));
                }
                lines.push(String::new());
                lines.push("Network:".to_owned());
                let net = if cfg.network_mode == NetworkMode::Host {
                    "host: "
                } else {
                    "bridge: 172.17.0.2"
                };
                lines.push(format!("  {net}"));
            }
            Runtime::Kubernetes => {
                let phase = if sb.state == State::Pending {
                    "Pending"
                } else {
                    "Running"
                };
                lines.push(format!("Pod Name:       sandbox-{}", sb.id));
                lines.push("Namespace:      opensandbox".to_owned());
                lines.push("Node:           fake-node-1".to_owned());
                lines.push(format!("Phase:          {phase}"));
                lines.push("Pod IP:         10.244.0.17".to_owned());
                lines.push("Host IP:        10.0.0.4".to_owned());
                lines.push(format!("Start Time:     {}", rfc3339(sb.created_at)));
                if let Some(rc) = cfg.effective_runtime_class() {
                    lines.push(format!("Runtime Class:  {rc}"));
                }
                lines.push(String::new());
                lines.push("Containers:".to_owned());
                lines.push("  sandbox:".to_owned());
                lines.push(format!(
                    "    Ready:          {}",
                    if phase == "Running" { "True" } else { "False" }
                ));
                lines.push("    Restart Count:  0".to_owned());
                lines.push(format!("    Image:          {image}"));
            }
        }
        let mut labels: BTreeMap<String, String> = sb.metadata.clone();
        labels.insert("opensandbox.io/id".into(), sb.id.clone());
        if let Some(e) = sb.expires_at {
            labels.insert("opensandbox.io/expires-at".into(), rfc3339(e));
        }
        lines.push(String::new());
        lines.push("Labels:".to_owned());
        for (k, v) in &labels {
            lines.push(format!("  {k}={v}"));
        }
        lines.push(String::new());
        lines.push("Environment:".to_owned());
        let mut env = sb.env.clone();
        env.insert("OPENSANDBOX_ID".into(), sb.id.clone());
        for (k, v) in &env {
            let up = k.to_uppercase();
            if ["SECRET", "TOKEN", "PASSWORD", "KEY"]
                .iter()
                .any(|s| up.contains(s))
            {
                lines.push(format!("  {k}=***"));
            } else {
                lines.push(format!("  {k}={v}"));
            }
        }
        lines.join("\n")
    };
    let body = match kind {
        "inspect" => inspect(),
        "logs" => String::new(),
        "events" => format!("No events found for sandbox {id}."),
        "summary" => format!("INSPECT\n{}\n\nEVENTS\nNo events.\n\nLOGS\n", inspect()),
        _ => return Err(ApiError::no_route()),
    };
    Ok(text(200, body))
}
