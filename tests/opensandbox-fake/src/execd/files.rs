//! execd's files and directories routes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use futures::TryStreamExt;
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{Guest, err, success_null};
use crate::http::{json_response, q, q_all};
use crate::util::{mode_to_octal_digits, octal_digits_to_mode, rfc3339};

/// Largest JSON body of the directory routes.
const MAX_JSON: usize = 4 * 1024 * 1024;

/// `POST /files/upload`: multipart `metadata` + `file` pairs, in order. Like execd (whose form
/// parser files only parts that carry a filename under `File`), both parts of a pair must carry
/// a `filename`; parent directories are created.
pub(crate) async fn upload(guest: &Guest, headers: &HeaderMap, body: Body) -> Response {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let Ok(boundary) = multer::parse_boundary(ctype) else {
        return err(400, "INVALID_FILE", "multipart form is empty");
    };
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let mut form = multer::Multipart::new(stream, boundary);
    let mut metas: Vec<Value> = Vec::new();
    let mut written = 0_usize;
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                return err(
                    400,
                    "INVALID_FILE",
                    format!("multipart form is invalid: {e}"),
                );
            }
        };
        let name = field.name().unwrap_or_default().to_owned();
        let has_filename = field.file_name().is_some();
        match name.as_str() {
            "metadata" if has_filename => {
                let bytes = match field.bytes().await {
                    Ok(b) => b,
                    Err(e) => {
                        return err(
                            400,
                            "INVALID_FILE_METADATA",
                            format!("error reading metadata content. {e}"),
                        );
                    }
                };
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(v @ Value::Object(_)) => metas.push(v),
                    Ok(_) | Err(_) => {
                        return err(
                            400,
                            "INVALID_FILE_METADATA",
                            "invalid metadata format. expected a JSON object",
                        );
                    }
                }
            }
            "file" if has_filename => {
                let Some(meta) = metas.get(written).cloned() else {
                    return err(400, "INVALID_FILE_METADATA", "metadata file is missing");
                };
                let target = meta.get("path").and_then(Value::as_str).unwrap_or_default();
                if target.is_empty() {
                    return err(400, "INVALID_FILE_METADATA", "metadata path is empty");
                }
                let host = match guest.host_file(target) {
                    Ok(h) => h,
                    Err(e) => {
                        return err(
                            500,
                            "RUNTIME_ERROR",
                            format!("error resolving target path {target}. {e}"),
                        );
                    }
                };
                if let Some(parent) = host.parent()
                    && let Err(e) = tokio::fs::create_dir_all(parent).await
                {
                    return err(
                        500,
                        "RUNTIME_ERROR",
                        format!("error creating target directory. {e}"),
                    );
                }
                if let Err(e) = write_field(field, &host).await {
                    return err(
                        500,
                        "RUNTIME_ERROR",
                        format!("error copying file {target}. {e}"),
                    );
                }
                let mode = meta
                    .get("mode")
                    .and_then(Value::as_i64)
                    .filter(|m| *m != 0)
                    .map_or(Some(0o644), octal_digits_to_mode);
                let Some(mode) = mode else {
                    return err(
                        500,
                        "RUNTIME_ERROR",
                        format!("error chmoding file {target}. invalid mode"),
                    );
                };
                if let Err(e) =
                    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode))
                {
                    return err(
                        500,
                        "RUNTIME_ERROR",
                        format!("error chmoding file {target}. {e}"),
                    );
                }
                written += 1;
            }
            "metadata" => return err(400, "INVALID_FILE_METADATA", "metadata file is missing"),
            "file" => return err(400, "INVALID_FILE_CONTENT", "file is missing"),
            _ => {}
        }
    }
    if metas.is_empty() {
        return err(400, "INVALID_FILE_METADATA", "metadata file is missing");
    }
    if written == 0 {
        return err(400, "INVALID_FILE_CONTENT", "file is missing");
    }
    if written != metas.len() {
        return err(
            400,
            "INVALID_FILE",
            format!(
                "metadata and file count mismatch: {} vs {written}",
                metas.len()
            ),
        );
    }
    success_null()
}

