//! Every setting this project reads is withheld from guests by name: a setting added to any
//! crate or to the Python package is covered without anyone remembering to list it.

use std::path::{Path, PathBuf};

use sandbox_core::withheld::is_withheld_name;

/// The families of names the project's settings belong to.
const FAMILIES: &[&str] = &["CREATEOS_", "LANGFLOW_", "OPEN_SANDBOX_"];

/// Names in the sources that are not settings: a prefix written in a test, and the guest-side
/// variables the plugin itself sets in a guest (which are withheld by prefix anyway).
const NOT_SETTINGS: &[&str] = &["LANGFLOW_SANDBOX"];

/// Langflow's own settings that `doctor` and the package's docstrings name to say where a flow
/// could read the process environment in-process (the env-var fallback, custom components,
/// Langflow's copy of environment variables into users' variables). Not this plugin's and not
/// secrets; a flow asking for one gets nothing anyway, in-process and through the executor's
/// host-side resolution alike, since lfx's own deny-list refuses every `LANGFLOW_*` name.
/// `LANGFLOW_WARM_REGISTRY_ENABLED`: `doctor` says a warm registry builds flow code on the host.
const LANGFLOWS_OWN: &[&str] = &[
    "LANGFLOW_ALLOW_CUSTOM_COMPONENTS",
    "LANGFLOW_FALLBACK_TO_ENV_VAR",
    "LANGFLOW_STORE_ENVIRONMENT_VARIABLES",
    "LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT",
    "LANGFLOW_WARM_REGISTRY_ENABLED",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "py" || e == "pyi")
        {
            out.push(path);
        }
    }
}

/// Each `FAMILY_NAME` token of `text` (upper case, digits and underscores after the prefix).
fn names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for family in FAMILIES {
        let mut from = 0;
        while let Some(at) = text[from..].find(family) {
            let start = from + at;
            let before = text[..start].chars().next_back();
            let end = start
                + text[start..]
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(text.len() - start);
            from = end.max(start + 1);
            // Part of a longer word, or a prefix (`"LANGFLOW_EXECUTOR_"`, `CREATEOS_*`).
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                || text[..end].ends_with('_')
            {
                continue;
            }
            let name = &text[start..end];
            if name.len() > family.len() {
                out.push(name.to_owned());
            }
        }
    }
    out
}

#[test]
fn every_setting_the_sources_read_is_withheld() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["crates", "tests/fake-control-plane/src"] {
        sources(&root.join(dir), &mut files);
    }
    files.retain(|f| {
        let s = f.to_string_lossy();
        s.contains("/src/") || s.contains("/python/")
    });
    assert!(
        files.len() > 50,
        "the sources were not found under {}",
        root.display()
    );
    let mut seen = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for name in names(&text) {
            if !NOT_SETTINGS.contains(&name.as_str()) && !LANGFLOWS_OWN.contains(&name.as_str()) {
                seen.insert(name);
            }
        }
    }
    assert!(seen.contains("CREATEOS_SANDBOX_API_KEY"), "{seen:?}");
    // Every crate under crates/ is scanned, the provider crates too (sandbox-opensandbox's
    // settings are spelled only there).
    assert!(
        files
            .iter()
            .any(|f| f.to_string_lossy().contains("sandbox-opensandbox/src/")),
        "{files:?}"
    );
    assert!(seen.contains("OPEN_SANDBOX_CA_FILE"), "{seen:?}");
    let missed: Vec<&String> = seen.iter().filter(|n| !is_withheld_name(n)).collect();
    assert!(
        missed.is_empty(),
        "settings the sources read but guests could ask for: {missed:?}"
    );
}
