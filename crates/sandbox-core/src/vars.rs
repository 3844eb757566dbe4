//! How one setting is read and named, below every module that reads settings: a value that
//! is set and not blank, booleans as pydantic and shells spell them, and the names a surface's
//! refusals use for its own settings ([`SettingNames`]), and the few settings read below
//! [`crate::settings`] itself: this host's name ([`host_name`], for leases and usage records)
//! and the live-guest cap ([`parse_cap`], for the admission store). [`crate::settings`] builds
//! the typed settings on these and re-exports them.
//!
//! **Secrets from files** (the Docker and Kubernetes secrets convention), here once for every
//! reader: each of [`FILE_SETTINGS`] may instead be given as `<NAME>_FILE`, the path of a file
//! holding the value (its trailing line break dropped), so that it never sits in a process
//! environment a flow could read. [`process_env`] is the process environment with that applied,
//! the lookup every surface, `doctor` and the withheld-value check read; [`with_secret_files`]
//! applies it to any lookup. Both set is a refusal naming both ([`check_secret_files`], which
//! the CreateOS settings run first and the OpenSandbox client before it is built), as is a file
//! that cannot be read or holds nothing.

use std::io::Read as _;

use crate::error::SandboxError;

/// `CREATEOS_HOST_ID` and this host's name, as leases and usage records carry it (the metrics
/// crate's, below this one).
pub use sandbox_metrics::host::{ENV_HOST_ID, host_name};

/// `CREATEOS_MAX_LIVE_GUESTS`: the most guests a process keeps live at once, all surfaces and
/// warm pools included (unset: unlimited). See [`crate::admission`].
pub const ENV_MAX_LIVE_GUESTS: &str = "CREATEOS_MAX_LIVE_GUESTS";

/// The largest cap accepted.
const MAX_CAP: usize = 100_000;

/// Parses the cap `raw` of the setting `var`: a whole number from 1 to 100000 (unset, not 0,
/// means unlimited); the refusal names `var`.
pub fn parse_cap(var: &str, raw: &str) -> Result<usize, SandboxError> {
    match raw.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_CAP).contains(&n) => Ok(n),
        _ => Err(SandboxError::refused(format!(
            "{var}={raw:?} is not a number of guests from 1 to {MAX_CAP}; set it to the most \
             this process may keep live at once (e.g. 16), or unset it for no cap"
        ))),
    }
}

/// The settings a calling surface reads, named in refusals so that a user is told to change
/// a setting of the surface they use (the executor must not point at the backend's
/// memory setting, lfx's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingNames {
    /// How the user asked for restricted egress, as they would write it (e.g. lfx's
    /// allow-network setting set to `false`).
    pub restrict_egress: &'static str,
    /// How they would ask for unrestricted egress instead (e.g. the same setting set to
    /// `true`).
    pub allow_egress: &'static str,
    /// The variable of the link-local opt-in the surface reads (see [`read_flag`]).
    pub accept_egress_exceptions: &'static str,
    /// The memory floor (e.g. lfx's memory setting).
    pub memory: &'static str,
}

/// The value of `name` through `lookup` when it is set and not blank, trimmed.
pub fn non_blank(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The boolean setting `name` through `lookup`: unset is false, a bad value a refusal naming
/// `name` (see [`parse_bool`]).
pub fn read_flag(
    lookup: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<bool, SandboxError> {
    lookup(name).map_or(Ok(false), |raw| parse_bool(name, &raw))
}

/// Parses a boolean the way pydantic and most shells spell it.
pub fn parse_bool(name: &str, raw: &str) -> Result<bool, SandboxError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "y" | "t" => Ok(true),
        "0" | "false" | "no" | "off" | "n" | "f" | "" => Ok(false),
        _ => Err(SandboxError::refused(format!(
            "{name}={raw:?} is not a boolean; set it to true or false"
        ))),
    }
}

/// The secret settings that may be given as a file instead: `<NAME>_FILE` holds its path.
pub const FILE_SETTINGS: &[&str] = &[
    "CREATEOS_SANDBOX_API_KEY",
    "CREATEOS_API_KEY",
    "OPEN_SANDBOX_API_KEY",
    "CREATEOS_GATEWAY_SECRET",
    "CREATEOS_ADMISSION_STORE",
];

/// What names the file of a [`FILE_SETTINGS`] entry: `CREATEOS_SANDBOX_API_KEY_FILE`.
pub const FILE_SUFFIX: &str = "_FILE";

/// The most bytes a secret's file may hold (a key or a URL is far shorter; `/dev/zero` is not).
pub const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Where a secret setting's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Neither the variable nor its file is set.
    Unset,
    /// The environment variable itself.
    Env,
    /// The file `<NAME>_FILE` names (the path, as set).
    File(String),
}

/// The variable naming `setting`'s file: `setting` and [`FILE_SUFFIX`].
pub fn file_var(setting: &str) -> String {
    format!("{setting}{FILE_SUFFIX}")
}

