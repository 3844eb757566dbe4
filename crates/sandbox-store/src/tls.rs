//! TLS to the admission store, read from its URL the way the store's usual clients read it, so
//! the URL Langflow already connects with works here unchanged:
//!
//! - PostgreSQL: libpq's `sslmode` (`disable`, `allow`, `prefer` (the default), `require`,
//!   `verify-ca`, `verify-full`) and `sslrootcert` (a PEM file, or `system`). As in libpq,
//!   `prefer` and `require` encrypt without checking who answers, unless a root certificate is
//!   given (then `require` checks the chain, as `verify-ca` does); `verify-full` also checks
//!   the host name. With no `sslrootcert`, `~/.postgresql/root.crt` is used when it exists
//!   (libpq's default), else the system's roots.
//! - Redis: `rediss://` checks the server's certificate and name against the system's roots,
//!   or against redis-py's `ssl_ca_certs=<PEM file>`; redis-py's `ssl_cert_reqs=none` (or the
//!   redis crate's `#insecure`) encrypts without checking.
//!
//! A certificate checked against roots may also be one of those roots itself (a self-signed
//! certificate given as its own root, as OpenSSL, libpq and redis-py accept): it is accepted
//! when it is byte for byte one of them, its validity period and (when the name is checked) its
//! name still checked.
//!
//! Client certificates (`sslcert`, `ssl_certfile`, ...) are refused with the reason: a setting
//! the store cannot honour is never dropped silently. One TLS stack serves every connection of
//! both stores ([`client_config`] and the crate's own handshake): rustls with the aws-lc-rs
//! provider the HTTP client already uses. What each connection negotiated is kept
//! ([`Transport`]) for `doctor`. The types (what a URL asks for, what a connection negotiated)
//! are sandbox-core's (`sandbox_core::lease::tls`), which shows them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};

use sandbox_core::lease::StoreKind;
use sandbox_core::lease::tls::{Roots, StoreTls, TlsMode, Transport};

/// A rustls client configuration for `tls`'s mode (`None` for [`TlsMode::Disable`]).
pub fn client_config(tls: &StoreTls) -> Result<Option<Arc<ClientConfig>>, String> {
    if tls.mode == TlsMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?;
    let config = if tls.mode.checks_chain() {
        let (roots, anchors) = root_store(&tls.roots)?;
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("TLS roots unusable: {e}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Checked {
                webpki,
                roots: anchors,
                name: tls.mode == TlsMode::VerifyFull,
            }))
            .with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth()
    };
    Ok(Some(Arc::new(config)))
}

/// The roots, as rustls's store and as the certificates themselves (to recognise a server
/// certificate that is one of them).
fn root_store(roots: &Roots) -> Result<(RootCertStore, Vec<CertificateDer<'static>>), String> {
    let mut store = RootCertStore::empty();
    let mut anchors = Vec::new();
    match roots {
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            anchors.clone_from(&found.certs);
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "no system root certificates found{}; give the server's CA as a PEM \
                     file (sslrootcert=/path for PostgreSQL, ssl_ca_certs=/path for Redis)",
                    found
                        .errors
                        .first()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                ));
            }
        }
        Roots::File { path, pem } => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("{} is not PEM: {e}", path.display()))?;
                anchors.push(cert.clone());
                store
                    .add(cert)
                    .map_err(|e| format!("{}: a certificate is unusable: {e}", path.display()))?;
            }
        }
    }
    Ok((store, anchors))
}

/// What a finished rustls handshake negotiated.
fn transport_of(conn: &rustls::ClientConnection) -> Transport {
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLS 1.3".to_owned(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLS 1.2".to_owned(),
        Some(other) => format!("{other:?}"),
        None => "TLS".to_owned(),
    };
    let cipher = conn
        .negotiated_cipher_suite()
        .map(|s| format!("{:?}", s.suite()))
        .unwrap_or_default();
    Transport::Tls { version, cipher }
}