async fn write_field(mut field: multer::Field<'_>, host: &Path) -> std::io::Result<()> {
    let mut f = tokio::fs::File::create(host).await?;
    while let Some(chunk) = field.chunk().await.map_err(std::io::Error::other)? {
        f.write_all(&chunk).await?;
    }
    f.flush().await?;
    f.sync_all().await
}

/// A `Range: bytes=...` header against a file of `size` bytes: `(start, length)` of the first
/// range; `Err` when it cannot be satisfied.
pub(crate) fn parse_range(value: &str, size: u64) -> Result<(u64, u64), ()> {
    let spec = value.trim().strip_prefix("bytes=").ok_or(())?;
    let first = spec.split(',').next().ok_or(())?.trim();
    let (a, b) = first.split_once('-').ok_or(())?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 || size == 0 {
            return Err(());
        }
        let n = n.min(size);
        return Ok((size - n, n));
    }
    let start: u64 = a.parse().map_err(|_| ())?;
    if start >= size {
        return Err(());
    }
    let end = if b.is_empty() {
        size - 1
    } else {
        let e: u64 = b.parse().map_err(|_| ())?;
        if e < start {
            return Err(());
        }
        e.min(size - 1)
    };
    Ok((start, end - start + 1))
}

/// `GET /files/download?path=`: the file, a `Range` of it (206), or lines `offset`..`offset +
/// limit` (1-based) as text.
pub(crate) async fn download(
    guest: &Guest,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> Response {
    let Some(path) = q(query, "path").filter(|p| !p.is_empty()) else {
        return err(400, "MISSING_QUERY", "missing query parameter 'path'");
    };
    let host = match guest.host_file(path) {
        Ok(h) => h,
        Err(e) => {
            return err(
                500,
                "RUNTIME_ERROR",
                format!("error resolving file path: {path}. {e}"),
            );
        }
    };
    if let (Some(o), Some(l)) = (q(query, "offset"), q(query, "limit")) {
        return line_range(&host, path, o, l).await;
    }
    let mut file = match tokio::fs::File::open(&host).await {
        Ok(f) => f,
        Err(e) => return file_error(path, &e),
    };
    let meta = match file.metadata().await {
        Ok(m) if m.is_dir() => {
            return err(
                500,
                "RUNTIME_ERROR",
                format!("error reading file {path}: is a directory"),
            );
        }
        Ok(m) => m,
        Err(e) => return file_error(path, &e),
    };
    let size = meta.len();
    let name = host
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let disposition = if name.is_ascii() {
        format!("attachment; filename=\"{}\"", name.replace('"', "\\\""))
    } else {
        let enc = crate::util::percent_encode_path(&name);
        format!("attachment; filename=\"{enc}\"; filename*=UTF-8''{enc}")
    };
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(|v| parse_range(v, size));
    let (status, start, len) = match range {
        None => (200, 0, size),
        Some(Ok((s, l))) => (206, s, l),
        Some(Err(())) => {
            return Response::builder()
                .status(416)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::CONTENT_RANGE, format!("bytes */{size}"))
                .body(Body::from(json!({"code": "UNKNOWN"}).to_string()))
                .unwrap_or_default();
        }
    };
    if start > 0 && file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return err(500, "RUNTIME_ERROR", "seek failed");
    }
    let stream = tokio_util::io::ReaderStream::new(file.take(len));
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_DISPOSITION, disposition)
        .header(header::CONTENT_LENGTH, len.to_string())
        .header(header::ACCEPT_RANGES, "bytes");
    if status == 206 {
        b = b.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", start + len - 1),
        );
    }
    b.body(Body::from_stream(stream)).unwrap_or_default()
}

