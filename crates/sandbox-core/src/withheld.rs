//! The operator's settings are not a flow's: what is withheld from every guest, by name and by
//! value.
//!
//! A flow can ask for a value by name: a field that loads from a global variable names one, and
//! lfx resolves it from Langflow's variables or, failing that, from the host's environment
//! (`fallback_to_env_vars`, whose deny-list does not know this plugin's names). A flow can also
//! carry a value another node resolved: a prompt that pulled a variable into its text, which the
//! next node sends to a guest as code. Neither may hand a guest what configures this plugin: the
//! account's API key lists and drives every guest of the account, the gateway's secret voids
//! every domain allowlist of the deployment, the admission store's URL carries its password.
//!
//! - **By name** ([`is_withheld_name`]): every `CREATEOS_*` and `OPEN_SANDBOX_*` name, Langflow's
//!   sandbox and executor settings (`LANGFLOW_SANDBOX_*`, `LANGFLOW_EXECUTOR_*`) and Langflow's
//!   own store URLs (`LANGFLOW_DATABASE_URL`, `LANGFLOW_REDIS_URL`), compared without regard to
//!   case. A flow that asks for one is refused whether or not the host has a value for it.
//! - **By value** ([`Withheld`]): the values of the secret settings ([`SECRET_SETTINGS`]) as
//!   this process has them, and the password inside each of those that is a URL or a libpq
//!   keyword string. What is looked at depends on who wrote the text ([`Source`]):
//!   - a value the **host** resolved or read for the run (a variable, a field loaded from a
//!     global variable, an environment for a guest, the chat history, a file the host reads)
//!     is refused when it *contains* a secret (or, for one shorter than
//!     [`MIN_CONTAINED_CHARS`] and for a store password that is a plain word
//!     ([`is_word_like`]), when it *is* one): that is how a secret would reach a guest;
//!   - text the flow's **author** wrote or may have written (the flow's definition, a node's
//!     code, inputs typed in, a program handed to a sandbox) cannot hold a secret the author
//!     does not already know, so looking in it only answers guesses. It is refused only when it
//!     contains a secret that cannot be guessed ([`is_guessable`] is false: a whole guess at it
//!     is hopeless, so a refusal answers nothing), or when the whole text *is* a guessable one
//!     (one guess per run, never which of a list matched). A dictionary-word store password
//!     therefore never refuses a flow that merely mentions the word.
//!
//! Each surface asks before it sends anything of a run to a guest: the executor of its job
//! (variables, inputs, history, the flow) and the uploaded files, the backend of its code and
//! environment, the component of its program. A refusal names the field and the setting, never
//! the value, and nothing of the run is sent.

use std::fmt;

use aho_corasick::AhoCorasick;
use secrecy::{ExposeSecret as _, SecretString};

use crate::error::SandboxError;

/// Name prefixes (upper case) that configure this plugin or its providers.
pub const WITHHELD_PREFIXES: &[&str] = &[
    "CREATEOS_",
    "OPEN_SANDBOX_",
    "LANGFLOW_SANDBOX_",
    "LANGFLOW_EXECUTOR_",
];

/// `LANGFLOW_REDIS_URL`: Langflow's Redis, which the admission store uses for
/// `CREATEOS_ADMISSION_STORE=langflow-redis` (`crate::lease`, which reads it under this name:
/// the one module that spells Langflow's own settings is this one).
pub const ENV_LANGFLOW_REDIS_URL: &str = "LANGFLOW_REDIS_URL";
/// `LANGFLOW_DATABASE_URL`: Langflow's database, which the admission store uses for
/// `CREATEOS_ADMISSION_STORE=langflow-database`.
pub const ENV_LANGFLOW_DATABASE_URL: &str = "LANGFLOW_DATABASE_URL";

