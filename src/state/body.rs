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
/// followed by one `,`; a top-level array is flattened one level, into at most `max_messages`
/// messages (`TooLarge` past that). `[]` is an error for appends (`allow_empty_array` is set
/// for creates).
///
/// The split builds no value tree and no list of the messages: each element is validated and
/// copied into the stored body as the parser passes it, so a JSON body costs its stored copy
/// (never longer than the body plus one byte) and 4 bytes per message (its end).
pub(crate) fn prepare_body(
    json: bool,
    data: Bytes,
    allow_empty_array: bool,
    max_messages: usize,
) -> Result<Body> {
    if data.is_empty() {
        return Ok(Body::default());
    }
    if !json {
        let len = u32::try_from(data.len()).map_err(|_| Error::TooLarge("append body".into()))?;
        return Ok(Body::new(data, Ends::One(len)));
    }
    let text = std::str::from_utf8(&data).map_err(|e| Error::InvalidJson(e.to_string()))?;
    let trimmed = text.trim_start_matches([' ', '\t', '\n', '\r']);
    // An array's elements are stored without the brackets, each followed by a `,` instead of
    // the separator before the next: never longer than the body. A single value gains one `,`.
    let mut split = Split {
        out: BytesMut::with_capacity(data.len() + 1),
        ends: Vec::new(),
        max: max_messages,
        refused: None,
    };
    let parsed = if trimmed.starts_with('[') {
        let mut de = serde_json::Deserializer::from_str(text);
        serde::Deserializer::deserialize_seq(&mut de, &mut split).and_then(|()| de.end())
    } else {
        serde_json::from_str::<&RawValue>(text).map(|v| {
            // One value is one message: the cap (at least 1) never refuses it.
            let _ = split.push(v);
        })
    };
    if let Some(refusal) = split.refused.take() {
        return Err(refusal);
    }
    parsed.map_err(|e| Error::InvalidJson(e.to_string()))?;
    if split.ends.is_empty() {
        return if allow_empty_array {
            Ok(Body::default())
        } else {
            Err(Error::EmptyJsonArray)
        };
    }
    Ok(Body::new(split.out.freeze(), split.ends))
}

/// The stored body a JSON split builds as the parser hands it each message.
struct Split {
    out: BytesMut,
    ends: Vec<u32>,
    /// The most messages it takes.
    max: usize,
    /// Why it stopped the parse (a limit, not the JSON), if it did.
    refused: Option<Error>,
}

impl Split {
    /// Stores one message and its end; `Err` (and `refused` set) past a limit.
    fn push(&mut self, v: &RawValue) -> std::result::Result<(), ()> {
        if self.ends.len() == self.max {
            self.refused = Some(Error::TooLarge(format!(
                "a JSON append of more than {} messages",
                self.max
            )));
            return Err(());
        }
        self.out.extend_from_slice(v.get().as_bytes());
        self.out.extend_from_slice(b",");
        let Ok(end) = u32::try_from(self.out.len()) else {
            self.refused = Some(Error::TooLarge("append body".into()));
            return Err(());
        };
        self.ends.push(end);
        Ok(())
    }
}

impl<'de> serde::de::Visitor<'de> for &mut Split {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        while let Some(v) = seq.next_element::<&'de RawValue>()? {
            if self.push(v).is_err() {
                return Err(serde::de::Error::custom("limit"));
            }
        }
        Ok(())
    }
}
