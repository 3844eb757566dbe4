//! This host's name, as usage records and the deployment's leases carry it.

/// `CREATEOS_HOST_ID`: the name this host goes by in usage records and the admission store's
/// leases (default: the kernel's host name).
pub const ENV_HOST_ID: &str = "CREATEOS_HOST_ID";

/// This host's name: [`ENV_HOST_ID`] when set, else the kernel's host name, else `unknown`.
/// Only letters, digits and `-_.` are kept. Read once per process.
pub fn host_name() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(read_host_name).clone()
}

fn read_host_name() -> String {
    let raw = std::env::var(ENV_HOST_ID)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .take(64)
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}