/// The value of the secret setting `name` (one of [`FILE_SETTINGS`]) through `raw`, a lookup
/// without the file convention, and where it came from: the variable, or the file its
/// `_FILE` variable names (contents without the trailing line break). A refusal when both are
/// set (naming both), or when the file cannot be read, is larger than
/// [`MAX_SECRET_FILE_BYTES`], is not text or holds nothing; it never quotes the contents.
pub fn secret_source(
    raw: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<(Option<String>, SecretSource), SandboxError> {
    let var = file_var(name);
    let value = raw(name).filter(|v| !v.trim().is_empty());
    match (value, non_blank(raw, &var)) {
        (None, None) => Ok((None, SecretSource::Unset)),
        (Some(value), None) => Ok((Some(value), SecretSource::Env)),
        (Some(_), Some(_)) => Err(SandboxError::refused(format!(
            "{name} and {var} are both set: set only one of them ({var}, the path of a file \
             holding the value, keeps the secret out of the process environment)"
        ))),
        (None, Some(path)) => {
            let contents = read_secret_file(&path).map_err(|why| {
                SandboxError::refused(format!(
                    "{var}={path:?} {why}; point it at a readable file holding {name}'s value, \
                     or unset it"
                ))
            })?;
            Ok((Some(contents), SecretSource::File(path)))
        }
    }
}

/// A secret file's text without its trailing line break, or why it cannot be used.
fn read_secret_file(path: &str) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be opened ({e})"))?;
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read ({e})"))?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(format!(
            "is larger than {MAX_SECRET_FILE_BYTES} bytes, far more than a secret"
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_owned())?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.trim().is_empty() {
        return Err("is empty".to_owned());
    }
    Ok(value.to_owned())
}

/// `name` through `raw` with the file convention applied: a [`FILE_SETTINGS`] entry reads its
/// variable, else its file; its `_FILE` variable reads as unset once the file supplied the value,
/// and as set only when it could not be used (both set, a bad file: what
/// [`check_secret_files`] refuses; then the entry reads as its variable). Every other name
/// reads as `raw` has it.
pub fn with_secret_files(raw: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    if let Some(setting) = name
        .strip_suffix(FILE_SUFFIX)
        .filter(|s| FILE_SETTINGS.contains(s))
    {
        return match secret_source(raw, setting) {
            Err(_) => raw(name),
            Ok(_) => None,
        };
    }
    if FILE_SETTINGS.contains(&name) {
        return match secret_source(raw, name) {
            Ok((value, _)) => value,
            Err(_) => raw(name),
        };
    }
    raw(name)
}

/// The process environment with the file convention applied ([`with_secret_files`]): the
/// lookup every surface, `doctor` and the withheld-value check read by default.
pub fn process_env(name: &str) -> Option<String> {
    with_secret_files(&|k| std::env::var(k).ok(), name)
}

/// The first refusal of the file convention through `lookup` (with the convention applied, as
/// [`process_env`], or without): a secret set both ways, or a file that cannot be used.
pub fn check_secret_files(lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), SandboxError> {
    for name in FILE_SETTINGS {
        if non_blank(lookup, &file_var(name)).is_some() {
            secret_source(lookup, name)?;
        }
    }
    Ok(())
}

