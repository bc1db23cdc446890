//! An append body in the stored representation ([`Body`]: the bytes and each message's end)
//! and the conversion of a request body to it ([`prepare_body`]: JSON validated and flattened).

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use crate::error::{Error, Result};

/// An append body in the stored representation: the bytes to write and each message's end,
/// relative to the body's start.
#[derive(Clone, Debug, Default)]
pub(crate) struct Body {
    pub(crate) data: Bytes,
    pub(crate) ends: Ends,
    /// The CRC-32 of `data` when the body is one message, once someone computed it: the
    /// journal's encoder computes it for a large body (and folds it into the frame's CRC), and
    /// the segment index, which keeps each message's CRC, takes it from here instead of hashing
    /// the same bytes again.
    pub(crate) crc: std::sync::OnceLock<u32>,
}

/// The messages' ends of a [`Body`], relative to its start, strictly increasing; read as a
/// slice. A one-message body (every append to a byte stream) keeps its one end inline, so it
/// allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ends {
    /// One message, ending here.
    One(u32),
    /// Any number of messages (none for an empty body).
    Many(Vec<u32>),
}

impl Default for Ends {
    fn default() -> Self {
        Ends::Many(Vec::new())
    }
}

impl std::ops::Deref for Ends {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        match self {
            Ends::One(end) => std::slice::from_ref(end),
            Ends::Many(ends) => ends,
        }
    }
}

impl From<Vec<u32>> for Ends {
    fn from(ends: Vec<u32>) -> Self {
        match ends.as_slice() {
            [end] => Ends::One(*end),
            _ => Ends::Many(ends),
        }
    }
}

impl Body {
    /// A body of `data` whose messages end at `ends`.
    pub(crate) fn new(data: Bytes, ends: impl Into<Ends>) -> Body {
        Body {
            data,
            ends: ends.into(),
            crc: std::sync::OnceLock::new(),
        }
    }

    /// The CRC-32 of a one-message body, computed at most once.
    pub(crate) fn single_crc(&self) -> u32 {
        *self.crc.get_or_init(|| crc32fast::hash(&self.data))
    }

    /// The number of messages in the body.
    pub(crate) fn messages(&self) -> u64 {
        self.ends.len() as u64
    }
}

/// Converts a request body to the stored representation, validating JSON.
///
/// Byte streams store the body as one message. JSON streams store each message's JSON text
/// followed by one `,`; a top-level array is flattened one level. `[]` is an error for appends
/// (`allow_empty_array` is set for creates).
pub(crate) fn prepare_body(json: bool, data: Bytes, allow_empty_array: bool) -> Result<Body> {
    if data.is_empty() {
        return Ok(Body::default());
    }
    if !json {
        let len = u32::try_from(data.len()).map_err(|_| Error::TooLarge("append body".into()))?;
        return Ok(Body::new(data, Ends::One(len)));
    }
    let text = std::str::from_utf8(&data).map_err(|e| Error::InvalidJson(e.to_string()))?;
    let trimmed = text.trim_start_matches([' ', '\t', '\n', '\r']);
    let values: Vec<&RawValue> = if trimmed.starts_with('[') {
        serde_json::from_str(text).map_err(|e| Error::InvalidJson(e.to_string()))?
    } else {
        vec![serde_json::from_str(text).map_err(|e| Error::InvalidJson(e.to_string()))?]
    };
    if values.is_empty() {
        return if allow_empty_array {
            Ok(Body::default())
        } else {
            Err(Error::EmptyJsonArray)
        };
    }
    let mut out = BytesMut::with_capacity(data.len() + values.len());
    let mut ends = Vec::with_capacity(values.len());
    for v in values {
        out.extend_from_slice(v.get().as_bytes());
        out.extend_from_slice(b",");
        ends.push(u32::try_from(out.len()).map_err(|_| Error::TooLarge("append body".into()))?);
    }
    Ok(Body::new(out.freeze(), ends))
}
