//! The prefix-count compare-and-set recipe: several writers extend one JSON log, and each
//! commit is validated against the whole log before it.
//!
//! Every commit is one append of a JSON array of one or more events, sent with `Stream-Seq` set
//! to the number of events the writer read (zero-padded to 20 digits) from a read that ended
//! with `Stream-Up-To-Date: true`. Every commit holds at least one event, so the stream's stored
//! value is always the count before the latest commit; a count beats it only when it includes
//! that commit, so an accepted writer has seen the whole log. On a Stream-Seq 409 the writer reads
//! on from where it stopped, validates again against the longer log and retries with the new
//! count. For this to hold, **every** append to the stream, by every writer, must go through this
//! recipe (an append without `Stream-Seq` is not checked), and the stream must be created
//! without `Stream-Seq` ([`PrefixCount::create`]).

use std::collections::HashMap;

use serde_json::Value;

use super::error::{BoxError, Error, Result};
use super::stream::StreamHandle;
use super::types::{Append, Create, Position, Read, TailData, stream_seq};

/// The default member holding a commit's operation id in each of its events.
pub(crate) const DEFAULT_OP_FIELD: &str = "op_id";

/// A writer running the prefix-count recipe on one `application/json` stream.
///
/// Holds every event it read (the validation callback sees them all), the count, and where its
/// reads stopped. [`commit`](Self::commit) appends only from a count taken at the tail: its
/// reads always continue until `Stream-Up-To-Date: true`, never stopping at a `max_bytes`
/// bound, since a count taken inside a commit could beat the stored value without the writer
/// having seen the rest of that commit.
#[derive(Debug)]
pub struct PrefixCount {
    stream: StreamHandle,
    /// Events before `events` that were counted (from a snapshot) but not read.
    base: u64,
    events: Vec<Value>,
    /// Operation id → count before the first event carrying it.
    ops: HashMap<String, u64>,
    next: Position,
    at_tail: bool,
    op_field: String,
    max_attempts: u32,
    page_bytes: Option<u64>,
}

/// A commit that is in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The events before the commit: the `Stream-Seq` it was accepted with.
    pub count: u64,
    /// Events in the commit (as sent; for a recovered commit, those read with its id).
    pub events: u64,
    /// Appends sent by this call (0 when the commit was found already in the log).
    pub attempts: u32,
    /// The commit was found in the log by its operation id instead of being appended by this
    /// call: its earlier append's response was lost, or the caller retried a call that failed.
    pub recovered: bool,
    /// The tail right after the commit, when the server said.
    pub next: Option<Position>,
}

impl PrefixCount {
    /// Creates the stream as `application/json` **without** `Stream-Seq` (so no value is stored
    /// and the first commit's 0 is accepted; a seeded value could refuse the first commit on
    /// every retry), or confirms that it exists, then reads it to the tail.
    pub async fn create(stream: StreamHandle) -> Result<PrefixCount> {
        stream.create(&Create::json()).await?;
        PrefixCount::open(stream).await
    }

    /// Reads the stream from its start to the tail with `consistency=leader` and counts its
    /// events. The stream must be `application/json`.
    pub async fn open(stream: StreamHandle) -> Result<PrefixCount> {
        PrefixCount::resume(stream, 0, Position::start()).await
    }

    /// Counts on from a snapshot: `count` events lie before `from` (keep the event count in
    /// every snapshot of a prefix-count stream, since retention makes the events before it
    /// unreadable), and the writer reads from `from` to the tail. The validation callback then
    /// sees only the events after `from`.
    pub async fn resume(stream: StreamHandle, count: u64, from: Position) -> Result<PrefixCount> {
        let mut w = PrefixCount {
            stream,
            base: count,
            events: Vec::new(),
            ops: HashMap::new(),
            next: from,
            at_tail: false,
            op_field: DEFAULT_OP_FIELD.to_owned(),
            max_attempts: 1000,
            page_bytes: None,
        };
        w.catch_up().await?;
        Ok(w)
    }

    /// The member each event of a commit carries its operation id in (default `op_id`).
    /// Set it before the first commit: events already read are indexed by the old name.
    #[must_use]
    pub fn op_field(mut self, name: &str) -> PrefixCount {
        name.clone_into(&mut self.op_field);
        self.ops.clear();
        for (i, e) in self.events.iter().enumerate() {
            if let Some(id) = e.get(name).and_then(Value::as_str) {
                self.ops
                    .entry(id.to_owned())
                    .or_insert(self.base + i as u64);
            }
        }
        self
    }

