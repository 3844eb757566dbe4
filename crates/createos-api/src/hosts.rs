//! Control-plane hosts (`GET /v1/hosts`, admin-visible).

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::transport::paginate;
use crate::wire_enum::{lenient_enum, nullable};
use crate::{Client, PaginationOptions, RequestOptions, Result};

lenient_enum! {
    /// Scheduling state of a host.
    pub enum HostStatus {
        /// Accepting new sandboxes.
        Active => "active",
        /// Keeps its sandboxes but takes no new ones.
        Draining => "draining",
        /// Unreachable.
        Dead => "dead",
    }
}

/// One host of the control plane.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Host {
    /// Host id (usable as `host_id` when creating a sandbox).
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// Scheduling state.
    #[serde(deserialize_with = "nullable")]
    pub status: HostStatus,
    /// Free memory in MiB.
    #[serde(deserialize_with = "nullable")]
    pub free_mib: u64,
    /// Number of microVMs on the host.
    #[serde(deserialize_with = "nullable")]
    pub vm_count: u64,
    /// Root filesystems available on the host.
    #[serde(deserialize_with = "nullable")]
    pub rootfses: Vec<String>,
}

impl Client {
    /// All hosts, page by page.
    pub fn list_hosts(&self, pagination: PaginationOptions) -> BoxStream<'static, Result<Host>> {
        self.list_hosts_with(pagination, RequestOptions::default())
    }

    /// [`Client::list_hosts`] with per-request options applied to every page.
    pub fn list_hosts_with(
        &self,
        pagination: PaginationOptions,
        options: RequestOptions,
    ) -> BoxStream<'static, Result<Host>> {
        paginate(
            Arc::clone(self.transport()),
            "/v1/hosts".to_owned(),
            pagination.query(),
            None,
            options,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_decodes_leniently() {
        let h: Host = serde_json::from_value(serde_json::json!({
            "id": "h1", "status": "quarantined", "free_mib": 2048, "rootfses": null
        }))
        .unwrap();
        assert_eq!(h.status, HostStatus::Unknown("quarantined".into()));
        assert_eq!(h.free_mib, 2048);
        assert!(h.rootfses.is_empty());
        assert_eq!(HostStatus::from("draining"), HostStatus::Draining);
    }
}
