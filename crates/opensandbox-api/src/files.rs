//! execd's files and directories: multipart upload, ranged and capped download, info,
//! deletes, `mkdir -p` and listings.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::header::{self, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::exec::Execd;
use crate::multipart::Form;
use crate::transport::{Body, Call, Replay};
use crate::wire::{mode_from_wire, mode_to_wire, open_enum, or_default};

open_enum! {
    /// The type of a file system entry.
    FileType {
        /// A regular file.
        File = "file",
        /// A directory.
        Directory = "directory",
        /// A symbolic link (never followed by listings).
        Symlink = "symlink",
        /// Anything else (a socket, a device ...).
        Special = "other",
    }
}

impl Default for FileType {
    fn default() -> Self {
        FileType::Other(String::new())
    }
}

/// A file system entry as execd describes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct FileInfo {
    /// The absolute path.
    #[serde(deserialize_with = "or_default")]
    pub path: String,
    /// The type.
    #[serde(rename = "type", deserialize_with = "or_default")]
    pub kind: FileType,
    /// Size in bytes.
    #[serde(deserialize_with = "or_default")]
    pub size: u64,
    /// Last change (RFC 3339).
    pub modified_at: Option<String>,
    /// Creation (RFC 3339).
    pub created_at: Option<String>,
    /// Owner name.
    #[serde(deserialize_with = "or_default")]
    pub owner: String,
    /// Group name.
    #[serde(deserialize_with = "or_default")]
    pub group: String,
    /// The mode as the wire carries it: octal digits written as a decimal number (`644`).
    /// See [`FileInfo::permissions`].
    #[serde(deserialize_with = "or_default")]
    pub mode: u32,
    /// Fields this client does not know.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl FileInfo {
    /// The permission bits (`0o644`), or `None` when the wire value is not octal digits.
    pub fn permissions(&self) -> Option<u32> {
        mode_from_wire(self.mode)
    }
}

/// One file of an upload.
#[derive(Clone, PartialEq, Eq)]
pub struct UploadFile {
    /// Where to write it; parent directories are created.
    pub path: String,
    /// The content.
    pub data: Bytes,
    /// Permission bits (`0o644`).
    pub mode: Option<u32>,
    /// Owner name.
    pub owner: Option<String>,
    /// Group name.
    pub group: Option<String>,
}

impl std::fmt::Debug for UploadFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadFile")
            .field("path", &self.path)
            .field("bytes", &self.data.len())
            .field("mode", &self.mode.map(|m| format!("{m:o}")))
            .field("owner", &self.owner)
            .field("group", &self.group)
            .finish()
    }
}

impl UploadFile {
    /// `data` to be written at `path`.
    pub fn new(path: impl Into<String>, data: impl Into<Bytes>) -> Self {
        UploadFile {
            path: path.into(),
            data: data.into(),
            mode: None,
            owner: None,
            group: None,
        }
    }

    /// Permission bits (`0o755`).
    #[must_use]
    pub fn mode(mut self, bits: u32) -> Self {
        self.mode = Some(bits);
        self
    }

    /// Owner and group names.
    #[must_use]
    pub fn owner(mut self, owner: impl Into<String>, group: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self.group = Some(group.into());
        self
    }

    fn metadata(&self) -> Value {
        let mut meta = Map::new();
        meta.insert("path".into(), json!(self.path));
        if let Some(owner) = &self.owner {
            meta.insert("owner".into(), json!(owner));
        }
        if let Some(group) = &self.group {
            meta.insert("group".into(), json!(group));
        }
        if let Some(bits) = self.mode {
            meta.insert("mode".into(), json!(mode_to_wire(bits)));
        }
        Value::Object(meta)
    }
}

/// The `multipart/form-data` body of an upload: per file a `metadata` part (JSON) and then a
/// `file` part, both with a file name (execd reads them from the form's files).
pub(crate) fn upload_form(files: &[UploadFile]) -> Result<(String, Bytes)> {
    let mut form = Form::new();
    for file in files {
        if file.path.is_empty() {
            return Err(Error::InvalidArgument("an upload path is empty".into()));
        }
        let meta = serde_json::to_vec(&file.metadata())
            .map_err(|e| Error::InvalidArgument(format!("cannot encode upload metadata: {e}")))?;
        form.file_part("metadata", "metadata", "application/json", &meta);
        form.file_part("file", &file.path, "application/octet-stream", &file.data);
    }
    Ok(form.finish())
}

