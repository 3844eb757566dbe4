//! Pagination: walking limit/offset list pages lazily as one stream of rows.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Transport;
use crate::error::{Error, Result};
use crate::options::RequestOptions;

/// Split a list page into rows and an optional total (§1.9): a bare array,
/// `{data, pagination}`, or a legacy key.
fn page_rows(data: Value, legacy_key: Option<&str>) -> Result<(Vec<Value>, Option<u64>)> {
    match data {
        Value::Array(rows) => Ok((rows, None)),
        Value::Null => Ok((Vec::new(), None)),
        Value::Object(mut obj) => {
            let total = obj
                .get("pagination")
                .and_then(|p| p.get("total"))
                .and_then(Value::as_u64);
            let rows = match obj.remove("data") {
                Some(Value::Array(rows)) => rows,
                Some(Value::Null) | None => match legacy_key.and_then(|k| obj.remove(k)) {
                    Some(Value::Array(rows)) => rows,
                    Some(Value::Null) | None => Vec::new(),
                    Some(_) => {
                        return Err(Error::protocol("list response: legacy key is not an array"));
                    }
                },
                Some(_) => return Err(Error::protocol("list response: `data` is not an array")),
            };
            Ok((rows, total))
        }
        _ => Err(Error::protocol(
            "list response is neither an array nor an object",
        )),
    }
}

/// Default page size when the caller gave none.
const DEFAULT_PAGE: u64 = 100;
/// The server's largest page.
const MAX_PAGE: u64 = 500;

/// The most pages one list walk requests (1000, so 500 000 rows at the largest page size);
/// a walk that has not ended by then fails with a protocol error rather than run forever.
pub const MAX_PAGES: u32 = 1000;

/// A fingerprint of a page's rows, to notice a server that answers the same page again.
fn page_fingerprint(rows: &[Value]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in rows {
        r.to_string().hash(&mut h);
    }
    rows.len().hash(&mut h);
    h.finish()
}

struct Pager {
    t: Arc<Transport>,
    path: String,
    query: Vec<(&'static str, String)>,
    legacy: Option<&'static str>,
    opts: RequestOptions,
    offset: u64,
    limit: u64,
    buffered: VecDeque<Value>,
    done: bool,
    pages: u32,
    last_page: Option<u64>,
}

/// Walk limit/offset pages lazily, yielding rows. `query` may carry `limit` (page size,
/// capped at 500) and `offset` (start); both are replaced by the walk.
///
/// The walk ends on an empty page, a page shorter than asked, a page identical to the one
/// before (a server ignoring `offset`), a missing `total` or `offset + rows >= total`; a
/// `total` that is never reached cannot keep it going. After [`MAX_PAGES`] pages it fails
/// with a protocol error.
pub(crate) fn paginate<T: DeserializeOwned + Send + 'static>(
    t: Arc<Transport>,
    path: String,
    query: Vec<(&'static str, String)>,
    legacy_key: Option<&'static str>,
    opts: RequestOptions,
) -> BoxStream<'static, Result<T>> {
    let mut limit = DEFAULT_PAGE;
    let mut offset = 0;
    let mut rest = Vec::new();
    for (k, v) in query {
        match k {
            "limit" => limit = v.parse().unwrap_or(DEFAULT_PAGE),
            "offset" => offset = v.parse().unwrap_or(0),
            _ => rest.push((k, v)),
        }
    }
    let pager = Pager {
        t,
        path,
        query: rest,
        legacy: legacy_key,
        opts,
        offset,
        limit: limit.clamp(1, MAX_PAGE),
        buffered: VecDeque::new(),
        done: false,
        pages: 0,
        last_page: None,
    };
    stream::unfold(Some(pager), |state| async move {
        let mut p = state?;
        loop {
            if let Some(row) = p.buffered.pop_front() {
                let item = p.t.decode_data::<T>(row, &p.path);
                return match item {
                    Ok(v) => Some((Ok(v), Some(p))),
                    Err(e) => Some((Err(e), None)),
                };
            }
            if p.done {
                return None;
            }
            if p.pages >= MAX_PAGES {
                return Some((
                    Err(Error::protocol(format!(
                        "list {} did not end after {MAX_PAGES} pages",
                        p.path
                    ))),
                    None,
                ));
            }
            p.pages += 1;
            let mut q: Vec<(&str, String)> = p.query.iter().map(|(k, v)| (*k, v.clone())).collect();
            q.push(("limit", p.limit.to_string()));
            q.push(("offset", p.offset.to_string()));
            let page =
                p.t.json_value(Method::GET, &p.path, &q, None, &p.opts)
                    .await;
            let (rows, total) = match page.and_then(|d| page_rows(d, p.legacy)) {
                Ok(x) => x,
                Err(e) => return Some((Err(e), None)),
            };
            let n = rows.len() as u64;
            let fingerprint = page_fingerprint(&rows);
            if p.last_page == Some(fingerprint) {
                // The same rows again: the server ignores `offset`; they were yielded already.
                return None;
            }
            p.last_page = Some(fingerprint);
            match total {
                Some(total) if n >= p.limit && p.offset + n < total => p.offset += n,
                _ => p.done = true,
            }
            p.buffered.extend(rows);
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rows_accepts_every_documented_shape() {
        let (rows, total) = page_rows(serde_json::json!([1, 2]), None).unwrap();
        assert_eq!((rows.len(), total), (2, None));
        let (rows, total) = page_rows(
            serde_json::json!({"data": [1], "pagination": {"total": 9}}),
            None,
        )
        .unwrap();
        assert_eq!((rows.len(), total), (1, Some(9)));
        let (rows, _) = page_rows(
            serde_json::json!({"templates": [1, 2, 3]}),
            Some("templates"),
        )
        .unwrap();
        assert_eq!(rows.len(), 3);
        assert!(page_rows(serde_json::json!("x"), None).is_err());
    }
}
