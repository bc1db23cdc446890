//! The outbox recipe: publish facts that committed somewhere else (a database transaction, a
//! `SQLite` VFS database) to a stream, exactly once and in commit order, across owner failovers.
//!
//! Every append carries both guards: `Producer-Id`, `Producer-Epoch` and `Producer-Seq` make a
//! retry of the same append a duplicate, and `Stream-Seq` set to the fact's commit number
//! (zero-padded to 20 digits) makes the stream accept each fact at most once and in commit order,
//! whoever sends it. On takeover the new owner uses a higher epoch and starts `Producer-Seq` at 0;
//! a fact the old owner already published answers 409 with `Stream-Last-Seq`, which here means
//! "already published". Only that 409 means it: any other 409 is an error, since skipping on it
//! would lose facts. Once the new owner's first append is accepted, the old epoch answers 403.

use bytes::Bytes;
use serde_json::Value;

use super::error::{Error, Result};
use super::stream::StreamHandle;
use super::types::{Append, Position, parse_stream_seq_number, stream_seq};

/// How the stream answered one fact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// Appended now.
    Appended {
        /// The tail after it.
        next: Option<Position>,
    },
    /// This producer's earlier append of it was accepted (its response was lost): a duplicate,
    /// not written again.
    Duplicate,
    /// Already published, by an earlier owner (a Stream-Seq 409 with `Stream-Last-Seq`). The
    /// Producer-Seq was not used up: the next fact goes out with the same one.
    AlreadyPublished {
        /// `Stream-Last-Seq`: the last published commit number as sent.
        last_seq: String,
        /// `last_seq` as a commit number, when it is one (20 zero-padded digits): every fact
        /// up to it is published.
        last_commit: Option<u64>,
    },
}

/// What [`Outbox::publish_all`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishSummary {
    /// Facts appended now.
    pub appended: u64,
    /// Facts answered as duplicates of this producer's earlier appends.
    pub duplicates: u64,
    /// Facts found already published (answered 409 with `Stream-Last-Seq`, or skipped because
    /// a 409 said a later fact was).
    pub already_published: u64,
}

/// One owner's publisher of committed facts to one stream.
#[derive(Debug)]
pub struct Outbox {
    stream: StreamHandle,
    producer_id: String,
    epoch: u64,
    seq: u64,
    content_type: String,
    /// The last commit number the stream answered for definitively.
    last: Option<u64>,
    /// A fact whose append got no definitive answer: it must be retried before any other.
    in_flight: Option<u64>,
}

impl Outbox {
    /// A publisher for `producer_id` at `epoch`, starting at `Producer-Seq` 0, appending facts
    /// as `content_type` (the stream's).
    ///
    /// Every owner (the first, one that restarts, one that takes over) starts with an epoch
    /// higher than any earlier owner's, so the stream fences the older ones.
    pub fn new(
        stream: StreamHandle,
        producer_id: impl Into<String>,
        epoch: u64,
        content_type: &str,
    ) -> Outbox {
        Outbox {
            stream,
            producer_id: producer_id.into(),
            epoch,
            seq: 0,
            content_type: content_type.to_owned(),
            last: None,
            in_flight: None,
        }
    }

    /// A publisher that takes over from an owner at `previous_epoch`: epoch + 1, `Producer-Seq`
    /// from 0.
    pub fn take_over(
        stream: StreamHandle,
        producer_id: impl Into<String>,
        previous_epoch: u64,
        content_type: &str,
    ) -> Outbox {
        Outbox::new(stream, producer_id, previous_epoch + 1, content_type)
    }

    /// The stream.
    pub fn stream(&self) -> &StreamHandle {
        &self.stream
    }

    /// The producer's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The `Producer-Seq` the next fact goes out with.
    pub fn producer_seq(&self) -> u64 {
        self.seq
    }

    /// The fact whose append has no definitive answer yet, if any: retry it (same commit
    /// number, same bytes) before publishing anything else.
    pub fn in_flight(&self) -> Option<u64> {
        self.in_flight
    }

    /// Publishes fact number `commit` (numbers strictly increase, in the source's commit order)
    /// with both guards. After an error with [`Error::outcome_unknown`], call it again with the
    /// same number and bytes: the producer tuple is unchanged, so the retry is answered as a
    /// duplicate or accepted. [`Error::ProducerEpochStale`] (403) means a newer owner took over:
    /// this one is fenced and must stop. Any other error is not "already published" and must
    /// not be skipped.
    pub async fn publish(&mut self, commit: u64, fact: impl Into<Bytes>) -> Result<Published> {
        if let Some(pending) = self.in_flight.filter(|p| *p != commit) {
            return Err(Error::InvalidArgument(format!(
                "fact {pending} has no answer yet: retry it before publishing fact {commit}"
            )));
        }
        if let Some(last) = self.last.filter(|l| commit <= *l) {
            return Err(Error::InvalidArgument(format!(
                "fact {commit} is not after fact {last}: publish facts in commit order"
            )));
        }
        let append = Append::new(&self.content_type, fact)
            .stream_seq(stream_seq(commit))
            .producer(self.producer_id.clone(), self.epoch, self.seq);
        self.in_flight = Some(commit);
        let answer = match self.stream.append(&append).await {
            Ok(done) => {
                self.seq += 1;
                if done.duplicate {
                    Published::Duplicate
                } else {
                    Published::Appended { next: done.next }
                }
            }
            // Only a Stream-Seq 409 (the one that carries Stream-Last-Seq) means "already
            // published"; it used up no Producer-Seq.
            Err(Error::StreamSeqConflict { last_seq, .. }) => Published::AlreadyPublished {
                last_commit: parse_stream_seq_number(&last_seq),
                last_seq,
            },
            Err(e) => {
                if !e.outcome_unknown() {
                    // A definitive refusal: nothing is in flight, and nothing is skipped.
                    self.in_flight = None;
                }
                return Err(e);
            }
        };
        self.in_flight = None;
        self.last = Some(commit);
        Ok(answer)
    }

    /// Publishes one JSON fact to an `application/json` stream as one message (wrapped in an
    /// array, so an array fact is not split into several messages).
    pub async fn publish_json(&mut self, commit: u64, fact: &Value) -> Result<Published> {
        let body = Value::Array(vec![fact.clone()]).to_string();
        self.publish(commit, body).await
    }

    /// Publishes facts in order. A fact answered "already published" is passed over, and so
    /// is every later fact up to the commit number its `Stream-Last-Seq` names. Stops at the
    /// first error (retry from [`in_flight`](Self::in_flight) or the fact after the last one
    /// answered).
    pub async fn publish_all<I, B>(&mut self, facts: I) -> Result<PublishSummary>
    where
        I: IntoIterator<Item = (u64, B)>,
        B: Into<Bytes>,
    {
        let mut summary = PublishSummary::default();
        let mut published_through: Option<u64> = None;
        for (commit, fact) in facts {
            if published_through.is_some_and(|p| commit <= p) {
                summary.already_published += 1;
                continue;
            }
            match self.publish(commit, fact).await? {
                Published::Appended { .. } => summary.appended += 1,
                Published::Duplicate => summary.duplicates += 1,
                Published::AlreadyPublished { last_commit, .. } => {
                    summary.already_published += 1;
                    published_through = last_commit;
                }
            }
        }
        Ok(summary)
    }
}