/// Whole names (upper case) withheld besides [`WITHHELD_PREFIXES`]: Langflow's own stores, which
/// the admission store falls back to and which a guest must never reach, and Langflow's metrics
/// settings the plugin reads.
pub const WITHHELD_NAMES: &[&str] = &[
    "LANGFLOW_DATABASE_URL",
    "LANGFLOW_REDIS_URL",
    "LANGFLOW_PROMETHEUS_ENABLED",
    "LANGFLOW_PROMETHEUS_PORT",
];

/// The settings whose values are secrets: looked for in everything the host sends to a guest.
/// Those marked `true` may be URLs or libpq keyword strings, whose password is looked for too.
pub const SECRET_SETTINGS: &[(&str, bool)] = &[
    ("CREATEOS_SANDBOX_API_KEY", false),
    ("CREATEOS_API_KEY", false),
    ("CREATEOS_GATEWAY_SECRET", false),
    ("CREATEOS_ADMISSION_STORE", true),
    ("OPEN_SANDBOX_API_KEY", false),
    ("LANGFLOW_DATABASE_URL", true),
    ("LANGFLOW_REDIS_URL", true),
];

/// The shortest secret looked for *inside* longer text; a shorter one (a short store password)
/// is matched only as a whole value, so that it cannot refuse every text that happens to contain
/// its few characters.
pub const MIN_CONTAINED_CHARS: usize = 8;

/// The fewest characters a secret needs to be looked for inside an author's text
/// (see [`is_guessable`]).
pub const MIN_UNGUESSABLE_CHARS: usize = 16;

/// Whether `password` is a plain word that ordinary text may mention (`langflow`, `postgres`,
/// `changeme`): letters only, or fewer than 5 distinct characters. Such a store password is
/// matched only as a whole text, from either [`Source`].
pub fn is_word_like(password: &str) -> bool {
    let mut distinct: Vec<char> = password.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    password.chars().all(char::is_alphabetic) || distinct.len() < 5
}

/// Who wrote a text a run would send to a guest, which decides how it is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A value the host resolved or read for the run: a variable, a field loaded from a global
    /// variable, an environment for a guest, the chat history, a file the host reads. Refused
    /// when it contains any secret.
    Host,
    /// Text the flow's author wrote, or may have written: the flow's definition, a node's code,
    /// inputs typed in, a program handed to a sandbox. Refused only when it contains a secret
    /// that cannot be guessed, or is a guessable one whole, so that a refusal never answers
    /// which of many guesses matched.
    Author,
}

/// Whether `secret` could be found by guessing from a list (a word, a short or repetitive
/// string): fewer than [`MIN_UNGUESSABLE_CHARS`] characters, fewer than 8 distinct ones, no
/// digit, or no letter. A generated key or password is not; `langflow`, `password123` and
/// `postgres` are. Such a secret is matched in an author's text only as the whole text.
pub fn is_guessable(secret: &str) -> bool {
    let mut distinct: Vec<char> = secret.chars().collect();
    let chars = distinct.len();
    distinct.sort_unstable();
    distinct.dedup();
    chars < MIN_UNGUESSABLE_CHARS
        || distinct.len() < 8
        || !secret.chars().any(|c| c.is_ascii_digit())
        || !secret.chars().any(char::is_alphabetic)
}

/// Whether `name` (a variable a flow asks for, an environment variable for a guest) configures
/// this plugin, compared without regard to case and surrounding blanks.
pub fn is_withheld_name(name: &str) -> bool {
    let upper = name.trim().to_ascii_uppercase();
    WITHHELD_PREFIXES.iter().any(|p| upper.starts_with(p))
        || WITHHELD_NAMES.iter().any(|n| upper == *n)
}

/// One secret value and the setting it came from.
struct Secret {
    setting: &'static str,
    what: &'static str,
    value: SecretString,
    /// Whether a guess from a list could find it ([`is_guessable`]); for a URL, whether the
    /// password inside it could (the rest of a URL is no secret).
    guessable: bool,
    /// A password that is a plain word ([`is_word_like`]): matched only whole, from either
    /// source, since ordinary text mentions it.
    word: bool,
}