/// A byte range of a download: from `start` to `end` included (to the end of the file
/// without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// Last byte, included.
    pub end: Option<u64>,
}

impl ByteRange {
    fn header(self) -> Result<HeaderValue> {
        let text = match self.end {
            Some(end) if end < self.start => {
                return Err(Error::InvalidArgument(format!(
                    "byte range {}-{end} ends before it starts",
                    self.start
                )));
            }
            Some(end) => format!("bytes={}-{end}", self.start),
            None => format!("bytes={}-", self.start),
        };
        HeaderValue::from_str(&text).map_err(|_| Error::InvalidArgument("bad byte range".into()))
    }
}

/// How to download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownloadOptions {
    /// Refuse more than this many bytes: before reading when `Content-Length` says so, and
    /// during the transfer the moment it would be passed.
    pub max_bytes: u64,
    /// Only these bytes.
    pub range: Option<ByteRange>,
}

impl DownloadOptions {
    /// The whole file, at most `max_bytes`.
    pub fn capped(max_bytes: u64) -> Self {
        DownloadOptions {
            max_bytes,
            range: None,
        }
    }

    /// Only `range`.
    #[must_use]
    pub fn range(mut self, range: ByteRange) -> Self {
        self.range = Some(range);
        self
    }
}

/// `Content-Range: bytes start-end/total` of a partial answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// First byte sent.
    pub start: u64,
    /// Last byte sent.
    pub end: u64,
    /// The file's size, when the server said.
    pub total: Option<u64>,
}

fn parse_content_range(raw: &str) -> Option<ContentRange> {
    let rest = raw.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    Some(ContentRange {
        start: start.trim().parse().ok()?,
        end: end.trim().parse().ok()?,
        total: total.trim().parse().ok(),
    })
}

/// A download in progress: a `Stream` of chunks under the byte cap. Dropping it closes the
/// connection.
pub struct Download {
    chunks: BoxStream<'static, Result<Bytes>>,
    content_length: Option<u64>,
    content_range: Option<ContentRange>,
}

impl std::fmt::Debug for Download {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Download")
            .field("content_length", &self.content_length)
            .field("content_range", &self.content_range)
            .finish_non_exhaustive()
    }
}

impl Download {
    /// The answer's `Content-Length`.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// The answer's `Content-Range`, for a ranged download.
    pub fn content_range(&self) -> Option<ContentRange> {
        self.content_range
    }

    /// Everything, in memory (the cap still applies).
    pub async fn bytes(mut self) -> Result<Bytes> {
        let mut all = BytesMut::new();
        while let Some(chunk) = self.chunks.next().await {
            all.extend_from_slice(&chunk?);
        }
        Ok(all.freeze())
    }

    /// Copies everything to `sink`; returns the byte count.
    pub async fn write_to<W: AsyncWrite + Unpin + ?Sized>(mut self, sink: &mut W) -> Result<u64> {
        let mut n = 0u64;
        while let Some(chunk) = self.chunks.next().await {
            let chunk = chunk?;
            sink.write_all(&chunk).await?;
            n += chunk.len() as u64;
        }
        sink.flush().await?;
        Ok(n)
    }
}

impl Stream for Download {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.chunks.poll_next_unpin(cx)
    }
}

/// Chunks of `body`, failing with [`Error::TooLarge`] at the chunk that would pass `cap`
/// (the bytes before it are delivered, that chunk is not).
fn capped(
    body: BoxStream<'static, Result<Bytes>>,
    cap: u64,
    what: String,
) -> BoxStream<'static, Result<Bytes>> {
    futures::stream::unfold(Some((body, 0u64)), move |state| {
        let what = what.clone();
        async move {
            let (mut body, seen) = state?;
            match body.next().await? {
                Ok(chunk) if seen + chunk.len() as u64 > cap => {
                    Some((Err(Error::TooLarge { what, limit: cap }), None))
                }
                Ok(chunk) => {
                    let seen = seen + chunk.len() as u64;
                    Some((Ok(chunk), Some((body, seen))))
                }
                Err(e) => Some((Err(e), None)),
            }
        }
    })
    .boxed()
}

