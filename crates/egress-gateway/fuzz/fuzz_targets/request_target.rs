//! A request line's method and target (`METHOD TARGET`, split at the first space), through the
//! gateway's target check, and the target as a host name and allowlist entry.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (method, target) = match data.iter().position(|b| *b == b' ') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b"CONNECT"[..], data),
    };
    let _ = egress_gateway::fuzzing::request_target(method, target);
    if let Ok(text) = std::str::from_utf8(target) {
        egress_gateway::fuzzing::names(text);
    }
});
