//! The mirror's progress per destination stream: one JSON file in the state directory, replaced
//! atomically (write a temporary file, fsync it, rename it over the old one, fsync the
//! directory).
//!
//! The file is a lower bound of what the destination holds, except for `pending`: before an
//! append whose source range a later read could answer differently (a JSON batch or a byte
//! chunk that ends where the tail happened to be), the range is recorded durably, so a restart
//! resends exactly those messages with the same producer sequence number and the destination
//! drops the duplicate.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::MirrorError;

/// An append that was (or was about to be) sent: resent as it was after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Its producer sequence number.
    pub(crate) seq: u64,
    /// The source offset it starts at.
    pub(crate) from: String,
    /// The source offset after it.
    pub(crate) to: String,
    /// Messages (JSON) or bytes (a byte chunk) it carries.
    pub(crate) count: u64,
}

/// One destination stream's progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The source stream's `Stream-Incarnation` (empty when the source sends none): a source
    /// stream created again is another stream, not more of this one.
    pub(crate) incarnation: String,
    /// Whether the destination stream was created.
    pub(crate) created: bool,
    /// The next producer sequence number.
    pub(crate) next_seq: u64,
    /// The source offset the next append starts at.
    pub(crate) next_offset: String,
    /// The destination's `Stream-Next-Offset` after the last acknowledged append (or the
    /// create).
    pub(crate) dest_next: String,
    /// A source offset and the destination offset holding the same messages before it: where
    /// the source's latest snapshot goes.
    pub(crate) mark: Option<(String, String)>,
    /// The source snapshot offset last copied.
    pub(crate) snapshot: Option<String>,
    /// Whether the destination was closed.
    pub(crate) closed: bool,
    /// The append in flight, if one may have been sent.
    pub(crate) pending: Option<Pending>,
}

/// The state file of the destination stream `dest_url` inside `dir`: named by a digest of the
/// URL, so any name fits.
pub(crate) fn path_for(dir: &Path, dest_url: &str) -> PathBuf {
    let digest = Sha256::digest(dest_url.as_bytes());
    let mut hex = String::with_capacity(32);
    for b in &digest[..16] {
        let _ = write!(hex, "{b:02x}");
    }
    dir.join(format!("{hex}.json"))
}

/// A string member of `v`.
fn text(v: &Value, key: &str) -> Result<String, String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("no string '{key}'"))
}

impl Progress {
    /// Progress before anything was copied from the source stream `incarnation`, starting at
    /// the source offset `from`.
    pub(crate) fn new(incarnation: String, from: String) -> Progress {
        Progress {
            incarnation,
            created: false,
            next_seq: 0,
            next_offset: from,
            dest_next: String::new(),
            mark: None,
            snapshot: None,
            closed: false,
            pending: None,
        }
    }

    /// The file's JSON.
    fn to_json(&self) -> Value {
        json!({
            "version": 1,
            "incarnation": self.incarnation,
            "created": self.created,
            "nextSeq": self.next_seq,
            "nextOffset": self.next_offset,
            "destNext": self.dest_next,
            "mark": self.mark.as_ref().map(|(s, d)| json!([s, d])),
            "snapshot": self.snapshot,
            "closed": self.closed,
            "pending": self.pending.as_ref().map(|p| json!({
                "seq": p.seq, "from": p.from, "to": p.to, "count": p.count,
            })),
        })
    }

    /// Parses the file's JSON.
    fn from_json(v: &Value) -> Result<Progress, String> {
        if v.get("version").and_then(Value::as_u64) != Some(1) {
            return Err("unknown version".into());
        }
        let pair = |v: &Value| -> Option<(String, String)> {
            Some((
                v.get(0)?.as_str()?.to_owned(),
                v.get(1)?.as_str()?.to_owned(),
            ))
        };
        let pending = match v.get("pending") {
            None | Some(Value::Null) => None,
            Some(p) => Some(Pending {
                seq: p.get("seq").and_then(Value::as_u64).ok_or("pending.seq")?,
                from: text(p, "from")?,
                to: text(p, "to")?,
                count: p
                    .get("count")
                    .and_then(Value::as_u64)
                    .ok_or("pending.count")?,
            }),
        };
        Ok(Progress {
            incarnation: text(v, "incarnation")?,
            created: v.get("created").and_then(Value::as_bool).unwrap_or(false),
            next_seq: v.get("nextSeq").and_then(Value::as_u64).ok_or("nextSeq")?,
            next_offset: text(v, "nextOffset")?,
            dest_next: text(v, "destNext")?,
            mark: v.get("mark").and_then(pair),
            snapshot: v.get("snapshot").and_then(Value::as_str).map(str::to_owned),
            closed: v.get("closed").and_then(Value::as_bool).unwrap_or(false),
            pending,
        })
    }

    /// The progress in `path`, or `None` if there is no such file.
    pub(crate) fn load(path: &Path) -> Result<Option<Progress>, MirrorError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(MirrorError::State(path.to_owned(), e.to_string())),
        };
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| MirrorError::State(path.to_owned(), e.to_string()))?;
        Progress::from_json(&v)
            .map(Some)
            .map_err(|e| MirrorError::State(path.to_owned(), e))
    }

    /// Replaces `path` with this progress: durable when `sync` (temporary file fsynced, renamed,
    /// directory fsynced), otherwise only renamed (a lost write leaves the older lower bound).
    pub(crate) fn save(&self, path: &Path, sync: bool) -> Result<(), MirrorError> {
        let fail = |e: std::io::Error| MirrorError::State(path.to_owned(), e.to_string());
        let tmp = path.with_extension("tmp");
        let mut f = File::create(&tmp).map_err(fail)?;
        f.write_all(self.to_json().to_string().as_bytes())
            .map_err(fail)?;
        if sync {
            f.sync_data().map_err(fail)?;
        }
        drop(f);
        std::fs::rename(&tmp, path).map_err(fail)?;
        if sync && let Some(dir) = path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(fail)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_through_its_file() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = path_for(dir.path(), "http://x/a b");
        assert_eq!(Progress::load(&path)?, None);
        let mut p = Progress::new("inc".into(), "-1".into());
        p.mark = Some(("s".into(), "d".into()));
        p.pending = Some(Pending {
            seq: 3,
            from: "a".into(),
            to: "b".into(),
            count: 2,
        });
        p.save(&path, true)?;
        assert_eq!(Progress::load(&path)?, Some(p.clone()));
        p.pending = None;
        p.save(&path, false)?;
        assert_eq!(Progress::load(&path)?, Some(p));
        Ok(())
    }
}
