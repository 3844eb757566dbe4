//! A `multipart/form-data` body built in memory, so it goes out with a `Content-Length` (the
//! server's proxy does not pass chunked multipart on).

use bytes::{BufMut, Bytes, BytesMut};

/// A form body under construction.
pub(crate) struct Form {
    boundary: String,
    body: BytesMut,
}

impl Form {
    /// A form with a fresh random boundary (128 bits: no file content can be made to contain
    /// it, since nobody knows it in advance).
    pub(crate) fn new() -> Form {
        Form::with_boundary(format!("opensandbox-{:032x}", rand::random::<u128>()))
    }

    pub(crate) fn with_boundary(boundary: String) -> Form {
        Form {
            boundary,
            body: BytesMut::new(),
        }
    }

    /// Appends a part carrying a file name (execd reads both its parts from the form's files,
    /// which in Go's parser needs one).
    pub(crate) fn file_part(
        &mut self,
        name: &str,
        filename: &str,
        content_type: &str,
        data: &[u8],
    ) {
        let head = format!(
            "--{}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{}\"\r\nContent-Type: {content_type}\r\n\r\n",
            self.boundary,
            header_safe(filename)
        );
        self.body.reserve(head.len() + data.len() + 2);
        self.body.put_slice(head.as_bytes());
        self.body.put_slice(data);
        self.body.put_slice(b"\r\n");
    }

    /// The `Content-Type` header value and the finished body.
    pub(crate) fn finish(mut self) -> (String, Bytes) {
        self.body
            .put_slice(format!("--{}--\r\n", self.boundary).as_bytes());
        (
            format!("multipart/form-data; boundary={}", self.boundary),
            self.body.freeze(),
        )
    }
}

/// A file name that cannot break out of its quoted header parameter: the last path
/// component, with every character but `A-Za-z0-9._-` replaced by `_` (execd ignores the
/// name; the target path travels in the metadata part).
fn header_safe(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or_default();
    let safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "file".to_owned()
    } else {
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_follow_rfc_7578_with_crlf_and_a_closing_delimiter() {
        let mut form = Form::with_boundary("B".into());
        form.file_part(
            "metadata",
            "metadata",
            "application/json",
            br#"{"path":"/w/a b"}"#,
        );
        form.file_part(
            "file",
            "/w/a b\"\r\n.txt",
            "application/octet-stream",
            b"\x00hi\r\n",
        );
        let (content_type, body) = form.finish();
        assert_eq!(content_type, "multipart/form-data; boundary=B");
        assert_eq!(
            &body[..],
            &b"--B\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\
Content-Type: application/json\r\n\r\n{\"path\":\"/w/a b\"}\r\n\
--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a_b___.txt\"\r\n\
Content-Type: application/octet-stream\r\n\r\n\x00hi\r\n\r\n--B--\r\n"[..]
        );
    }

    #[test]
    fn boundaries_are_fresh() {
        let a = Form::new().finish().0;
        let b = Form::new().finish().0;
        assert_ne!(a, b);
        assert!(a.len() > "multipart/form-data; boundary=opensandbox-".len() + 30);
    }

    #[test]
    fn names_fall_back_to_file() {
        assert_eq!(header_safe("/dir/"), "file");
        assert_eq!(header_safe("é.py"), "_.py");
    }
}