async fn line_range(host: &Path, path: &str, offset: &str, limit: &str) -> Response {
    let Some(offset) = offset.parse::<usize>().ok().filter(|o| *o >= 1) else {
        return err(
            400,
            "INVALID_PARAMETER",
            "offset must be a positive integer (1-based)",
        );
    };
    let Some(limit) = limit.parse::<usize>().ok().filter(|l| *l >= 1) else {
        return err(400, "INVALID_PARAMETER", "limit must be a positive integer");
    };
    let data = match tokio::fs::read(host).await {
        Ok(d) => d,
        Err(e) => return file_error(path, &e),
    };
    let mut lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let mut out = Vec::new();
    for line in lines.into_iter().skip(offset - 1).take(limit) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(out))
        .unwrap_or_default()
}

fn file_error(path: &str, e: &std::io::Error) -> Response {
    if e.kind() == std::io::ErrorKind::NotFound {
        err(
            404,
            "FILE_NOT_FOUND",
            format!("file not found. open {path}: no such file or directory"),
        )
    } else {
        err(500, "RUNTIME_ERROR", format!("error accessing file: {e}"))
    }
}

fn user_name(uid: u32) -> String {
    lookup_name("/etc/passwd", uid).unwrap_or_else(|| uid.to_string())
}

fn group_name(gid: u32) -> String {
    lookup_name("/etc/group", gid).unwrap_or_else(|| gid.to_string())
}

fn lookup_name(file: &str, id: u32) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.split(':');
        let name = parts.next()?;
        let _pw = parts.next()?;
        let num: u32 = parts.next()?.parse().ok()?;
        (num == id).then(|| name.to_owned())
    })
}

fn mtime(m: &std::fs::Metadata) -> OffsetDateTime {
    m.modified()
        .ok()
        .map_or(OffsetDateTime::UNIX_EPOCH, OffsetDateTime::from)
}

/// A `FileInfo` of `host` (reported under the guest path `shown`), without following a link.
fn file_info(host: &Path, shown: &str) -> std::io::Result<Value> {
    let m = std::fs::symlink_metadata(host)?;
    let kind = if m.file_type().is_symlink() {
        "symlink"
    } else if m.is_dir() {
        "directory"
    } else if m.is_file() {
        "file"
    } else {
        "other"
    };
    let created = m
        .created()
        .ok()
        .map_or_else(|| mtime(&m), OffsetDateTime::from);
    Ok(json!({
        "path": shown,
        "size": m.len(),
        "modified_at": rfc3339(mtime(&m)),
        "created_at": rfc3339(created),
        "owner": user_name(m.uid()),
        "group": group_name(m.gid()),
        "mode": mode_to_octal_digits(m.permissions().mode()),
        "type": kind,
    }))
}

/// `GET /files/info?path=...` (repeatable): `{path: FileInfo}`; a missing path is a 404.
pub(crate) fn info(guest: &Guest, query: &[(String, String)]) -> Response {
    let mut out = Map::new();
    for path in q_all(query, "path") {
        let host = match guest.host_file(path) {
            Ok(h) => h,
            Err(e) => return err(500, "RUNTIME_ERROR", e),
        };
        match file_info(&host, path) {
            Ok(v) => {
                out.insert(path.to_owned(), v);
            }
            Err(e) => return file_error(path, &e),
        }
    }
    json_response(200, &Value::Object(out))
}

/// `DELETE /files?path=...` (repeatable); a missing file is not an error.
pub(crate) fn remove_files(guest: &Guest, query: &[(String, String)]) -> Response {
    for path in q_all(query, "path") {
        let host = match guest.host_file(path) {
            Ok(h) => h,
            Err(e) => return err(500, "RUNTIME_ERROR", e),
        };
        match std::fs::remove_file(&host) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return err(
                    500,
                    "RUNTIME_ERROR",
                    format!("error removing file {path}. {e}"),
                );
            }
        }
    }
    success_null()
}

