//! The first bytes of a tunnel through the gateway's `ClientHello` reader, whole and by
//! prefixes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    egress_gateway::fuzzing::client_hello(data);
});
