//! One `Proxy-Authorization` value through the gateway's credential check (scheme, base64,
//! `user:token`, token format, MAC, expiry, allowlist entries). `@T@` stands for a valid
//! `Basic` credential.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = egress_gateway::fuzzing::proxy_authorization(data);
});