/// A TLS handshake over `stream` with the server named `host` (a DNS name or an address):
/// the stream and what it negotiated.
pub(crate) async fn handshake<S>(
    config: Arc<ClientConfig>,
    host: &str,
    stream: S,
) -> io::Result<(tokio_rustls::client::TlsStream<S>, Transport)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await?;
    let transport = transport_of(tls.get_ref().1);
    Ok((tls, transport))
}

/// `text` (a failed store call's message) with what to set when it is about the server's
/// certificate: the fix for the check that failed, the right one first (the root to configure,
/// the name to reach the store by, the certificate to renew). Turning the check off is never
/// suggested.
pub(crate) fn explain(kind: StoreKind, text: String) -> String {
    if !text.contains("certificate") {
        return text;
    }
    let roots = roots_param(kind);
    let fix = if text.contains("NotValidForName") || text.contains("not valid for name") {
        format!(
            "the certificate does not name the host the URL reaches the store by: use a name \
             it holds (or have the server's certificate name this one){}",
            match kind {
                StoreKind::Postgres => {
                    "; sslmode=verify-ca checks the chain without the name"
                }
                StoreKind::Redis => "",
            }
        )
    } else if text.contains("CaUsedAsEndEntity") {
        format!(
            "the store presents a CA certificate as its own, as a self-signed certificate is: \
             give that certificate itself in the URL as {roots}=/path/to/its.pem (or the CA \
             that signed it)"
        )
    } else if text.contains("Expired") || text.contains("expired") {
        "the certificate has expired: renew it on the server".to_owned()
    } else if text.contains("NotValidYet") || text.contains("not valid yet") {
        "the certificate is not valid yet: check the server's and this host's clocks".to_owned()
    } else {
        format!(
            "give the CA that signed the store's certificate in the URL as \
             {roots}=/path/to/ca.pem (or, for a self-signed certificate, the certificate \
             itself)"
        )
    };
    format!("{text} (the store's TLS certificate was not accepted: {fix})")
}

/// The parameter that names the roots in a `kind` store's URL.
fn roots_param(kind: StoreKind) -> &'static str {
    match kind {
        StoreKind::Postgres => "sslrootcert",
        StoreKind::Redis => "ssl_ca_certs",
    }
}

/// What [`split`] made of a store URL.
#[derive(Debug)]
pub(crate) struct Split {
    /// The URL for the client crate: the TLS parameters it does not know taken out.
    pub url: String,
    /// The TLS asked for.
    pub tls: StoreTls,
}