/// The secret values of this process's settings, ready to be looked for in text. `Debug` shows
/// the settings that have a value, never a value.
pub struct Withheld {
    secrets: Vec<Secret>,
    /// Every secret of at least [`MIN_CONTAINED_CHARS`] characters, by index into `secrets`:
    /// what a host-resolved value must not contain.
    contained: Option<(AhoCorasick, Vec<usize>)>,
    /// Every secret that is not guessable, by index into `secrets`: what an author's text must
    /// not contain.
    unguessable: Option<(AhoCorasick, Vec<usize>)>,
}

impl fmt::Debug for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut settings: Vec<&str> = self.secrets.iter().map(|s| s.setting).collect();
        settings.dedup();
        f.debug_struct("Withheld")
            .field("settings", &settings)
            .field("values", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl Clone for Withheld {
    fn clone(&self) -> Self {
        Self::build(
            self.secrets
                .iter()
                .map(|s| Secret {
                    setting: s.setting,
                    what: s.what,
                    value: s.value.clone(),
                    guessable: s.guessable,
                    word: s.word,
                })
                .collect(),
        )
    }
}

/// Where a withheld value was found: the setting it belongs to (and which part of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The setting, e.g. `CREATEOS_SANDBOX_API_KEY`.
    pub setting: &'static str,
    /// `"value"`, or `"password"` for the password inside a URL or keyword string.
    pub what: &'static str,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.what == "value" {
            write!(f, "the value of {}", self.setting)
        } else {
            write!(f, "the {} in {}", self.what, self.setting)
        }
    }
}

impl Withheld {
    /// The secret values [`SECRET_SETTINGS`] have through `lookup` (set and not blank), and the
    /// passwords inside those that may be URLs.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let mut secrets = Vec::new();
        for &(setting, url_like) in SECRET_SETTINGS {
            let Some(raw) = lookup(setting) else { continue };
            let value = raw.trim();
            if value.is_empty() {
                continue;
            }
            let password = if url_like { password_in(value) } else { None };
            // A URL is as guessable as the password in it; one without a password holds
            // nothing an author could not write.
            let guessable = match &password {
                Some(p) => is_guessable(p),
                None => url_like || is_guessable(value),
            };
            if let Some(password) = password {
                secrets.push(Secret {
                    setting,
                    what: "password",
                    word: is_word_like(&password),
                    value: SecretString::from(password),
                    guessable,
                });
            }
            secrets.push(Secret {
                setting,
                what: "value",
                value: SecretString::from(value.to_owned()),
                guessable,
                word: false,
            });
        }
        Self::build(secrets)
    }

    fn build(secrets: Vec<Secret>) -> Self {
        let automaton = |keep: &dyn Fn(&Secret) -> bool| {
            let picked: Vec<usize> = (0..secrets.len()).filter(|&i| keep(&secrets[i])).collect();
            if picked.is_empty() {
                return None;
            }
            AhoCorasick::new(picked.iter().map(|&i| secrets[i].value.expose_secret()))
                .ok()
                .map(|ac| (ac, picked))
        };
        // A password that is a plain word is matched only whole even in what the host
        // resolved: inside text it would refuse every mention of the word.
        let contained = automaton(&|s| {
            s.value.expose_secret().chars().count() >= MIN_CONTAINED_CHARS && !s.word
        });
        let unguessable = automaton(&|s| !s.guessable);
        Self {
            secrets,
            contained,
            unguessable,
        }
    }

    /// Whether this process has any secret value to look for.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The first withheld value `text`, a value the host resolved, holds (contains, or is,
    /// for a short one): [`Source::Host`].
    pub fn find(&self, text: &str) -> Option<Found> {
        self.find_bytes(text.as_bytes())
    }

    /// [`Withheld::find`] over bytes (a file's contents).
    pub fn find_bytes(&self, data: &[u8]) -> Option<Found> {
        self.find_from(Source::Host, data)
    }

    /// The first withheld value a text holds, looked at as its [`Source`] says.
    pub fn find_in(&self, source: Source, text: &str) -> Option<Found> {
        self.find_from(source, text.as_bytes())
    }

    fn find_from(&self, source: Source, data: &[u8]) -> Option<Found> {
        let automaton = match source {
            Source::Host => &self.contained,
            Source::Author => &self.unguessable,
        };
        if let Some((ac, picked)) = automaton
            && let Some(m) = ac.find(data)
        {
            return Some(self.found(picked[m.pattern().as_usize()]));
        }
        let trimmed = data.trim_ascii();
        self.secrets
            .iter()
            .position(|s| {
                let whole_only = match source {
                    Source::Host => {
                        s.value.expose_secret().chars().count() < MIN_CONTAINED_CHARS || s.word
                    }
                    Source::Author => s.guessable,
                };
                whole_only && trimmed == s.value.expose_secret().as_bytes()
            })
            .map(|i| self.found(i))
    }

    /// Refuses `text`, a value the host resolved, that holds a withheld value; `place` says
    /// what it is (e.g. "the env passed to `run()`'s variable `TOKEN`").
    pub fn check_text(&self, place: &str, text: &str) -> Result<(), SandboxError> {
        self.check_from(Source::Host, place, text)
    }

    /// Refuses `text` from `source` that holds a withheld value, looked at as [`Source`] says;
    /// `place` says what it is (e.g. "the code to run").
    pub fn check_from(&self, source: Source, place: &str, text: &str) -> Result<(), SandboxError> {
        match self.find_in(source, text) {
            Some(found) => Err(refuse_value(place, found)),
            None => Ok(()),
        }
    }

    /// Refuses an environment for a guest (`who` passed it, e.g. "the env passed to `run()`") that names a
    /// withheld variable or holds a withheld value.
    pub fn check_env<'a>(
        &self,
        who: &str,
        env: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<(), SandboxError> {
        for (name, value) in env {
            if is_withheld_name(name) {
                return Err(refuse_name(&format!("{who} sets"), name));
            }
            self.check_text(&format!("{who}'s variable {}", shown(name)), value)?;
        }
        Ok(())
    }

    /// The one check of a sandbox backend's run, whatever the provider, made before anything
    /// is sent: `code` looked at as the author's text ([`Source::Author`]), `env` by name and
    /// as values the host resolved.
    pub fn check_code_and_env<'a>(
        &self,
        code: &str,
        env: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<(), SandboxError> {
        self.check_from(Source::Author, "the code to run", code)?;
        self.check_env("the env passed to run()", env)
    }

    fn found(&self, i: usize) -> Found {
        Found {
            setting: self.secrets[i].setting,
            what: self.secrets[i].what,
        }
    }
}

