//! Lenient wire types: string enums that keep values this client does not know, `null` read as
//! a default, and RFC 3339 timestamps.

use serde::{Deserialize, Deserializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Declares a string enum whose unknown values land in `Other(String)`: the server may add
/// states at any time (the spec says so), and one new value must not fail a whole answer.
/// `null` reads as `Other("")`; values serialize back as they were read.
macro_rules! open_enum {
    (
        $(#[$doc:meta])*
        $name:ident { $( $(#[$vdoc:meta])* $variant:ident = $wire:literal ),+ $(,)? }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(from = "Option<String>", into = "String")]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vdoc])* $variant, )+
            /// A value this client does not know, as the server sent it.
            Other(String),
        }

        impl $name {
            /// The wire spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $wire, )+
                    $name::Other(raw) => raw,
                }
            }
        }

        impl From<Option<String>> for $name {
            fn from(raw: Option<String>) -> Self {
                let raw = raw.unwrap_or_default();
                $( if raw == $wire { return $name::$variant; } )+
                $name::Other(raw)
            }
        }

        impl From<&str> for $name {
            fn from(raw: &str) -> Self {
                Self::from(Some(raw.to_owned()))
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.as_str().to_owned()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use open_enum;

/// `#[serde(deserialize_with = "or_default")]`: an explicit `null` reads like an absent field.
pub(crate) fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The longest id this client accepts from a server for a sandbox or a snapshot, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// An id a server gives a sandbox or a snapshot: 1 to [`MAX_ID_BYTES`] ASCII letters, digits,
/// `-`, `_` or `.`. Anything else refuses the whole answer, so that a hostile server's id never
/// reaches a path, an error or a log record (issue 45); the refusal quotes at most 64 bytes of
/// it, escaped onto one line.
pub(crate) fn server_id<'de, D>(d: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
{
    let id = String::deserialize(d)?;
    if is_server_id(&id) {
        Ok(id)
    } else {
        Err(serde::de::Error::custom(format!(
            "the server gave the id \"{}\", which is not one (1 to {MAX_ID_BYTES} ASCII \
             letters, digits, '-', '_' or '.')",
            outside_text::snippet(&id, 64)
        )))
    }
}

/// Whether `id` is an id this client accepts from a server (see [`MAX_ID_BYTES`]).
pub fn is_server_id(id: &str) -> bool {
    (1..=MAX_ID_BYTES).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Parses an RFC 3339 timestamp as the server writes it. A timestamp without an offset
/// (a naive Python `datetime`) is read as UTC.
pub fn parse_timestamp(raw: &str) -> Option<OffsetDateTime> {
    let raw = raw.trim();
    OffsetDateTime::parse(raw, &Rfc3339)
        .ok()
        .or_else(|| OffsetDateTime::parse(&format!("{raw}Z"), &Rfc3339).ok())
}

/// Formats a time as the server expects it: RFC 3339 in UTC, whole seconds
/// (`2026-12-04T10:00:00Z`).
pub(crate) fn format_timestamp(at: OffsetDateTime) -> String {
    let at = at
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(at);
    at.format(&Rfc3339).unwrap_or_default()
}

/// A mode as the wire carries it (`755`, octal digits written as a decimal number) from
/// permission bits (`0o755`).
pub(crate) fn mode_to_wire(bits: u32) -> u32 {
    format!("{:o}", bits & 0o7777).parse().unwrap_or(0)
}

/// Permission bits from the wire's octal-digits-as-decimal (`644` → `0o644`); `None` when the
/// number holds an 8 or a 9.
pub(crate) fn mode_from_wire(wire: u32) -> Option<u32> {
    u32::from_str_radix(&wire.to_string(), 8).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 45: a hostile server's sandbox id (a forged log line after a line feed, bidi and
    /// terminal controls, 64 KiB) refuses the answer, and the refusal is one short line.
    #[test]
    fn a_hostile_sandbox_id_refuses_the_answer_with_a_short_escaped_quote() {
        for good in ["sb-1", "0f3a9c7d-2b81-4e6a-9c1d-5e7f00aa11bb", "a.b_c-D"] {
            let info: crate::SandboxInfo =
                serde_json::from_value(serde_json::json!({"id": good})).unwrap();
            assert_eq!(info.id, good);
        }
        for bad in [
            "sb-1\nCRITICAL root: forged record".to_owned(),
            "sb\u{202e}1".to_owned(),
            "sb\u{1b}[2J".to_owned(),
            "../etc".to_owned(),
            String::new(),
            "x".repeat(64 << 10),
        ] {
            let err = serde_json::from_value::<crate::SandboxInfo>(serde_json::json!({"id": bad}))
                .unwrap_err()
                .to_string();
            assert!(err.len() < 400, "{} bytes", err.len());
            assert!(!err.chars().any(outside_text::is_unsafe), "{err}");
            assert!(err.contains("is not one"), "{err}");
        }
        assert!(!is_server_id(&"y".repeat(MAX_ID_BYTES + 1)));
    }

    open_enum! {
        /// Test enum.
        Light { Red = "red", DeepBlue = "deep-blue" }
    }

    #[test]
    fn unknown_and_null_values_are_kept() {
        let v: Vec<Light> =
            serde_json::from_str(r#"["red","deep-blue","ultraviolet",null]"#).unwrap();
        assert_eq!(
            v,
            [
                Light::Red,
                Light::DeepBlue,
                Light::Other("ultraviolet".into()),
                Light::Other(String::new())
            ]
        );
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"["red","deep-blue","ultraviolet",""]"#
        );
        assert!(serde_json::from_str::<Light>("3").is_err());
    }

    #[test]
    fn timestamps_round_trip_and_naive_ones_are_utc() {
        let t = parse_timestamp("2026-12-04T10:00:00.123456Z").unwrap();
        assert_eq!(format_timestamp(t), "2026-12-04T10:00:00Z");
        let off = parse_timestamp("2026-12-04T11:00:00+01:00").unwrap();
        assert_eq!(format_timestamp(off), "2026-12-04T10:00:00Z");
        assert_eq!(
            parse_timestamp("2026-12-04T10:00:00"),
            parse_timestamp("2026-12-04T10:00:00Z")
        );
        assert!(parse_timestamp("yesterday").is_none());
    }

    #[test]
    fn modes_are_octal_digits_on_the_wire() {
        assert_eq!(mode_to_wire(0o755), 755);
        assert_eq!(mode_to_wire(0o644), 644);
        assert_eq!(mode_from_wire(644), Some(0o644));
        assert_eq!(mode_from_wire(799), None);
    }
}
