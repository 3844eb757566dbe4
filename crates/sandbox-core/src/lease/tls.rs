//! The TLS of a connection to the admission store, as data: what a store URL asks for
//! ([`StoreTls`]: a libpq-style [`TlsMode`] and the [`Roots`] a certificate is checked
//! against) and what a connection negotiated ([`Transport`], for `doctor`). Reading it from a
//! URL (libpq's `sslmode` / `sslrootcert`, `rediss://` and redis-py's `ssl_*` parameters) and
//! making the handshakes is the store driver's (the `sandbox-store` crate, over rustls): the core
//! only holds the answer and shows it.

use std::fmt;
use std::path::PathBuf;

/// How much of the connection to the store is secured, in libpq's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it (PostgreSQL), its certificate not checked; plain TCP
    /// otherwise.
    Prefer,
    /// TLS always, the certificate not checked.
    Require,
    /// TLS always, the certificate's chain checked against the roots, not its name.
    VerifyCa,
    /// TLS always, the certificate's chain and name checked.
    VerifyFull,
}

impl TlsMode {
    /// libpq's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Prefer => "prefer",
            TlsMode::Require => "require",
            TlsMode::VerifyCa => "verify-ca",
            TlsMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the certificate's chain is checked against the roots (`verify-ca`,
    /// `verify-full`).
    pub fn checks_chain(self) -> bool {
        matches!(self, TlsMode::VerifyCa | TlsMode::VerifyFull)
    }
}

/// The certificates a server's is checked against.
#[derive(Clone, PartialEq, Eq)]
pub enum Roots {
    /// The system's store (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set).
    System,
    /// A PEM file's certificates, read when the setting was read.
    File {
        /// Where they were read from.
        path: PathBuf,
        /// Its PEM text.
        pem: Vec<u8>,
    },
}

impl fmt::Debug for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Roots::System => f.write_str("System"),
            Roots::File { path, .. } => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// The TLS of a store connection, read from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreTls {
    /// How much is secured.
    pub mode: TlsMode,
    /// What a checked certificate is checked against.
    pub roots: Roots,
}

impl StoreTls {
    /// Plain TCP.
    pub const PLAIN: StoreTls = StoreTls {
        mode: TlsMode::Disable,
        roots: Roots::System,
    };

    /// How it reads in messages and `doctor`: `TLS verify-full (roots: /etc/ca.pem)`.
    pub fn describe(&self) -> String {
        let roots = match &self.roots {
            Roots::System => "the system's".to_owned(),
            Roots::File { path, .. } => path.display().to_string(),
        };
        match self.mode {
            TlsMode::Disable => "plain TCP".to_owned(),
            TlsMode::Prefer => "TLS if the server offers it, certificate not checked".to_owned(),
            TlsMode::Require => "TLS, certificate not checked".to_owned(),
            TlsMode::VerifyCa => format!("TLS, certificate chain checked (roots: {roots})"),
            TlsMode::VerifyFull => {
                format!("TLS, certificate and host name checked (roots: {roots})")
            }
        }
    }
}

/// What a store connection negotiated, as `doctor` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP: nothing is encrypted.
    PlainTcp,
    /// A Unix socket (a PostgreSQL on the same host): no TLS, nothing leaves the host.
    UnixSocket,
    /// TLS as negotiated.
    Tls {
        /// `TLS 1.3` or `TLS 1.2`.
        version: String,
        /// The cipher suite, e.g. `TLS13_AES_256_GCM_SHA384`.
        cipher: String,
    },
}

impl Transport {
    /// Whether it is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls { .. })
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::PlainTcp => f.write_str("plain TCP (not encrypted)"),
            Transport::UnixSocket => f.write_str("a Unix socket (local, not encrypted)"),
            Transport::Tls { version, cipher } if cipher.is_empty() => f.write_str(version),
            Transport::Tls { version, cipher } => write!(f, "{version} ({cipher})"),
        }
    }
}