/// The refusal of a run that asks for a withheld name. `asker` says who asks (e.g. "the field
/// `api_key` of Secret Probe (vertex secret)"); `name` is shown escaped and cut.
pub fn refuse_name(asker: &str, name: &str) -> SandboxError {
    SandboxError::refused(format!(
        "{asker} asks for the variable {}, which configures the sandbox itself: the sandbox's own \
         settings and Langflow's store URLs are never resolved for a flow or sent to a guest. \
         Nothing was sent to a guest. Give the flow a variable of its own under another name \
         (a Langflow global variable, or an environment variable outside the CREATEOS_*, \
         OPEN_SANDBOX_* and LANGFLOW_SANDBOX_* families) holding what it should get",
        shown(name)
    ))
}

/// The refusal of a run whose `place` (e.g. "the field `api_key` of vertex x") holds a
/// withheld value. The value itself is never shown.
pub fn refuse_value(place: &str, found: Found) -> SandboxError {
    SandboxError::refused(format!(
        "{place} holds {found}, which configures the sandbox itself and is never sent to a \
         guest; nothing was sent to a guest. Give the flow a credential of its own (not the \
         sandbox's key, the gateway secret or a store's password), or remove it from what the \
         flow sends"
    ))
}

/// A name from a flow, fit for a message: in backquotes, at most 80 bytes, on one line with
/// every character that could act on a terminal escaped ([`outside_text::line`]).
pub fn shown(name: &str) -> String {
    format!("`{}`", outside_text::line(&outside_text::cap(name, 80)))
}

