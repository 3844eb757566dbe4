//! Lenient string enums and small serde helpers shared by the account/extra modules.
//!
//! The control plane may add enum values at any time; a client that fails to decode a whole
//! response because of one new status string breaks for no good reason. Every enum declared with
//! [`lenient_enum!`] keeps the values it does not know in an `Unknown(String)` variant and
//! serializes it back unchanged.

/// Declares a `#[non_exhaustive]` string enum with an `Unknown(String)` fallback.
///
/// The enum gets `as_str`, `Display`, `From<&str>`, `Default` (an empty `Unknown`), and serde
/// impls that read and write the wire string (`null` reads as the empty `Unknown`).
macro_rules! lenient_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this client does not know; the wire string is kept as sent.
            Unknown(String),
        }

        impl $name {
            /// The wire spelling of this value.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $wire, )+
                    Self::Unknown(other) => other.as_str(),
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::Unknown(String::new())
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                match value {
                    $( $wire => Self::$variant, )+
                    other => Self::Unknown(other.to_owned()),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> ::std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {
                let raw = <Option<String> as ::serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self::from(raw.unwrap_or_default().as_str()))
            }
        }
    };
}

pub(crate) use lenient_enum;

/// `skip_serializing_if` helper: true for `0`.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde passes a reference
pub(crate) fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

/// `skip_serializing_if` helper: true for `false`.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde passes a reference
pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}

/// Deserializes `null` as the type's default: the one helper behind every lenient field
/// (`#[serde(default, deserialize_with = "nullable")]`, or `deserialize_with = "nullable"` under
/// a container-level `#[serde(default)]`), so that an absent key and an explicit `null` decode
/// alike.
pub(crate) fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    Ok(<Option<T> as serde::Deserialize>::deserialize(deserializer)?.unwrap_or_default())
}

/// A protocol error (the server broke the wire contract).
pub(crate) fn protocol_error(message: impl Into<String>) -> crate::Error {
    crate::Error::protocol(message)
}

/// Whether `error` means the connection itself failed (reset, dropped, idle timeout), so a
/// resumable stream may reconnect.
pub(crate) fn is_connection_error(error: &crate::Error) -> bool {
    matches!(
        error,
        crate::Error::Transport { .. } | crate::Error::Timeout { .. }
    )
}

#[cfg(test)]
mod tests {
    lenient_enum! {
        /// Test enum.
        pub enum Colour {
            /// Red.
            Red => "red",
            /// Dark blue.
            DarkBlue => "dark_blue",
        }
    }

    #[test]
    fn known_and_unknown_values_round_trip() {
        let parsed: Vec<Colour> =
            serde_json::from_str(r#"["red","dark_blue","ultraviolet"]"#).unwrap();
        assert_eq!(
            parsed,
            vec![
                Colour::Red,
                Colour::DarkBlue,
                Colour::Unknown("ultraviolet".into())
            ]
        );
        assert_eq!(
            serde_json::to_string(&parsed).unwrap(),
            r#"["red","dark_blue","ultraviolet"]"#
        );
        assert_eq!(Colour::DarkBlue.to_string(), "dark_blue");
        assert_eq!(Colour::default(), Colour::Unknown(String::new()));
    }

    #[test]
    fn non_string_is_an_error() {
        assert!(serde_json::from_str::<Colour>("3").is_err());
    }
}
