//! A whole connection's bytes (request line, headers, anything after), served in memory by the
//! gateway's connection handler: hyper's parser, then framing, target, credential, allowlist
//! and resolution checks. Nothing resolves to an address the gateway connects to, so any
//! admission is a crash. `@T@` stands for a valid `Basic` credential.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    egress_gateway::fuzzing::serve_bytes(data);
});
