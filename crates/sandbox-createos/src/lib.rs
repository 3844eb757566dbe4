//! CreateOS's control-plane client behind sandbox-core's seam: [`CreateOsControlPlane`]
//! implements `sandbox_core::control::ControlPlane` over the `createos-api` client (every call
//! this package makes to CreateOS), and [`install`] makes it the connector of every session the
//! process builds (`sandbox_core::session::install_connector`), the way `sandbox-store` installs
//! the admission store's driver. sandbox-core holds the CreateOS provider's policy over that
//! trait ([`sandbox_core::provider::createos::CreateOs`]) and never names `createos-api`.
//!
//! - [`client`]: the calls, their error mapping ([`map_error`], the key redacted), the proxy a
//!   control plane goes through ([`proxy_for`]) and a URL as it is shown ([`shown_url`]).
//! - [`http_connector`]: the connector itself, for a session built by hand.

pub mod client;

use std::sync::Arc;
use std::time::Duration;

pub use client::{
    CreateOsControlPlane, DEFAULT_REQUEST_TIMEOUT, FIND_BY_NAME_TIMEOUT_FACTOR, MAX_RETRY_AFTER,
    map_error, proxy_for, shown_url,
};
use sandbox_core::control::ControlPlane;
use sandbox_core::session::Connector;
use sandbox_core::settings::Settings;

/// The connector that talks HTTP to the CreateOS control plane of the settings (its key, its
/// base URL), each control call bounded by the duration it is given.
pub fn http_connector() -> Connector {
    Arc::new(|s: &Settings, timeout: Duration| {
        let key = s.require_key()?;
        let cp = CreateOsControlPlane::new(key, &s.base_url, timeout)?;
        Ok(Arc::new(cp) as Arc<dyn ControlPlane>)
    })
}

/// Installs [`http_connector`] as the process's CreateOS connector
/// (`sandbox_core::session::install_connector`), which `sandbox_core::session::http_connector`,
/// a default `Session` and default surface options use. Calling it again is harmless.
pub fn install() {
    sandbox_core::session::install_connector(http_connector());
}

#[cfg(test)]
mod tests {
    /// sandbox-core reads the key under the names, and in the order, of `createos-api` (which
    /// the SDK and this client use): one key for every surface.
    #[test]
    fn the_core_reads_the_key_as_the_client_does() {
        use sandbox_core::settings::{ENV_API_KEY, ENV_API_KEY_FALLBACK, api_key_from};
        assert_eq!(ENV_API_KEY, createos_api::ENV_SANDBOX_API_KEY);
        assert_eq!(ENV_API_KEY_FALLBACK, createos_api::ENV_API_KEY);
        assert_eq!(
            sandbox_core::provider::ProviderKind::CreateOs.key_setting(),
            ENV_API_KEY
        );
        assert_eq!(
            sandbox_core::provider::ProviderKind::CreateOs.address_setting(),
            createos_api::ENV_BASE_URL
        );
        for env in [
            vec![
                ("CREATEOS_SANDBOX_API_KEY", "a-key-1"),
                ("CREATEOS_API_KEY", "b-key-2"),
            ],
            vec![
                ("CREATEOS_SANDBOX_API_KEY", "  "),
                ("CREATEOS_API_KEY", "b-key-2"),
            ],
            vec![("CREATEOS_API_KEY", "b-key-2")],
            vec![],
        ] {
            let lookup = |k: &str| {
                env.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            };
            let core = api_key_from(&lookup);
            let client = createos_api::api_key_from(&lookup).map(|(k, n)| {
                use secrecy::ExposeSecret as _;
                (k.expose_secret().to_owned(), n)
            });
            assert_eq!(core, client);
        }
    }
}