    /// How many appends one [`commit`](Self::commit) may send before it gives up with
    /// [`Error::TooManyAttempts`] (default 1000).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> PrefixCount {
        self.max_attempts = n.max(1);
        self
    }

    /// Bounds each read response to `n` bytes (`max_bytes`); reads still continue to the tail.
    #[must_use]
    pub fn page_bytes(mut self, n: u64) -> PrefixCount {
        self.page_bytes = Some(n);
        self
    }

    /// The stream.
    pub fn stream(&self) -> &StreamHandle {
        &self.stream
    }

    /// The events counted, as of the last read: every event since the stream was created.
    pub fn count(&self) -> u64 {
        self.base + self.events.len() as u64
    }

    /// The events read (after the snapshot's, for a writer made by [`resume`](Self::resume)).
    pub fn events(&self) -> &[Value] {
        &self.events
    }

    /// Where the last read stopped.
    pub fn next(&self) -> &Position {
        &self.next
    }

    /// Whether the operation id is in the log as read: its commit is in.
    pub fn contains(&self, op_id: &str) -> bool {
        self.ops.contains_key(op_id)
    }

    /// Reads on from where the last read stopped until `Stream-Up-To-Date: true`, and returns
    /// how many new events it counted.
    pub async fn catch_up(&mut self) -> Result<u64> {
        let mut req = Read::from(self.next.clone()).leader();
        if let Some(n) = self.page_bytes {
            req = req.max_bytes(n);
        }
        let read = self.stream.read_to_tail(&req).await?;
        let TailData::Json(new) = read.data else {
            return Err(Error::InvalidArgument(
                "the prefix-count recipe needs an application/json stream".into(),
            ));
        };
        let k = new.len() as u64;
        for event in new {
            if let Some(id) = event.get(&self.op_field).and_then(Value::as_str) {
                let at = self.count();
                self.ops.entry(id.to_owned()).or_insert(at);
            }
            self.events.push(event);
        }
        self.next = read.next;
        self.at_tail = true;
        Ok(k)
    }

    /// Commits the events `build` returns, validated against the whole log.
    ///
    /// `build(count, events)` sees the count and every event read, and returns the commit: one
    /// or more JSON objects (an empty commit is refused with [`Error::EmptyCommit`]), or an error
    /// to refuse it ([`Error::Rejected`]). Each event gets `op_id` in the configured member.
    /// The commit is appended with `Stream-Seq` = the count, zero-padded to 20 digits. On a
    /// Stream-Seq 409 the writer reads on, and `build` runs again on the longer log before the
    /// retry with the new count. When a response is lost ([`Error::outcome_unknown`]), the
    /// writer reads the new events and looks for `op_id` before retrying, so a commit is never
    /// appended twice; calling `commit` again with the same `op_id` after an error does the
    /// same. Use a fresh, unique `op_id` per logical commit.
    ///
    /// Returns when the commit is in the log. [`count`](Self::count) and
    /// [`events`](Self::events) do not include it until the next read.
    pub async fn commit<F, E>(&mut self, op_id: &str, mut build: F) -> Result<Commit>
    where
        F: FnMut(u64, &[Value]) -> std::result::Result<Vec<Value>, E>,
        E: Into<BoxError>,
    {
        let mut attempts = 0u32;
        loop {
            if !self.at_tail {
                self.catch_up().await?;
            }
            if let Some(&count) = self.ops.get(op_id) {
                return Ok(self.recovered(op_id, count, attempts));
            }
            // Every count comes from a read that ended with Stream-Up-To-Date.
            if !self.at_tail {
                return Err(Error::NotAtTail);
            }
            let n = self.count();
            let events = build(n, &self.events).map_err(|e| Error::Rejected(e.into()))?;
            if events.is_empty() {
                return Err(Error::EmptyCommit);
            }
            let events = self.stamp(events, op_id)?;
            if attempts >= self.max_attempts {
                return Err(Error::TooManyAttempts { attempts });
            }
            attempts += 1;
            let len = events.len() as u64;
            let body = Value::Array(events).to_string();
            let append = Append::new("application/json", body).stream_seq(stream_seq(n));
            match self.stream.append(&append).await {
                Ok(done) => {
                    // The next commit reads on first: it validates against its own commit too.
                    self.at_tail = false;
                    self.ops.entry(op_id.to_owned()).or_insert(n);
                    return Ok(Commit {
                        count: n,
                        events: len,
                        attempts,
                        recovered: false,
                        next: done.next,
                    });
                }
                Err(Error::StreamSeqConflict { last_seq, .. }) => {
                    // Another writer committed first; Stream-Last-Seq is the count before its
                    // commit. Read on to the tail, then validate again and retry with n + k.
                    self.catch_up().await?;
                    let count = stream_seq(self.count());
                    if last_seq.as_bytes() >= count.as_bytes() {
                        return Err(Error::StreamSeqAhead { count, last_seq });
                    }
                }
                Err(e) if e.outcome_unknown() => {
                    // The commit may be in: read the new events and look for its id before
                    // retrying. If the read fails too, a later call with the same id resumes.
                    self.at_tail = false;
                    if self.catch_up().await.is_err() {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn recovered(&self, op_id: &str, count: u64, attempts: u32) -> Commit {
        let start = usize::try_from(count.saturating_sub(self.base)).unwrap_or(usize::MAX);
        let events = self
            .events
            .iter()
            .skip(start)
            .take_while(|e| e.get(&self.op_field).and_then(Value::as_str) == Some(op_id))
            .count() as u64;
        Commit {
            count,
            events,
            attempts,
            recovered: true,
            next: None,
        }
    }

    /// Puts `op_id` into every event; each must be a JSON object.
    fn stamp(&self, events: Vec<Value>, op_id: &str) -> Result<Vec<Value>> {
        events
            .into_iter()
            .map(|mut e| {
                let Some(obj) = e.as_object_mut() else {
                    return Err(Error::InvalidArgument(
                        "every event of a prefix-count commit must be a JSON object, to carry its operation id".into(),
                    ));
                };
                match obj.get(&self.op_field) {
                    Some(Value::String(s)) if s == op_id => {}
                    Some(_) => {
                        return Err(Error::InvalidArgument(format!(
                            "an event already has a different \"{}\" member",
                            self.op_field
                        )));
                    }
                    None => {
                        obj.insert(self.op_field.clone(), Value::from(op_id));
                    }
                }
                Ok(e)
            })
            .collect()
    }
}