/// `path=` once per path.
fn paths_query(call: Call, paths: &[&str]) -> Result<Call> {
    if paths.is_empty() || paths.iter().any(|p| p.is_empty()) {
        return Err(Error::InvalidArgument(
            "give one or more non-empty paths".into(),
        ));
    }
    Ok(paths.iter().fold(call, |c, p| c.query("path", *p)))
}

/// One directory of [`Execd::make_dirs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDirectory {
    /// The path; parents are created too.
    pub path: String,
    /// Permission bits (`0o755`).
    pub mode: u32,
    /// Owner name.
    pub owner: Option<String>,
    /// Group name.
    pub group: Option<String>,
}

impl NewDirectory {
    /// `path` with mode `mode` (bits, `0o755`).
    pub fn new(path: impl Into<String>, mode: u32) -> Self {
        NewDirectory {
            path: path.into(),
            mode,
            owner: None,
            group: None,
        }
    }
}

impl Execd {
    async fn done(&self, call: Call) -> Result<()> {
        self.client()
            .transport()
            .send(&call, 64 * 1024)
            .await
            .map(|_| ())
    }

    /// `POST /files/upload`: writes files (parents created), in one multipart request with a
    /// `Content-Length`. Sent once, never repeated.
    pub async fn upload(&self, files: &[UploadFile]) -> Result<()> {
        if files.is_empty() {
            return Err(Error::InvalidArgument("nothing to upload".into()));
        }
        let (content_type, body) = upload_form(files)?;
        let content_type = HeaderValue::from_str(&content_type)
            .map_err(|_| Error::InvalidArgument("bad multipart boundary".into()))?;
        let mut call = self.call(Method::POST, &["files", "upload"], Replay::Never)?;
        call.body = Body::Raw(content_type, body);
        self.done(call).await
    }

