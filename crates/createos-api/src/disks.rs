//! S3-compatible persistent disks (`/v1/disks`) and their mounts in sandboxes.
//!
//! Credentials go to the server on create and rotate and never come back; this crate holds them
//! as [`SecretString`]s that never appear in `Debug` output.

use std::fmt;
use std::sync::Arc;

use futures::stream::BoxStream;
use reqwest::Method;
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

use crate::transport::{Transport, paginate, seg};
use crate::wire_enum::{is_false, lenient_enum, nullable, protocol_error};
use crate::{Client, PaginationOptions, RequestOptions, Result, Sandbox};

lenient_enum! {
    /// Storage backend of a disk.
    pub enum DiskKind {
        /// An S3-compatible bucket.
        S3 => "s3",
    }
}

lenient_enum! {
    /// Mount state of a disk inside a sandbox.
    pub enum MountStatus {
        /// Not mounted yet.
        Pending => "pending",
        /// Mounted.
        Mounted => "mounted",
        /// Mounting failed; see `mount_error`.
        Error => "error",
        /// Being unmounted.
        Unmounting => "unmounting",
    }
}

/// Where the bucket lives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct DiskConfig {
    /// Bucket name.
    #[serde(deserialize_with = "nullable")]
    pub bucket: String,
    /// S3 endpoint URL.
    #[serde(deserialize_with = "nullable")]
    pub endpoint: String,
    /// Region; omitted when empty.
    #[serde(
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub region: String,
    /// Use path-style addressing; omitted when false.
    #[serde(skip_serializing_if = "is_false", deserialize_with = "nullable")]
    pub use_path_style: bool,
}

impl DiskConfig {
    /// A config for `bucket` at `endpoint`.
    pub fn new(bucket: impl Into<String>, endpoint: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            endpoint: endpoint.into(),
            ..Self::default()
        }
    }

    /// Sets the region.
    #[must_use]
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = region.into();
        self
    }

    /// Sets path-style addressing.
    #[must_use]
    pub fn use_path_style(mut self, yes: bool) -> Self {
        self.use_path_style = yes;
        self
    }
}

/// Bucket credentials. Both halves are secrets and are redacted from `Debug`.
#[derive(Clone)]
pub struct DiskCredentials {
    /// Access key id.
    pub access_key: SecretString,
    /// Secret access key.
    pub secret_key: SecretString,
}

impl DiskCredentials {
    /// Credentials from an access key and a secret key.
    pub fn new(access_key: impl Into<SecretString>, secret_key: impl Into<SecretString>) -> Self {
        Self {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
        }
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "access_key": self.access_key.expose_secret(),
            "secret_key": self.secret_key.expose_secret(),
        })
    }
}

impl fmt::Debug for DiskCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskCredentials")
            .field("access_key", &"[REDACTED]")
            .field("secret_key", &"[REDACTED]")
            .finish()
    }
}

/// A persistent disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Disk {
    /// Disk id (`disk_…`).
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// Unique name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Backend kind.
    #[serde(deserialize_with = "nullable")]
    pub kind: DiskKind,
    /// Bucket location.
    #[serde(deserialize_with = "nullable")]
    pub config: DiskConfig,
    /// Creation time (RFC 3339).
    #[serde(deserialize_with = "nullable")]
    pub created_at: String,
}

/// Body of `POST /v1/disks`.
#[derive(Debug, Clone)]
pub struct DiskCreateRequest {
    /// Unique name (`^[a-z0-9][a-z0-9-]{0,62}$`).
    pub name: String,
    /// Backend kind (only `s3` today).
    pub kind: DiskKind,
    /// Bucket location.
    pub config: DiskConfig,
    /// Bucket credentials.
    pub credentials: DiskCredentials,
}

impl DiskCreateRequest {
    /// An S3 disk request.
    pub fn s3(name: impl Into<String>, config: DiskConfig, credentials: DiskCredentials) -> Self {
        Self {
            name: name.into(),
            kind: DiskKind::S3,
            config,
            credentials,
        }
    }

