//! Account-level private overlay networks (`/v1/networks`) and sandbox membership.

use std::sync::Arc;

use futures::stream::BoxStream;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::transport::{Transport, paginate, seg};
use crate::wire_enum::nullable;
use crate::{Client, PaginationOptions, RequestOptions, Result, Sandbox};

/// One sandbox attached to a network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct NetworkMember {
    /// The member sandbox's id.
    #[serde(deserialize_with = "nullable")]
    pub sandbox_id: String,
    /// Membership status as the server reports it (free-form).
    #[serde(deserialize_with = "nullable")]
    pub status: String,
    /// The sandbox's private IP on this network (wire key `ip`).
    #[serde(rename = "ip", deserialize_with = "nullable")]
    pub ip_address: String,
    /// The member sandbox's name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
}

/// A private overlay network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Network {
    /// Network id.
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// Network name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Creation time (RFC 3339).
    #[serde(deserialize_with = "nullable")]
    pub created_at: String,
    /// Number of members (on list rows).
    #[serde(deserialize_with = "nullable")]
    pub member_count: u64,
    /// The members (on the detail GET).
    #[serde(deserialize_with = "nullable")]
    pub members: Vec<NetworkMember>,
}

/// Body of `POST /v1/networks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkCreateRequest {
    /// Network name.
    pub name: String,
}

impl NetworkCreateRequest {
    /// A request for a network called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// Network operations; get it from [`Client::networks`].
#[derive(Clone)]
pub struct Networks {
    transport: Arc<Transport>,
    options: RequestOptions,
}

impl std::fmt::Debug for Networks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Networks").finish_non_exhaustive()
    }
}

impl Client {
    /// Private overlay networks of this account.
    pub fn networks(&self) -> Networks {
        Networks {
            transport: Arc::clone(self.transport()),
            options: RequestOptions::default(),
        }
    }
}

impl Networks {
    /// The same service with `options` applied to every call.
    #[must_use]
    pub fn with_options(mut self, options: RequestOptions) -> Self {
        self.options = options;
        self
    }

    /// All networks, page by page.
    pub fn list(&self, pagination: PaginationOptions) -> BoxStream<'static, Result<Network>> {
        paginate(
            Arc::clone(&self.transport),
            "/v1/networks".to_owned(),
            pagination.query(),
            None,
            self.options.clone(),
        )
    }

    /// Creates a network.
    pub async fn create(&self, request: &NetworkCreateRequest) -> Result<Network> {
        let body = serde_json::json!({ "name": request.name });
        self.transport
            .json(Method::POST, "/v1/networks", &[], Some(body), &self.options)
            .await
    }

    /// Fetches a network with its members.
    pub async fn get(&self, id: &str) -> Result<Network> {
        self.transport
            .json(
                Method::GET,
                &format!("/v1/networks/{}", seg(id)),
                &[],
                None,
                &self.options,
            )
            .await
    }

    /// Deletes a network (detach its members first).
    pub async fn delete(&self, id: &str) -> Result<()> {
        self.transport
            .unit(
                Method::DELETE,
                &format!("/v1/networks/{}", seg(id)),
                &[],
                None,
                &self.options,
            )
            .await
    }
}

impl Sandbox {
    /// Attaches this sandbox to the network `network_id`.
    pub async fn attach_network(&self, network_id: &str) -> Result<()> {
        let body = serde_json::json!({ "id": network_id });
        self.transport()
            .unit(
                Method::POST,
                &format!("/v1/sandboxes/{}/networks", seg(self.id())),
                &[],
                Some(body),
                &RequestOptions::default(),
            )
            .await
    }

    /// Detaches this sandbox from the network `network_id`.
    pub async fn detach_network(&self, network_id: &str) -> Result<()> {
        self.transport()
            .unit(
                Method::DELETE,
                &format!(
                    "/v1/sandboxes/{}/networks/{}",
                    seg(self.id()),
                    seg(network_id)
                ),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn network_reads_members_and_ip() {
        let n: Network = serde_json::from_value(json!({
            "id": "net_1", "name": "mesh", "member_count": 1,
            "members": [{"sandbox_id": "sb_1", "status": "attached", "ip": "10.0.0.2", "name": "a"}]
        }))
        .unwrap();
        assert_eq!(n.members[0].ip_address, "10.0.0.2");
        assert_eq!(n.members[0].sandbox_id, "sb_1");
        let listed: Network =
            serde_json::from_value(json!({"id": "net_1", "members": null})).unwrap();
        assert!(listed.members.is_empty());
    }
}