/// Reads the TLS parameters of a `kind` store URL; `Err` holds why it cannot be honoured (the
/// parameter and the fix).
pub(crate) fn split(kind: StoreKind, raw: &str) -> Result<Split, String> {
    let Ok(mut url) = url::Url::parse(raw) else {
        // Not a single-host URL (e.g. PostgreSQL's host list): passed on as it is, as long as
        // it asks for no TLS this module would have to read.
        if raw.contains("ssl") {
            return Err(
                "its TLS parameters could not be read (the URL does not parse); write it as \
                 one scheme://user@host:port/name URL"
                    .to_owned(),
            );
        }
        return Ok(Split {
            url: raw.to_owned(),
            tls: match kind {
                StoreKind::Postgres => StoreTls {
                    mode: TlsMode::Prefer,
                    roots: Roots::System,
                },
                StoreKind::Redis => StoreTls::PLAIN,
            },
        });
    };
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |name: &str| {
        pairs
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let (tls, taken, kept_mode): (StoreTls, &[&str], Option<&str>) = match kind {
        StoreKind::Postgres => {
            let client_cert = ["sslcert", "sslkey", "sslpassword"]
                .into_iter()
                .find(|p| get(p).is_some_and(|v| !v.is_empty()))
                .or_else(|| {
                    (get("sslcertmode").as_deref() == Some("require")).then_some("sslcertmode")
                });
            if let Some(p) = client_cert {
                return Err(format!(
                    "{p}: client certificates are not supported for the admission store; \
                     authenticate with a password or another method, or leave {p} out"
                ));
            }
            let mode = match get("sslmode").as_deref() {
                None | Some("prefer" | "allow") => TlsMode::Prefer,
                Some("disable") => TlsMode::Disable,
                Some("require") => TlsMode::Require,
                Some("verify-ca") => TlsMode::VerifyCa,
                Some("verify-full") => TlsMode::VerifyFull,
                Some(other) => {
                    return Err(format!(
                        "sslmode={other:?} is not one of disable, allow, prefer, require, \
                         verify-ca, verify-full"
                    ));
                }
            };
            let rootcert = get("sslrootcert").filter(|v| !v.is_empty());
            let roots = match rootcert.as_deref() {
                Some("system") => Roots::System,
                Some(path) => read_roots(Path::new(path), "sslrootcert")?,
                None => match default_pg_root() {
                    Some(path) if mode.checks_chain() || mode == TlsMode::Require => {
                        read_roots(&path, "sslrootcert (libpq's default file)")?
                    }
                    _ => Roots::System,
                },
            };
            // libpq: `require` with a root certificate given checks the chain, as `verify-ca`.
            let mode = if mode == TlsMode::Require && matches!(roots, Roots::File { .. }) {
                TlsMode::VerifyCa
            } else {
                mode
            };
            let wire = match mode {
                TlsMode::Disable => "disable",
                TlsMode::Prefer => "prefer",
                _ => "require",
            };
            (
                StoreTls { mode, roots },
                &["sslmode", "sslrootcert", "sslcertmode"],
                Some(wire),
            )
        }
        StoreKind::Redis => {
            let tls_scheme = url.scheme().eq_ignore_ascii_case("rediss");
            for p in ["ssl_certfile", "ssl_keyfile", "ssl_password"] {
                if get(p).is_some() {
                    return Err(format!(
                        "{p}: client certificates are not supported for the admission store; \
                         authenticate with a password (redis://user:password@host) instead"
                    ));
                }
            }
            if get("ssl_check_hostname").is_some_and(|v| is_false(&v)) {
                return Err(
                    "ssl_check_hostname=false is not supported: give the CA of a \
                     certificate that names the host (ssl_ca_certs=/path), or \
                     ssl_cert_reqs=none to encrypt without checking"
                        .to_owned(),
                );
            }
            let asks = ["ssl_cert_reqs", "ssl_ca_certs"]
                .iter()
                .any(|p| get(p).is_some());
            if !tls_scheme {
                if asks {
                    return Err(
                        "ssl_cert_reqs / ssl_ca_certs ask for TLS, but the scheme is \
                         redis:// (plain TCP); use rediss://"
                            .to_owned(),
                    );
                }
                return Ok(Split {
                    url: raw.to_owned(),
                    tls: StoreTls::PLAIN,
                });
            }
            let unchecked = url.fragment() == Some("insecure");
            let mode = match get("ssl_cert_reqs")
                .map(|v| v.to_ascii_lowercase())
                .as_deref()
            {
                None => {
                    if unchecked {
                        TlsMode::Require
                    } else {
                        TlsMode::VerifyFull
                    }
                }
                Some("none" | "cert_none") => TlsMode::Require,
                Some("required" | "cert_required" | "optional" | "cert_optional") => {
                    if unchecked {
                        return Err(
                            "#insecure contradicts ssl_cert_reqs=required; keep one".to_owned()
                        );
                    }
                    TlsMode::VerifyFull
                }
                Some(other) => {
                    return Err(format!("ssl_cert_reqs={other:?} is not none or required"));
                }
            };
            let roots = match get("ssl_ca_certs").filter(|v| !v.is_empty()) {
                Some(path) => read_roots(Path::new(&path), "ssl_ca_certs")?,
                None => Roots::System,
            };
            url.set_fragment((mode == TlsMode::Require).then_some("insecure"));
            (
                StoreTls { mode, roots },
                &["ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname"],
                None,
            )
        }
    };
    let mut kept: Vec<(String, String)> = pairs
        .into_iter()
        .filter(|(k, _)| !taken.contains(&k.as_str()))
        .collect();
    if let Some(wire) = kept_mode {
        kept.push(("sslmode".to_owned(), wire.to_owned()));
    }
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    Ok(Split {
        url: url.into(),
        tls,
    })
}

fn is_false(v: &str) -> bool {
    matches!(
        v.to_ascii_lowercase().as_str(),
        "false" | "0" | "no" | "off"
    )
}

/// libpq's default root certificate file, when it exists.
fn default_pg_root() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    let path = Path::new(&home).join(".postgresql").join("root.crt");
    path.is_file().then_some(path)
}

