//! What a gateway is started with: the secret, its limits and how it resolves names.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::allowlist::normalize_host;
use crate::token::Secret;

/// How the gateway turns a host name into addresses.
#[derive(Debug, Clone)]
pub(crate) enum Resolver {
    /// The system resolver (`getaddrinfo` through tokio), with the name made absolute so no
    /// search domain applies.
    System,
    /// A fixed name → addresses map and nothing else; set only by
    /// [`GatewayConfig::with_test_only_resolver`].
    TestOnly(HashMap<String, Vec<IpAddr>>),
}

/// A gateway's settings. [`GatewayConfig::new`] gives the defaults documented on each field;
/// the limits are public fields.
///
/// Every limit is kept in this process's memory: with several replicas behind one address, a
/// credential's limits apply per replica.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub(crate) secret: Secret,
    pub(crate) resolver: Resolver,
    /// Connections one credential may have open at once (default 64).
    pub max_connections_per_credential: u32,
    /// Connections the gateway serves at once, all credentials together (default 4096; fewer,
    /// with a warning, when the process may not open 3 files per connection). When all are
    /// taken, a new connection closes the one that has waited longest without sending its
    /// request head; with none such, it waits to be accepted.
    pub max_connections: usize,
    /// Bytes one credential may move through the gateway, both directions and all its
    /// connections together, counted as they are copied (default 8 GiB).
    pub max_bytes_per_credential: u64,
    /// A connection with no byte in either direction for this long is closed (default 60 s).
    pub idle_timeout: Duration,
    /// The longest a connection may stay open, busy or not (default 1 h).
    pub max_connection_lifetime: Duration,
    /// How long a client has to send its request head, and then its TLS `ClientHello`
    /// (default 10 s).
    pub handshake_timeout: Duration,
    /// How long resolving a name, and then connecting to it, may take (default 10 s).
    pub connect_timeout: Duration,
    /// The largest request head (request line and headers) accepted, in bytes; at least 8192
    /// (default 16 KiB).
    pub max_request_head_bytes: usize,
}

impl GatewayConfig {
    /// The defaults, with the system resolver.
    pub fn new(secret: Secret) -> Self {
        Self {
            secret,
            resolver: Resolver::System,
            max_connections_per_credential: 64,
            max_connections: 4096,
            max_bytes_per_credential: 8 << 30,
            idle_timeout: Duration::from_secs(60),
            max_connection_lifetime: Duration::from_secs(3600),
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_request_head_bytes: 16 * 1024,
        }
    }

    /// **For tests only**: resolve names from `map` (name → addresses) and nothing else; a name
    /// not in it does not resolve. Addresses are still checked like any DNS answer. Names are
    /// normalised; an invalid one is an error naming it.
    pub fn with_test_only_resolver<I>(mut self, map: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = (String, Vec<IpAddr>)>,
    {
        let mut table: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (name, addrs) in map {
            let host = normalize_host(&name).map_err(|e| format!("{name:?}: {e}"))?;
            table.entry(host).or_default().extend(addrs);
        }
        self.resolver = Resolver::TestOnly(table);
        Ok(self)
    }

    /// Whether names come from [`GatewayConfig::with_test_only_resolver`].
    pub fn uses_test_only_resolver(&self) -> bool {
        matches!(self.resolver, Resolver::TestOnly(_))
    }
}
