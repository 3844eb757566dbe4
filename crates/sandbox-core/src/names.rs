//! Guest names. A name is minted before create, so a create whose response was lost can still
//! be found (by listing) and destroyed: CreateOS has no idempotency key.

use rand::Rng;

/// Longest sandbox name CreateOS accepts.
pub const NAME_MAX: usize = 22;
/// Prefix of every backend guest name.
pub const BACKEND_PREFIX: &str = "lf-";

const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Mints `prefix` followed by random `[a-z0-9]` characters, filling the name to
/// [`NAME_MAX`] characters (19 random base-36 characters for `lf-`: about 98 bits).
///
/// # Panics
/// If `prefix` leaves no room for randomness or is not a valid name fragment.
pub fn mint_name(prefix: &str) -> String {
    assert!(
        prefix.len() + 8 <= NAME_MAX && is_valid_fragment(prefix),
        "bad guest name prefix"
    );
    let mut rng = rand::rng();
    let mut s = String::with_capacity(NAME_MAX);
    s.push_str(prefix);
    while s.len() < NAME_MAX {
        s.push(char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]));
    }
    s
}

fn is_valid_fragment(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name` is a name this crate would mint or accept: 1..=22 characters of `[a-z0-9-]`,
/// starting with a letter or digit.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= NAME_MAX && is_valid_fragment(name) && !name.starts_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_names_are_valid_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let n = mint_name(BACKEND_PREFIX);
            assert!(n.starts_with("lf-"));
            assert_eq!(n.len(), NAME_MAX);
            assert!(is_valid_name(&n), "{n}");
            assert!(seen.insert(n));
        }
    }

    #[test]
    fn validity() {
        assert!(is_valid_name("demo"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("Upper"));
        assert!(!is_valid_name("-x"));
        assert!(!is_valid_name("a_b"));
        assert!(!is_valid_name(&"a".repeat(23)));
    }
}