/// A lookup over fixed `(name, value)` pairs: the tests' stand-in for a process environment.
#[cfg(test)]
pub(crate) fn fixed_lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let m: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| m.get(k).cloned()
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    use crate::vars::fixed_lookup as env;

    fn secret_file(contents: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(contents).unwrap();
        f
    }

    const KEY: &str = "CREATEOS_SANDBOX_API_KEY";
    const KEY_FILE: &str = "CREATEOS_SANDBOX_API_KEY_FILE";

    #[test]
    fn a_secret_comes_from_its_variable_or_its_file_without_the_trailing_line_break() {
        let unset = env(&[]);
        assert_eq!(
            secret_source(&unset, KEY).unwrap(),
            (None, SecretSource::Unset)
        );
        assert_eq!(with_secret_files(&unset, KEY), None);

        let from_env = env(&[(KEY, "sk-env")]);
        assert_eq!(
            secret_source(&from_env, KEY).unwrap(),
            (Some("sk-env".to_owned()), SecretSource::Env)
        );
        assert_eq!(with_secret_files(&from_env, KEY).as_deref(), Some("sk-env"));

        for (written, read) in [
            (&b"sk-file\n"[..], "sk-file"),
            (b"sk-file\r\n", "sk-file"),
            (b"sk-file", "sk-file"),
            (b"  sk-file  \n", "  sk-file  "),
            (b"line1\nline2\n", "line1\nline2"),
        ] {
            let f = secret_file(written);
            let path = f.path().to_str().unwrap().to_owned();
            let lookup = env(&[(KEY_FILE, &path)]);
            assert_eq!(
                secret_source(&lookup, KEY).unwrap(),
                (Some(read.to_owned()), SecretSource::File(path.clone()))
            );
            assert_eq!(with_secret_files(&lookup, KEY).as_deref(), Some(read));
            // The path is consumed: nothing reads it as a setting of its own, nothing refuses.
            assert_eq!(with_secret_files(&lookup, KEY_FILE), None);
            assert!(check_secret_files(&|k| with_secret_files(&lookup, k)).is_ok());
            assert!(check_secret_files(&lookup).is_ok());
        }
    }

    #[test]
    fn every_secret_setting_takes_a_file_and_no_other_setting_does() {
        let f = secret_file(b"value-from-a-file\n");
        let path = f.path().to_str().unwrap();
        for name in FILE_SETTINGS {
            let var = file_var(name);
            let lookup = env(&[(var.as_str(), path)]);
            assert_eq!(
                with_secret_files(&lookup, name).as_deref(),
                Some("value-from-a-file"),
                "{name}"
            );
        }
        // Settings that are not secrets have no file form (names outside the families
        // scripts/check_docs.py reads, since these are not settings anyone sets).
        let lookup = env(&[
            ("OPEN_SANDBOX_DOMAIN_FILE", path),
            ("OPEN_SANDBOX_IMAGE_FILE", path),
        ]);
        assert_eq!(with_secret_files(&lookup, "OPEN_SANDBOX_DOMAIN"), None);
        assert_eq!(with_secret_files(&lookup, "OPEN_SANDBOX_IMAGE"), None);
        assert_eq!(
            with_secret_files(&lookup, "OPEN_SANDBOX_DOMAIN_FILE").as_deref(),
            Some(path)
        );
    }

    #[test]
    fn both_set_is_a_refusal_naming_both_and_never_the_value() {
        let f = secret_file(b"sk-from-file\n");
        let path = f.path().to_str().unwrap();
        let lookup = env(&[(KEY, "sk-from-env"), (KEY_FILE, path)]);
        let e = secret_source(&lookup, KEY).unwrap_err();
        let m = e.message();
        assert!(m.contains(KEY) && m.contains(KEY_FILE), "{m}");
        assert!(!m.contains("sk-from") && !m.contains(path), "{m}");
        // Through the convention the refusal is still seen, by the raw lookup and the applied one.
        let applied = |k: &str| with_secret_files(&lookup, k);
        assert_eq!(check_secret_files(&lookup).unwrap_err().message(), m);
        assert_eq!(check_secret_files(&applied).unwrap_err().message(), m);
        // Meanwhile the variable's value is what reads (so a withheld-value check still has it).
        assert_eq!(applied(KEY).as_deref(), Some("sk-from-env"));
    }

    #[test]
    fn a_file_that_cannot_be_used_is_a_refusal_naming_its_variable() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent").to_str().unwrap().to_owned();
        let empty = secret_file(b"\n");
        let blank = secret_file(b"   \n");
        let big = secret_file(&vec![
            b'k';
            usize::try_from(MAX_SECRET_FILE_BYTES).unwrap() + 1
        ]);
        let binary = secret_file(&[0xff, 0xfe, 0x00]);
        let dir_path = dir.path().to_str().unwrap().to_owned();
        for (path, why) in [
            (missing.as_str(), "cannot be opened"),
            (empty.path().to_str().unwrap(), "is empty"),
            (blank.path().to_str().unwrap(), "is empty"),
            (big.path().to_str().unwrap(), "is larger than"),
            (binary.path().to_str().unwrap(), "is not UTF-8"),
            (dir_path.as_str(), "cannot be"),
        ] {
            let lookup = env(&[("OPEN_SANDBOX_API_KEY_FILE", path)]);
            let applied = |k: &str| with_secret_files(&lookup, k);
            let e = check_secret_files(&applied).unwrap_err();
            assert!(
                e.message().starts_with("OPEN_SANDBOX_API_KEY_FILE=") && e.message().contains(why),
                "{path}: {}",
                e.message()
            );
            assert_eq!(applied("OPEN_SANDBOX_API_KEY"), None, "{path}");
        }
    }

    #[test]
    fn the_settings_and_the_withheld_values_read_a_secret_from_its_file() {
        let key = secret_file(b"sk-file-0123456789\n");
        let key_path = key.path().to_str().unwrap().to_owned();
        let raw = env(&[(KEY_FILE, &key_path)]);
        let applied = |k: &str| with_secret_files(&raw, k);
        let settings = crate::settings::Settings::from_lookup(&applied).unwrap();
        assert_eq!(
            settings
                .api_key
                .as_ref()
                .map(secrecy::ExposeSecret::expose_secret),
            Some("sk-file-0123456789")
        );
        let withheld = crate::withheld::Withheld::from_lookup(&applied);
        assert_eq!(
            withheld
                .find("print('sk-file-0123456789')")
                .map(|f| f.setting),
            Some(KEY)
        );

        let both = env(&[(KEY, "sk-env-0123456789"), (KEY_FILE, &key_path)]);
        let e = crate::settings::Settings::from_lookup(&|k| with_secret_files(&both, k))
            .err()
            .unwrap();
        assert!(
            e.message().contains(KEY) && e.message().contains(KEY_FILE),
            "{e}"
        );
    }
}