/// The certificates of the PEM file at `path`, given as `param` ([`cert_file::read_pem`]).
pub(crate) fn read_roots(path: &Path, param: &str) -> Result<Roots, String> {
    cert_file::read_pem(path, param).map(|pem| Roots::File {
        path: path.to_owned(),
        pem,
    })
}

/// Accepts any certificate, still checking that the server holds its key (libpq's `prefer` and
/// `require`: encrypted, the peer unchecked).
#[derive(Debug)]
struct Unchecked(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Checks the chain against the roots (webpki), and the name unless `name` is false
/// (`verify-ca`). A server certificate that is byte for byte one of the roots (a self-signed
/// certificate given as its own root) is accepted as OpenSSL accepts it, though webpki refuses a
/// CA certificate as an end entity (`CaUsedAsEndEntity`): webpki checks a certificate's
/// validity period before its basic constraints, so that error means the period was checked;
/// the name is then checked here.
#[derive(Debug)]
struct Checked {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    roots: Vec<CertificateDer<'static>>,
    name: bool,
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            )) if !self.name => Ok(ServerCertVerified::assertion()),
            // rustls passes webpki's `CaUsedAsEndEntity` on as an "other" error, by its name.
            Err(rustls::Error::InvalidCertificate(C::Other(other)))
                if other.to_string().contains("CaUsedAsEndEntity")
                    && self.roots.iter().any(|r| r.as_ref() == end_entity.as_ref()) =>
            {
                if self.name {
                    let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
                    rustls::client::verify_server_name(&parsed, server_name)?;
                }
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: &str) -> Split {
        split(StoreKind::Postgres, url).unwrap()
    }

    fn ca_file() -> tempfile::NamedTempFile {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), cert.pem()).unwrap();
        f
    }

    #[test]
    fn postgres_reads_libpq_sslmode_and_hands_tokio_postgres_only_what_it_knows() {
        // No sslmode: libpq's default, prefer.
        let s = pg("postgres://u:pw@h:5432/db?application_name=x");
        assert_eq!(s.tls.mode, TlsMode::Prefer);
        assert_eq!(
            s.url,
            "postgres://u:pw@h:5432/db?application_name=x&sslmode=prefer"
        );
        assert_eq!(
            pg("postgres://h/db?sslmode=allow").tls.mode,
            TlsMode::Prefer
        );
        assert_eq!(
            pg("postgres://h/db?sslmode=disable").tls.mode,
            TlsMode::Disable
        );
        assert_eq!(
            pg("postgres://h/db?sslmode=require").tls.mode,
            TlsMode::Require
        );
        let full = pg("postgres://h/db?sslmode=verify-full&sslrootcert=system");
        assert_eq!(full.tls.mode, TlsMode::VerifyFull);
        assert_eq!(full.tls.roots, Roots::System);
        // verify-* is passed on as require: tokio-postgres knows no other TLS mode.
        assert_eq!(full.url, "postgres://h/db?sslmode=require");
        full.url.parse::<tokio_postgres::Config>().unwrap();
    }

    #[test]
    fn a_root_certificate_makes_require_check_the_chain_as_libpq_does() {
        let ca = ca_file();
        let path = ca.path().display().to_string();
        let s = pg(&format!(
            "postgres://h/db?sslmode=require&sslrootcert={path}"
        ));
        assert_eq!(s.tls.mode, TlsMode::VerifyCa);
        assert!(matches!(&s.tls.roots, Roots::File { path: p, .. } if p == ca.path()));
        assert!(client_config(&s.tls).unwrap().is_some());
        // verify-full keeps its name check.
        let s = pg(&format!(
            "postgres://h/db?sslmode=verify-full&sslrootcert={path}"
        ));
        assert_eq!(s.tls.mode, TlsMode::VerifyFull);
    }

    #[test]
    fn a_roots_file_that_is_not_a_certificate_is_refused_naming_the_parameter() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "not a certificate").unwrap();
        let p = f.path().display();
        let e = split(
            StoreKind::Postgres,
            &format!("postgres://h/db?sslrootcert={p}"),
        )
        .unwrap_err();
        assert!(
            e.starts_with("sslrootcert=") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = split(StoreKind::Redis, &format!("rediss://h?ssl_ca_certs={p}")).unwrap_err();
        assert!(e.starts_with("ssl_ca_certs="), "{e}");
    }

    #[test]
    fn redis_reads_rediss_and_redis_py_parameters() {
        let plain = split(StoreKind::Redis, "redis://:pw@h:6379/0").unwrap();
        assert_eq!(plain.tls, StoreTls::PLAIN);
        assert_eq!(plain.url, "redis://:pw@h:6379/0");
        let full = split(StoreKind::Redis, "rediss://:pw@h:6380/0").unwrap();
        assert_eq!(full.tls.mode, TlsMode::VerifyFull);
        assert_eq!(full.url, "rediss://:pw@h:6380/0");
        for url in [
            "rediss://h:6380/0?ssl_cert_reqs=none",
            "rediss://h:6380/0#insecure",
            "rediss://h:6380/0?ssl_cert_reqs=CERT_NONE",
        ] {
            let s = split(StoreKind::Redis, url).unwrap();
            assert_eq!(s.tls.mode, TlsMode::Require, "{url}");
            // The redis crate's own spelling of "not checked".
            assert_eq!(s.url, "rediss://h:6380/0#insecure", "{url}");
        }
        let ca = ca_file();
        let s = split(
            StoreKind::Redis,
            &format!("rediss://h:6380/0?ssl_ca_certs={}", ca.path().display()),
        )
        .unwrap();
        assert_eq!(s.tls.mode, TlsMode::VerifyFull);
        assert!(matches!(s.tls.roots, Roots::File { .. }));
        assert_eq!(s.url, "rediss://h:6380/0");
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_with_the_parameter_named() {
        for (kind, url, want) in [
            (
                StoreKind::Redis,
                "rediss://h?ssl_certfile=/c.pem",
                "ssl_certfile",
            ),
            (
                StoreKind::Redis,
                "rediss://h?ssl_check_hostname=false",
                "ssl_check_hostname",
            ),
            (
                StoreKind::Redis,
                "rediss://h?ssl_cert_reqs=maybe",
                "ssl_cert_reqs",
            ),
            (
                StoreKind::Redis,
                "rediss://h?ssl_cert_reqs=required#insecure",
                "#insecure",
            ),
            (
                StoreKind::Redis,
                "redis://h?ssl_cert_reqs=none",
                "rediss://",
            ),
            (
                StoreKind::Postgres,
                "postgres://h/db?sslkey=/k.pem",
                "sslkey",
            ),
            (StoreKind::Postgres, "postgres://h/db?sslmode=on", "sslmode"),
        ] {
            let e = split(kind, url).unwrap_err();
            assert!(e.contains(want), "{url}: {e}");
        }
    }

    #[test]
    fn every_mode_builds_a_client_configuration() {
        let ca = ca_file();
        let roots = Roots::File {
            path: ca.path().to_owned(),
            pem: std::fs::read(ca.path()).unwrap(),
        };
        assert!(client_config(&StoreTls::PLAIN).unwrap().is_none());
        for mode in [
            TlsMode::Prefer,
            TlsMode::Require,
            TlsMode::VerifyCa,
            TlsMode::VerifyFull,
        ] {
            let tls = StoreTls {
                mode,
                roots: roots.clone(),
            };
            assert!(client_config(&tls).unwrap().is_some(), "{mode:?}");
            assert!(!tls.describe().is_empty());
        }
    }
}