/// `POST /directories` with `{path: {mode, owner, group}}`: `mkdir -p` with each mode.
pub(crate) async fn make_dirs(guest: &Guest, body: Body) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, MAX_JSON).await else {
        return err(400, "INVALID_REQUEST_BODY", "error reading request body");
    };
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(&bytes) else {
        return err(
            400,
            "INVALID_REQUEST_BODY",
            "error parsing request, MAYBE invalid body format. expected {path: permission}",
        );
    };
    for (path, perm) in &req {
        let host = match guest.host_file(path) {
            Ok(h) => h,
            Err(e) => return err(500, "RUNTIME_ERROR", e),
        };
        if let Err(e) = std::fs::create_dir_all(&host) {
            return file_error(path, &e);
        }
        let mode = perm
            .get("mode")
            .and_then(Value::as_i64)
            .filter(|m| *m != 0)
            .map_or(Some(0o755), octal_digits_to_mode)
            .unwrap_or(0o755);
        if let Err(e) = std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode)) {
            return err(
                500,
                "RUNTIME_ERROR",
                format!("error changing permissions for {path}. {e}"),
            );
        }
    }
    success_null()
}

/// `GET /directories/list?path=&depth=1`: entries in lexical order, descendants after their
/// parent up to `depth` levels, symlinks reported and never followed.
pub(crate) fn list_dir(guest: &Guest, query: &[(String, String)]) -> Response {
    let Some(path) = q(query, "path").filter(|p| !p.is_empty()) else {
        return err(400, "MISSING_QUERY", "missing query parameter 'path'");
    };
    let depth = match q(query, "depth") {
        None => 1,
        Some(d) => match d.parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => return err(400, "INVALID_PARAMETER", "depth must be a positive integer"),
        },
    };
    let host = match guest.host_file(path) {
        Ok(h) => h,
        Err(e) => return err(500, "RUNTIME_ERROR", e),
    };
    match std::fs::symlink_metadata(&host) {
        Err(e) => return file_error(path, &e),
        Ok(m) if m.file_type().is_symlink() => {
            return err(
                400,
                "INVALID_PARAMETER",
                format!("{path} is a symbolic link"),
            );
        }
        Ok(m) if !m.is_dir() => {
            return err(
                400,
                "INVALID_PARAMETER",
                format!("{path} is not a directory"),
            );
        }
        Ok(_) => {}
    }
    let mut out = Vec::new();
    if let Err(e) = walk(guest, &host, depth, &mut out) {
        return err(
            500,
            "RUNTIME_ERROR",
            format!("error listing directory {path}. {e}"),
        );
    }
    json_response(200, &Value::Array(out))
}

fn walk(guest: &Guest, dir: &Path, depth: u32, out: &mut Vec<Value>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        let p = e.path();
        out.push(file_info(&p, &guest.guest_file(&p))?);
        let ft = e.file_type()?;
        if depth > 1 && ft.is_dir() && !ft.is_symlink() {
            walk(guest, &p, depth - 1, out)?;
        }
    }
    Ok(())
}

/// `DELETE /directories?path=...` (repeatable): `rm -rf`.
pub(crate) fn remove_dirs(guest: &Guest, query: &[(String, String)]) -> Response {
    for path in q_all(query, "path") {
        let host = match guest.host_file(path) {
            Ok(h) => h,
            Err(e) => return err(500, "RUNTIME_ERROR", e),
        };
        if guest.guest_file(&host) == "/" {
            return err(
                500,
                "RUNTIME_ERROR",
                "refusing to remove the guest's root directory",
            );
        }
        match std::fs::remove_dir_all(&host) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return err(
                    500,
                    "RUNTIME_ERROR",
                    format!("error removing directory {path}. {e}"),
                );
            }
        }
    }
    success_null()
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range("bytes=0-3", 10), Ok((0, 4)));
        assert_eq!(parse_range("bytes=5-", 10), Ok((5, 5)));
        assert_eq!(parse_range("bytes=-3", 10), Ok((7, 3)));
        assert_eq!(parse_range("bytes=8-100", 10), Ok((8, 2)));
        assert_eq!(parse_range("bytes=-30", 10), Ok((0, 10)));
        assert!(parse_range("bytes=10-", 10).is_err());
        assert!(parse_range("bytes=4-2", 10).is_err());
        assert!(parse_range("items=0-1", 10).is_err());
        assert!(parse_range("bytes=0-0", 0).is_err());
    }
}