    fn to_json(&self) -> Result<serde_json::Value> {
        Ok(serde_json::json!({
            "name": self.name,
            "kind": self.kind,
            "config": serde_json::to_value(&self.config).map_err(|e| protocol_error(e.to_string()))?,
            "credentials": self.credentials.to_json(),
        }))
    }
}

/// A disk as mounted in one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SandboxDisk {
    /// The disk's id.
    #[serde(deserialize_with = "nullable")]
    pub disk_id: String,
    /// The disk's name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Backend kind.
    #[serde(deserialize_with = "nullable")]
    pub kind: DiskKind,
    /// Bucket location.
    #[serde(deserialize_with = "nullable")]
    pub config: DiskConfig,
    /// Mount point inside the guest.
    #[serde(deserialize_with = "nullable")]
    pub mount_path: String,
    /// Sub-path of the bucket that is mounted.
    #[serde(deserialize_with = "nullable")]
    pub sub_path: String,
    /// Mount state.
    #[serde(deserialize_with = "nullable")]
    pub mount_status: MountStatus,
    /// Why mounting failed, when it did.
    pub mount_error: Option<String>,
}

/// Options for [`Sandbox::attach_disk`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachDiskOptions {
    /// Disk id.
    pub disk_id: String,
    /// Absolute mount point inside the guest.
    pub mount_path: String,
    /// Sub-path of the bucket (relative, no `..`); omitted when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_path: String,
}

impl AttachDiskOptions {
    /// Mount `disk_id` at `mount_path`.
    pub fn new(disk_id: impl Into<String>, mount_path: impl Into<String>) -> Self {
        Self {
            disk_id: disk_id.into(),
            mount_path: mount_path.into(),
            sub_path: String::new(),
        }
    }
}

/// Options for [`Sandbox::detach_disk`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DetachDiskOptions {
    /// Disk id.
    pub disk_id: String,
    /// The mount point to remove (sent as the `mount_path` query).
    pub mount_path: String,
}

impl DetachDiskOptions {
    /// Unmount `disk_id` from `mount_path`.
    pub fn new(disk_id: impl Into<String>, mount_path: impl Into<String>) -> Self {
        Self {
            disk_id: disk_id.into(),
            mount_path: mount_path.into(),
        }
    }
}

#[derive(Deserialize)]
struct Deleted {
    #[serde(default, deserialize_with = "nullable")]
    deleted: bool,
}

#[derive(Deserialize)]
struct Detached {
    #[serde(default, deserialize_with = "nullable")]
    detached: bool,
}

#[derive(Deserialize)]
struct Attached {
    #[serde(default)]
    id: Option<String>,
}

/// Disk operations; get it from [`Client::disks`].
#[derive(Clone)]
pub struct Disks {
    transport: Arc<Transport>,
    options: RequestOptions,
}

impl fmt::Debug for Disks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Disks").finish_non_exhaustive()
    }
}

impl Client {
    /// Persistent disks of this account.
    pub fn disks(&self) -> Disks {
        Disks {
            transport: Arc::clone(self.transport()),
            options: RequestOptions::default(),
        }
    }
}

impl Disks {
    /// The same service with `options` applied to every call.
    #[must_use]
    pub fn with_options(mut self, options: RequestOptions) -> Self {
        self.options = options;
        self
    }

    /// All disks, page by page (legacy list key `disks` accepted).
    pub fn list(&self, pagination: PaginationOptions) -> BoxStream<'static, Result<Disk>> {
        paginate(
            Arc::clone(&self.transport),
            "/v1/disks".to_owned(),
            pagination.query(),
            Some("disks"),
            self.options.clone(),
        )
    }

    /// Registers a disk.
    pub async fn create(&self, request: &DiskCreateRequest) -> Result<Disk> {
        self.transport
            .json(
                Method::POST,
                "/v1/disks",
                &[],
                Some(request.to_json()?),
                &self.options,
            )
            .await
    }

    /// Fetches a disk by id or name.
    pub async fn get(&self, id_or_name: &str) -> Result<Disk> {
        self.transport
            .json(Method::GET, &path(id_or_name), &[], None, &self.options)
            .await
    }

    /// Deletes a disk (the bucket's contents are untouched). Returns the server's `deleted`.
    pub async fn delete(&self, id_or_name: &str) -> Result<bool> {
        let deleted: Deleted = self
            .transport
            .json(Method::DELETE, &path(id_or_name), &[], None, &self.options)
            .await?;
        Ok(deleted.deleted)
    }

    /// Replaces the disk's bucket credentials (`PATCH`).
    pub async fn rotate_credentials(
        &self,
        id_or_name: &str,
        credentials: &DiskCredentials,
    ) -> Result<Disk> {
        let body = serde_json::json!({ "credentials": credentials.to_json() });
        self.transport
            .json(
                Method::PATCH,
                &path(id_or_name),
                &[],
                Some(body),
                &self.options,
            )
            .await
    }
}

