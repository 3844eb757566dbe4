//! A guest frame's JSON, admitted by the executor's bounds, built straight into Python objects
//! (`dict`, `list`, `str`, `int`, `float`, `bool`, `None`, as `json.loads` builds them).
//!
//! The bytes are read once, with the GIL held: no JSON text is copied into a Python `str` or
//! `bytes` first, so a frame costs the host its own bytes plus the objects, and the glue gets
//! nothing the Rust side did not count. Object keys up to [`MEMO_KEY_BYTES`] long are shared
//! between the objects of one payload, as `json.loads` shares them.

use std::collections::HashMap;
use std::fmt;

use pyo3::IntoPyObjectExt as _;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList, PyString};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The longest key shared between objects.
const MEMO_KEY_BYTES: usize = 64;
/// The most distinct keys shared in one payload (more are built one by one).
const MEMO_KEYS: usize = 4096;

/// Builds the Python value of `json` (an admitted payload). A Python failure (out of memory)
/// is returned as it was raised; JSON that does not parse (never the case for a payload that
/// passed the census) as a `ValueError`.
pub(crate) fn to_python<'py>(py: Python<'py>, json: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let mut build = Build {
        py,
        keys: HashMap::new(),
        failed: None,
    };
    let mut de = serde_json::Deserializer::from_slice(json);
    let result = Node(&mut build)
        .deserialize(&mut de)
        .and_then(|value| de.end().map(|()| value));
    match result {
        Ok(value) => Ok(value),
        Err(e) => Err(build
            .failed
            .take()
            .unwrap_or_else(|| pyo3::exceptions::PyValueError::new_err(e.to_string()))),
    }
}

struct Build<'py> {
    py: Python<'py>,
    keys: HashMap<Box<str>, Bound<'py, PyString>>,
    failed: Option<PyErr>,
}

impl<'py> Build<'py> {
    fn check<T, E: de::Error>(&mut self, r: PyResult<T>) -> Result<T, E> {
        r.map_err(|e| {
            self.failed = Some(e);
            E::custom("a Python object could not be built")
        })
    }

    fn key(&mut self, key: &str) -> Bound<'py, PyString> {
        if key.len() > MEMO_KEY_BYTES {
            return PyString::new(self.py, key);
        }
        if let Some(shared) = self.keys.get(key) {
            return shared.clone();
        }
        let made = PyString::new(self.py, key);
        if self.keys.len() < MEMO_KEYS {
            self.keys.insert(key.into(), made.clone());
        }
        made
    }
}

struct Node<'b, 'py>(&'b mut Build<'py>);

impl<'de, 'py> DeserializeSeed<'de> for Node<'_, 'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, 'py> Visitor<'de> for Node<'_, 'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(PyBool::new(self.0.py, v).to_owned().into_any())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        let r = v.into_bound_py_any(self.0.py);
        self.0.check(r)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        let r = v.into_bound_py_any(self.0.py);
        self.0.check(r)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(PyFloat::new(self.0.py, v).into_any())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(PyString::new(self.0.py, v).into_any())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.0.py.None().into_bound(self.0.py))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Node(&mut *self.0))? {
            items.push(item);
        }
        let list = PyList::new(self.0.py, items);
        Ok(self.0.check(list)?.into_any())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.0.py);
        while let Some(key) = map.next_key_seed(Key(&mut *self.0))? {
            let value = map.next_value_seed(Node(&mut *self.0))?;
            let set = dict.set_item(key, value);
            self.0.check(set)?;
        }
        Ok(dict.into_any())
    }
}

struct Key<'b, 'py>(&'b mut Build<'py>);

impl<'de, 'py> DeserializeSeed<'de> for Key<'_, 'py> {
    type Value = Bound<'py, PyString>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'py> Visitor<'_> for Key<'_, 'py> {
    type Value = Bound<'py, PyString>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.key(v))
    }
}