    /// `GET /files/download?path=`, whole or ranged (`Range: bytes=…`, answered 206), under
    /// `options.max_bytes`. The answer's headers must arrive within the client's timeout, and
    /// then a chunk within each such period ([`Error::Idle`] otherwise). A ranged request the
    /// server answers whole from a later offset is a protocol error.
    pub async fn download(&self, path: &str, options: DownloadOptions) -> Result<Download> {
        if path.is_empty() {
            return Err(Error::InvalidArgument("the download path is empty".into()));
        }
        let mut call = self
            .call(Method::GET, &["files", "download"], Replay::Safe)?
            .query("path", path);
        call.headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/octet-stream"),
        );
        if let Some(range) = options.range {
            call.headers.insert(header::RANGE, range.header()?);
        }
        let t = self.client().transport();
        let wait = t.timeout;
        let route = call.route();
        let resp = t
            .open(&call, wait, || Error::Idle {
                route: route.clone(),
                after: wait,
            })
            .await?;
        let content_length = resp.content_length();
        let content_range = resp
            .headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_content_range);
        let asked_from = options.range.map_or(0, |r| r.start);
        match (resp.status(), content_range) {
            (StatusCode::PARTIAL_CONTENT, Some(r)) if r.start == asked_from => {}
            (StatusCode::PARTIAL_CONTENT, _) => {
                return Err(Error::protocol(format!(
                    "{route}: a 206 answer without a Content-Range starting at {asked_from}"
                )));
            }
            (_, _) if asked_from > 0 => {
                return Err(Error::protocol(format!(
                    "{route}: the server ignored Range (asked from byte {asked_from}, answered HTTP {})",
                    resp.status().as_u16()
                )));
            }
            _ => {}
        }
        let what = format!("download of {path}");
        if let Some(len) = content_length.filter(|&n| n > options.max_bytes) {
            return Err(Error::TooLarge {
                what: format!("{what} (Content-Length {len})"),
                limit: options.max_bytes,
            });
        }
        let chunks = t.chunks(&call, resp, wait);
        Ok(Download {
            chunks: capped(chunks, options.max_bytes, what),
            content_length,
            content_range,
        })
    }

    /// `GET /files/info?path=…`: metadata of each path, by path.
    pub async fn file_info(&self, paths: &[&str]) -> Result<BTreeMap<String, FileInfo>> {
        let call = paths_query(
            self.call(Method::GET, &["files", "info"], Replay::Safe)?,
            paths,
        )?;
        self.client().transport().json(&call).await
    }

    /// `DELETE /files?path=…`: removes files (not directories).
    pub async fn delete_files(&self, paths: &[&str]) -> Result<()> {
        let call = paths_query(self.call(Method::DELETE, &["files"], Replay::Safe)?, paths)?;
        self.done(call).await
    }

    /// `POST /directories`: `mkdir -p` with modes (and owners). Repeated like a read on
    /// transport errors and 5xx: creating a directory that exists changes nothing.
    pub async fn make_dirs(&self, dirs: &[NewDirectory]) -> Result<()> {
        if dirs.is_empty() || dirs.iter().any(|d| d.path.is_empty()) {
            return Err(Error::InvalidArgument(
                "give one or more non-empty directory paths".into(),
            ));
        }
        let body: Map<String, Value> = dirs
            .iter()
            .map(|d| {
                let mut perm = Map::new();
                perm.insert("mode".into(), json!(mode_to_wire(d.mode)));
                if let Some(owner) = &d.owner {
                    perm.insert("owner".into(), json!(owner));
                }
                if let Some(group) = &d.group {
                    perm.insert("group".into(), json!(group));
                }
                (d.path.clone(), Value::Object(perm))
            })
            .collect();
        let call = self
            .call(Method::POST, &["directories"], Replay::Safe)?
            .json(&body)?;
        self.done(call).await
    }

    /// `GET /directories/list?path=&depth=`: the entries below `path`, `depth` levels deep
    /// (1: the children).
    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<FileInfo>> {
        if path.is_empty() {
            return Err(Error::InvalidArgument("the directory path is empty".into()));
        }
        let call = self
            .call(Method::GET, &["directories", "list"], Replay::Safe)?
            .query("path", path)
            .query("depth", depth.to_string());
        let entries: Option<Vec<FileInfo>> = self.client().transport().json(&call).await?;
        Ok(entries.unwrap_or_default())
    }

    /// `DELETE /directories?path=…`: `rm -rf` of each.
    pub async fn delete_dirs(&self, paths: &[&str]) -> Result<()> {
        let call = paths_query(
            self.call(Method::DELETE, &["directories"], Replay::Safe)?,
            paths,
        )?;
        self.done(call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse() {
        assert_eq!(
            parse_content_range("bytes 10-19/100"),
            Some(ContentRange {
                start: 10,
                end: 19,
                total: Some(100)
            })
        );
        assert_eq!(
            parse_content_range("bytes 0-0/*"),
            Some(ContentRange {
                start: 0,
                end: 0,
                total: None
            })
        );
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }

    #[test]
    fn ranges_render_and_refuse_backwards_spans() {
        let r = ByteRange {
            start: 5,
            end: Some(9),
        };
        assert_eq!(r.header().unwrap(), "bytes=5-9");
        assert_eq!(
            ByteRange {
                start: 5,
                end: None
            }
            .header()
            .unwrap(),
            "bytes=5-"
        );
        assert!(
            ByteRange {
                start: 5,
                end: Some(4)
            }
            .header()
            .is_err()
        );
    }

    #[test]
    fn file_info_decodes_leniently_and_modes_read_as_octal() {
        let info: FileInfo = serde_json::from_value(json!({
            "path": "/w/a", "type": "fifo", "size": null, "mode": 644, "owner": "root", "inode": 7
        }))
        .unwrap();
        assert_eq!(info.kind, FileType::Other("fifo".into()));
        assert_eq!(info.size, 0);
        assert_eq!(info.permissions(), Some(0o644));
        assert_eq!(info.extra["inode"], json!(7));
    }

    #[test]
    fn upload_metadata_omits_what_is_unset() {
        let f = UploadFile::new("/w/a", "x").mode(0o600);
        assert_eq!(f.metadata(), json!({"path": "/w/a", "mode": 600}));
        let f = UploadFile::new("/w/b", "y").owner("u", "g");
        assert_eq!(
            f.metadata(),
            json!({"path": "/w/b", "owner": "u", "group": "g"})
        );
    }
}
