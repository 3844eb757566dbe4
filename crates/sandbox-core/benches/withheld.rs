//! What keeping the plugin's settings from a guest costs the host per run, and what the one
//! escaping of outside text costs per line: `cargo bench -p sandbox-core --bench withheld`.
//!
//! A run's check is one pass of [`Withheld::find_in`] (as the host's values and as the
//! author's text, which differ in the secrets they look for) over what would be sent (the executor's job:
//! the flow's JSON, its resolved variables and history), so its cost grows with that text and
//! with nothing else; this times passes over jobs of 64 KiB, 1 MiB and 16 MiB made of a real
//! flow's shape of text (JSON with keys, ids and prose), with four secret settings set the way
//! an operator sets them (the key, the gateway secret, a store URL with a password). The
//! figures are in BENCHMARKS.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use sandbox_core::withheld::{Source, Withheld};

fn job(bytes: usize) -> String {
    let node = r#"{"id":"ChatInput-x9Fq2","data":{"type":"ChatInput","node":{"template":{"input_value":{"value":"Summarise the quarterly report and list three risks","load_from_db":false},"api_key":{"value":"OPENAI_API_KEY","load_from_db":true}}}}},"#;
    let mut out = String::with_capacity(bytes + node.len());
    out.push('[');
    while out.len() < bytes {
        out.push_str(node);
    }
    out.push(']');
    out
}

fn time_per_pass(withheld: &Withheld, source: Source, text: &str) -> Duration {
    // Enough passes for about half a second, at least three.
    let start = Instant::now();
    black_box(withheld.find_in(source, black_box(text)));
    let once = start.elapsed().max(Duration::from_micros(1));
    let passes = (Duration::from_millis(500).as_nanos() / once.as_nanos()).clamp(3, 100_000) as u32;
    let start = Instant::now();
    for _ in 0..passes {
        assert!(black_box(withheld.find_in(source, black_box(text))).is_none());
    }
    start.elapsed() / passes
}

fn main() {
    let settings = [
        (
            "CREATEOS_SANDBOX_API_KEY",
            "sk_live_4f9a1c2e7b3d5f60a8c9e1b2",
        ),
        ("CREATEOS_GATEWAY_SECRET", "gw-secret-0a1b2c3d4e5f6a7b8c9d"),
        (
            "CREATEOS_ADMISSION_STORE",
            "postgres://lf:s3cr3t-store-pass@db.internal:5432/lf?sslmode=require",
        ),
        (
            "LANGFLOW_REDIS_URL",
            "redis://:another-pass-1234@cache:6379/0",
        ),
    ];
    let withheld = Withheld::from_lookup(&|name| {
        settings
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    });
    assert!(!withheld.is_empty(), "the bench needs secrets to look for");
    println!("withheld check, one pass over the job (4 secret settings set):");
    for source in [Source::Host, Source::Author] {
        for size in [64 << 10, 1 << 20, 16 << 20] {
            let text = job(size);
            let per = time_per_pass(&withheld, source, &text);
            let mib_s = f64::from(u32::try_from(text.len()).expect("under 4 GiB"))
                / per.as_secs_f64()
                / f64::from(1 << 20);
            println!(
                "  {source:?} {:>6} KiB job: {:>10.1} us per pass, {:>7.0} MiB/s",
                text.len() >> 10,
                per.as_secs_f64() * 1e6,
                mib_s
            );
        }
    }

    println!("outside_text::line, one 200-byte guest log line:");
    let clean = "INFO 2026-12-04 vertex ChatOutput-a1b2 built in 12 ms; 3 messages, 1,204 tokens";
    let hostile = "x\u{2028}CRITICAL forged\r\n\u{202e}gnol\u{1b}[2J tail of a hostile guest line";
    for (what, text) in [("clean", clean), ("hostile", hostile)] {
        let text = text.repeat(200 / text.len() + 1);
        let passes = 200_000u32;
        let start = Instant::now();
        for _ in 0..passes {
            black_box(outside_text::line(black_box(&text)));
        }
        let per = start.elapsed() / passes;
        println!("  {what:>7}: {:>7.0} ns per line", per.as_secs_f64() * 1e9);
    }
}
