//! Certificate files an operator names (a store's CA, an OpenSandbox server's CA): read once,
//! bounded, and checked to hold PEM certificates. A leaf crate: the store (`sandbox-store`) and
//! the OpenSandbox provider (`sandbox-opensandbox`) both read through it without importing each
//! other, and sandbox-core needs no TLS stack.

use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

/// The largest certificate file read (a bundle of every public root is about 200 KiB).
pub const MAX_CERT_FILE: u64 = 4 << 20;

/// The PEM text of the certificate file at `path`, given as `param`: at most
/// [`MAX_CERT_FILE`] bytes, at least one certificate, each PEM block parsed. A problem is a
/// message starting `{param}={path}: `.
pub fn read_pem(path: &Path, param: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("{param}={}: cannot be read ({e})", path.display()))?;
    let mut pem = Vec::new();
    file.take(MAX_CERT_FILE + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("{param}={}: cannot be read ({e})", path.display()))?;
    if pem.len() as u64 > MAX_CERT_FILE {
        return Err(format!(
            "{param}={}: larger than {} MiB, not a certificate file",
            path.display(),
            MAX_CERT_FILE >> 20
        ));
    }
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(pem),
        Ok(_) => Err(format!(
            "{param}={}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )),
        Err(e) => Err(format!("{param}={}: not PEM ({e})", path.display())),
    }
}
