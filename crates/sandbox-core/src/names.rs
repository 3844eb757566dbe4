//! Every name this package gives a CreateOS resource, in one place: the prefixes and the
//! formats. A guest name is minted before create, so a create whose response was lost can still
//! be found (by listing) and destroyed: CreateOS has no idempotency key.
//!
//! Two kinds, told apart by their prefix (the orphan sweep and the reaper rely on it):
//!
//! - **one-shot** names, minted at random ([`mint_name`]): [`ONE_SHOT_PREFIX`] (`lf-`) and 19
//!   random `[a-z0-9]`, for a guest that lives for one run, whichever surface runs it (the
//!   backend, the component with Guest Reuse off, the executor; [`is_one_shot_name`]);
//! - **derived** names ([`derived_name`]): a prefix and a digest of what the resource is for
//!   and of its policy, for a resource that outlives a run and that a restarted worker finds
//!   again: the component's kept guests ([`reused_guest_name`], [`REUSED_PREFIX`] `lf-c-`) and
//!   the executor's templates ([`template_name`], [`TEMPLATE_PREFIX`] `lf-t-`). The digest is
//!   SHA-256, so it is the same in every process, version and machine; a policy change
//!   derives a different name.

use rand::Rng;
use sha2::{Digest, Sha256};

/// Longest sandbox name CreateOS accepts (CreateOS's rule: [`crate::provider::createos`]).
pub use crate::provider::createos::NAME_MAX;
/// Prefix of every one-shot guest name (all three surfaces).
pub const ONE_SHOT_PREFIX: &str = "lf-";
/// [`ONE_SHOT_PREFIX`] under its first name (the backend was the first surface to mint one).
pub const BACKEND_PREFIX: &str = ONE_SHOT_PREFIX;

/// Prefix of the component's reused guests (never one-shot: a second `-`).
pub const REUSED_PREFIX: &str = "lf-c-";

/// Prefix of the executor's templates (`python -m langflow_sandbox_createos template build`).
pub const TEMPLATE_PREFIX: &str = "lf-t-";

/// Length of the random part of a one-shot guest name.
pub const ONE_SHOT_RANDOM_LEN: usize = NAME_MAX - ONE_SHOT_PREFIX.len();

/// Whether `name` is a one-shot guest name: `lf-` and then exactly [`ONE_SHOT_RANDOM_LEN`]
/// characters of `[a-z0-9]` (so no second `-`).
pub fn is_one_shot_name(name: &str) -> bool {
    name.strip_prefix(ONE_SHOT_PREFIX).is_some_and(|rest| {
        rest.len() == ONE_SHOT_RANDOM_LEN
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// The name of the component's kept guest for one node of one flow under one policy
/// (Guest Reuse): derived from the flow id, the node id, the image, the shape and the egress
/// fingerprint, so a change of any of them addresses another guest, and a restarted worker
/// finds the same one.
pub fn reused_guest_name(
    flow_id: &str,
    node_id: &str,
    rootfs: &str,
    shape: &str,
    egress_fingerprint: &str,
) -> String {
    derived_name(
        REUSED_PREFIX,
        &[flow_id, node_id, rootfs, shape],
        egress_fingerprint,
    )
}

/// The name of the executor's template built from `dockerfile`: the same image asked for
/// twice gets the same name.
pub fn template_name(dockerfile: &str) -> String {
    derived_name(TEMPLATE_PREFIX, &[dockerfile], "template")
}

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

/// A stable name: `prefix` followed by the base-36 digest of `parts` and
/// `policy_fingerprint`, filling the name to [`NAME_MAX`] characters (17 characters, about
/// 88 bits, for [`REUSED_PREFIX`]). Each part is length-prefixed before hashing, so
/// `["ab", "c"]` and `["a", "bc"]` differ.
///
/// # Panics
/// If `prefix` leaves fewer than 8 characters for the digest, is not a valid name fragment,
/// or would make the name look like a one-shot name (which the orphan sweep may delete).
pub fn derived_name(prefix: &str, parts: &[&str], policy_fingerprint: &str) -> String {
    assert!(
        prefix.len() + 8 <= NAME_MAX && is_valid_fragment(prefix),
        "bad guest name prefix"
    );
    let mut h = Sha256::new();
    h.update(b"langflow-sandbox-createos/derived-name/v1\0");
    for part in parts.iter().chain(std::iter::once(&policy_fingerprint)) {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut n = u128::from_be_bytes(digest[..16].try_into().unwrap_or([0; 16]));
    let mut s = String::with_capacity(NAME_MAX);
    s.push_str(prefix);
    while s.len() < NAME_MAX {
        s.push(char::from(ALPHABET[(n % 36) as usize]));
        n /= 36;
    }
    assert!(
        !is_one_shot_name(&s),
        "a derived name must not look like a one-shot name"
    );
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
    fn derived_names_are_stable_and_depend_on_every_input() {
        let fp = "deny-all";
        let a = derived_name(REUSED_PREFIX, &["flow-1", "component-a"], fp);
        // Pinned (and checked with an independent SHA-256): the same inputs must give this
        // name in every process, version and machine,
        // or a restarted worker would not find its guest.
        assert_eq!(a, "lf-c-j1jc76obd9a5dbyj9");
        assert_eq!(a.len(), NAME_MAX);
        assert!(is_valid_name(&a));
        assert_eq!(
            a,
            derived_name(REUSED_PREFIX, &["flow-1", "component-a"], fp)
        );
        let others = [
            derived_name(REUSED_PREFIX, &["flow-1", "component-b"], fp),
            derived_name(REUSED_PREFIX, &["flow-1", "component-a"], "allow-all"),
            derived_name(REUSED_PREFIX, &["flow-1component-a"], fp),
            derived_name(REUSED_PREFIX, &["flow-1comp", "onent-a"], fp),
        ];
        for o in &others {
            assert_ne!(&a, o);
            assert!(o.starts_with(REUSED_PREFIX));
        }
    }

    #[test]
    fn derived_names_are_never_one_shot_names() {
        for i in 0..500 {
            let n = derived_name(REUSED_PREFIX, &[&i.to_string()], "deny-all");
            assert!(!is_one_shot_name(&n), "{n}");
        }
    }

    #[test]
    #[should_panic(expected = "one-shot")]
    fn a_prefix_that_would_look_one_shot_is_refused() {
        let _ = derived_name(BACKEND_PREFIX, &["x"], "deny-all");
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