/// The password inside a URL's user information, a `password=` query parameter, or a libpq
/// keyword string (`host=db password=... dbname=x`), when there is one.
fn password_in(value: &str) -> Option<String> {
    if let Ok(url) = url::Url::parse(value) {
        if let Some(p) = url.password()
            && let Ok(p) = percent_encoding::percent_decode_str(p).decode_utf8()
            && !p.is_empty()
        {
            return Some(p.into_owned());
        }
        return url
            .query_pairs()
            .find(|(k, _)| k.eq_ignore_ascii_case("password"))
            .map(|(_, v)| v.into_owned())
            .filter(|p| !p.is_empty());
    }
    keyword_password(value)
}

/// `password=...` of a libpq keyword string, with its single-quoted form.
fn keyword_password(value: &str) -> Option<String> {
    let lower = value.to_ascii_lowercase();
    let at = lower.find("password")?;
    let rest = value[at + "password".len()..].trim_start();
    let rest = rest.strip_prefix('=')?.trim_start();
    let password = if let Some(quoted) = rest.strip_prefix('\'') {
        let mut out = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.extend(chars.next()),
                '\'' => break,
                c => out.push(c),
            }
        }
        out
    } else {
        rest.split_whitespace().next().unwrap_or("").to_owned()
    };
    (!password.is_empty()).then_some(password)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn withheld(pairs: &[(&str, &str)]) -> Withheld {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Withheld::from_lookup(&|k| env.get(k).cloned())
    }

    #[test]
    fn every_plugin_setting_and_langflows_store_urls_are_withheld_by_name() {
        for name in [
            "CREATEOS_SANDBOX_API_KEY",
            "CREATEOS_API_KEY",
            "createos_api_key",
            " CREATEOS_GATEWAY_SECRET ",
            "CREATEOS_ADMISSION_STORE",
            "CREATEOS_EXECUTOR_ROOTFS",
            "OPEN_SANDBOX_API_KEY",
            "open_sandbox_domain",
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
            "LANGFLOW_EXECUTOR_KIND",
            "LANGFLOW_DATABASE_URL",
            "langflow_redis_url",
        ] {
            assert!(is_withheld_name(name), "{name}");
        }
        for name in [
            "OPENAI_API_KEY",
            "MY_CREATEOS_KEY",
            "CREATEOS",
            "EXEC_TEST_CREDENTIAL",
            "",
        ] {
            assert!(!is_withheld_name(name), "{name}");
        }
    }

    #[test]
    fn the_constants_name_the_settings_the_crates_read() {
        let names: Vec<&str> = SECRET_SETTINGS.iter().map(|(n, _)| *n).collect();
        for setting in [
            crate::settings::ENV_API_KEY,
            crate::settings::ENV_API_KEY_FALLBACK,
            crate::gateway::ENV_GATEWAY_SECRET,
            crate::lease::ENV_ADMISSION_STORE,
            crate::lease::ENV_LANGFLOW_DATABASE_URL,
            crate::lease::ENV_LANGFLOW_REDIS_URL,
        ] {
            assert!(names.contains(&setting), "{setting}");
            assert!(is_withheld_name(setting), "{setting}");
        }
    }

    #[test]
    fn a_secret_is_found_inside_any_text_and_named_never_shown() {
        let key = "sk-live-7f3c9a1e5b2d";
        let w = withheld(&[("CREATEOS_SANDBOX_API_KEY", key), ("CREATEOS_API_KEY", "")]);
        let found = w.find(&format!("Authorization: Bearer {key}\n")).unwrap();
        assert_eq!(found.setting, "CREATEOS_SANDBOX_API_KEY");
        assert_eq!(found.what, "value");
        assert_eq!(
            w.find("sk-live-7f3c9a1e5b2"),
            None,
            "a prefix is not the key"
        );
        assert_eq!(w.find("nothing here"), None);
        let err = w
            .check_text("the code to run", &format!("print('{key}')"))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("the code to run") && text.contains("CREATEOS_SANDBOX_API_KEY"),
            "{text}"
        );
        assert!(!text.contains(key), "{text}");
        for shown in [format!("{w:?}"), format!("{w:#?}")] {
            assert!(
                !shown.contains(key) && shown.contains("CREATEOS_SANDBOX_API_KEY"),
                "{shown}"
            );
        }
    }

    #[test]
    fn a_store_urls_password_is_found_in_every_form() {
        let cases = [
            (
                "postgresql://lf:s3cret-passw0rd@db:5432/lf?sslmode=require",
                "s3cret-passw0rd",
            ),
            (
                "postgresql://lf:s3cr%23t%3Fpassw0rd@db/lf",
                "s3cr#t?passw0rd",
            ),
            ("rediss://:tok-12345678abc@cache:6380/0", "tok-12345678abc"),
            (
                "postgresql://db/lf?user=lf&password=qu3ry-passw0rd",
                "qu3ry-passw0rd",
            ),
            (
                "host=db user=lf password=k3yword-passw0rd dbname=lf",
                "k3yword-passw0rd",
            ),
            (
                "host=db password='quo ted\\'passw0rd' dbname=lf",
                "quo ted'passw0rd",
            ),
        ];
        for (store, password) in cases {
            let w = withheld(&[("CREATEOS_ADMISSION_STORE", store)]);
            let found = w
                .find(&format!("x {password} y"))
                .unwrap_or_else(|| panic!("{store}"));
            assert_eq!(
                (found.setting, found.what),
                ("CREATEOS_ADMISSION_STORE", "password")
            );
            assert_eq!(w.find(store).unwrap().setting, "CREATEOS_ADMISSION_STORE");
        }
    }

    #[test]
    fn a_short_secret_is_matched_only_as_a_whole_value() {
        let w = withheld(&[("LANGFLOW_DATABASE_URL", "postgresql://lf:pw@db/lf")]);
        assert_eq!(w.find("pw").map(|f| f.what), Some("password"));
        assert_eq!(w.find("  pw\n").map(|f| f.what), Some("password"));
        assert_eq!(w.find("pwned"), None);
        assert_eq!(w.find("a password"), None);
        // The whole URL is long: found inside text.
        assert_eq!(
            w.find("conn=postgresql://lf:pw@db/lf;").map(|f| f.what),
            Some("value")
        );
    }

    #[test]
    fn guessable_secrets_are_words_short_or_repetitive_strings() {
        for guessable in [
            "langflow",
            "password123",
            "postgres",
            "test-key",
            "correcthorsebatterystaple",
            "1234567890123456",
            "aaaaaaaaaaaaaaaaaaaa1",
        ] {
            assert!(is_guessable(guessable), "{guessable}");
        }
        for strong in [
            "sk-live-7f3c9a1e5b2d",
            "e2e-store-passw0rd-5d1c",
            "9f86d081884c7d659a2feaa0c55ad015",
            "skp_live_Q7x2Lm9Vb4Tz",
        ] {
            assert!(!is_guessable(strong), "{strong}");
        }
        for word in ["langflow", "postgres", "changeme", "aaaa1111", "Passwort"] {
            assert!(is_word_like(word), "{word}");
        }
        for not_word in ["s3cret-passw0rd", "tok-12345678abc", "langflow2"] {
            assert!(!is_word_like(not_word), "{not_word}");
        }
    }

    /// Issue 45: Langflow's own docker-compose URL (`langflow:langflow`) neither refuses a flow
    /// that mentions Langflow nor answers a word list hidden in a node's code.
    #[test]
    fn a_word_like_store_password_refuses_no_mention_and_answers_no_word_list() {
        let url = "postgresql://langflow:langflow@postgres:5432/langflow";
        let w = withheld(&[("LANGFLOW_DATABASE_URL", url)]);
        for text in [
            "see https://docs.langflow.org/components",
            "import langflow",
            "what is langflow?",
        ] {
            assert_eq!(w.find_in(Source::Author, text), None, "{text}");
            assert_eq!(w.find_in(Source::Host, text), None, "{text}");
        }
        // A list of 1,024 guesses, the password among them: no answer, whichever half.
        let mut words: Vec<String> = (0..1023).map(|i| format!("word{i}")).collect();
        words.insert(517, "langflow".to_owned());
        for half in words.chunks(512) {
            assert_eq!(w.find_in(Source::Author, &half.join(" ")), None);
        }
        // The password or the URL on its own is still refused, from either side; the URL
        // inside a value the host resolved too.
        for source in [Source::Author, Source::Host] {
            assert!(w.find_in(source, " langflow\n").is_some());
            assert!(w.find_in(source, url).is_some());
        }
        assert!(w.find_in(Source::Host, &format!("DSN={url};")).is_some());
    }

    #[test]
    fn an_unguessable_secret_is_refused_inside_an_authors_text() {
        let key = "sk-live-7f3c9a1e5b2d";
        let store = "redis://:e2e-store-passw0rd-5d1c@db:6379/0";
        let w = withheld(&[
            ("CREATEOS_SANDBOX_API_KEY", key),
            ("CREATEOS_ADMISSION_STORE", store),
        ]);
        let found = w
            .find_in(Source::Author, &format!("print('{key}')"))
            .unwrap();
        assert_eq!(found.setting, "CREATEOS_SANDBOX_API_KEY");
        let found = w
            .find_in(Source::Author, "pw = 'e2e-store-passw0rd-5d1c'")
            .unwrap();
        assert_eq!(
            (found.setting, found.what),
            ("CREATEOS_ADMISSION_STORE", "password")
        );
        // A part of it is no match (no prefix oracle).
        assert_eq!(
            w.find_in(Source::Author, &format!("print('{}')", &key[..12])),
            None
        );
    }

    #[test]
    fn a_guessable_key_is_refused_in_an_authors_text_only_whole() {
        let w = withheld(&[("OPEN_SANDBOX_API_KEY", "changeme-now")]);
        assert_eq!(w.find_in(Source::Author, "x = 'changeme-now'"), None);
        assert!(w.find_in(Source::Author, "changeme-now\n").is_some());
        // What the host resolved is refused when it holds it anywhere.
        assert!(w.find_in(Source::Host, "token changeme-now").is_some());
    }

    #[test]
    fn an_environment_for_a_guest_is_refused_by_name_and_by_value() {
        let key = "sk-live-7f3c9a1e5b2d";
        let w = withheld(&[("CREATEOS_API_KEY", key)]);
        let env = |k: &str, v: &str| [(k.to_owned(), v.to_owned())];
        let by_name = env("CREATEOS_GATEWAY_SECRET", "x");
        let e = w
            .check_env(
                "the env passed to run()",
                by_name.iter().map(|(k, v)| (k, v)),
            )
            .unwrap_err();
        assert!(e.to_string().contains("`CREATEOS_GATEWAY_SECRET`"), "{e}");
        let by_value = env("TOKEN", key);
        let e = w
            .check_env(
                "the env passed to run()",
                by_value.iter().map(|(k, v)| (k, v)),
            )
            .unwrap_err();
        assert!(e.to_string().contains("`TOKEN`") && e.to_string().contains("CREATEOS_API_KEY"));
        assert!(!e.to_string().contains(key));
        let fine = env("OPENAI_API_KEY", "sk-other-0000000000");
        w.check_env("the env passed to run()", fine.iter().map(|(k, v)| (k, v)))
            .unwrap();
    }

    #[test]
    fn a_hostile_name_is_shown_escaped_and_cut() {
        let shown = shown(&format!("CREATEOS_\u{1b}[31m\n{}", "A".repeat(200)));
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\n'),
            "{shown}"
        );
        // 80 bytes kept (each a 4-character escape at worst), the cut's mark and the quotes.
        assert!(
            shown.contains("bytes cut]") && shown.chars().count() < 80 * 4 + 30,
            "{shown}"
        );
    }
}