fn path(id_or_name: &str) -> String {
    format!("/v1/disks/{}", seg(id_or_name))
}

impl Sandbox {
    /// Disks mounted in this sandbox, page by page (legacy list key `disks` accepted).
    pub fn list_disks(
        &self,
        pagination: PaginationOptions,
    ) -> BoxStream<'static, Result<SandboxDisk>> {
        paginate(
            Arc::clone(self.transport()),
            format!("/v1/sandboxes/{}/disks", seg(self.id())),
            pagination.query(),
            Some("disks"),
            RequestOptions::default(),
        )
    }

    /// Mounts a disk into this running sandbox. The server must answer with this sandbox's
    /// `id`; anything else is a protocol error.
    pub async fn attach_disk(&self, options: &AttachDiskOptions) -> Result<()> {
        let body = serde_json::to_value(options).map_err(|e| protocol_error(e.to_string()))?;
        let attached: Attached = self
            .transport()
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{}/disks", seg(self.id())),
                &[],
                Some(body),
                &RequestOptions::default(),
            )
            .await?;
        match attached.id {
            Some(id) if id == self.id() => Ok(()),
            Some(id) => Err(protocol_error(format!(
                "disk attach answered for sandbox {id:?}, expected {:?}",
                self.id()
            ))),
            None => Err(protocol_error("disk attach response has no sandbox id")),
        }
    }

    /// Unmounts a disk from `mount_path`. Returns the server's `detached`.
    pub async fn detach_disk(&self, options: &DetachDiskOptions) -> Result<bool> {
        let detached: Detached = self
            .transport()
            .json(
                Method::DELETE,
                &format!(
                    "/v1/sandboxes/{}/disks/{}",
                    seg(self.id()),
                    seg(&options.disk_id)
                ),
                &[("mount_path", options.mount_path.clone())],
                None,
                &RequestOptions::default(),
            )
            .await?;
        Ok(detached.detached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn create_body_omits_defaults_and_debug_hides_credentials() {
        let req = DiskCreateRequest::s3(
            "data",
            DiskConfig::new("bkt", "https://s3.example.test"),
            DiskCredentials::new("AKIDSECRET", "shhh-secret"),
        );
        assert_eq!(
            req.to_json().unwrap(),
            json!({
                "name": "data", "kind": "s3",
                "config": {"bucket": "bkt", "endpoint": "https://s3.example.test"},
                "credentials": {"access_key": "AKIDSECRET", "secret_key": "shhh-secret"}
            })
        );
        let debug = format!("{req:?}");
        assert!(
            !debug.contains("AKIDSECRET") && !debug.contains("shhh"),
            "{debug}"
        );
        let full = DiskConfig::new("b", "e").region("eu").use_path_style(true);
        assert_eq!(
            serde_json::to_value(&full).unwrap(),
            json!({"bucket": "b", "endpoint": "e", "region": "eu", "use_path_style": true})
        );
    }

    #[test]
    fn sandbox_disk_decodes_unknown_mount_status() {
        let d: SandboxDisk = serde_json::from_value(json!({
            "disk_id": "disk_1", "mount_status": "remounting", "config": null, "mount_error": null
        }))
        .unwrap();
        assert_eq!(d.mount_status, MountStatus::Unknown("remounting".into()));
        assert_eq!(d.config, DiskConfig::default());
    }

    #[test]
    fn attach_options_omit_empty_sub_path() {
        let o = AttachDiskOptions::new("disk_1", "/mnt/data");
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            json!({"disk_id": "disk_1", "mount_path": "/mnt/data"})
        );
    }
}
