//! Appends (write-path steps 1 and 2): validation outside any lock, then the order of checks
//! and the enqueueing of the record under the stream's `core` lock. The blocking entry point
//! is [`Engine::append`]; async callers try [`Engine::try_append`] first, and ask
//! [`Engine::commit_hint`] how to wait on what it ordered (the group-commit policy).

use std::borrow::Cow;
use std::sync::Arc;

use crate::digest::BodyDigest;
use crate::error::{Error, Result};

use crate::engine::journal::{PLACE_MIN, Placed};
use crate::name::{StreamName, is_normal_essence, normalize_content_type};
use crate::options::{Durability, Options};
use crate::state::{
    AppendCheck, AppendRecord, Decision, filter_stream_seq, prepare_body, validate_producer,
};
use crate::store::{Commit, Pending, TryAppend};
use crate::types::{AppendOutcome, AppendRequest, AppendStatus};

use super::Engine;
use super::journal::shard::Shard;
use super::stream::Stream;
use super::ticket::Ticket;

/// A refused append, with the durability ticket of the state the refusal rested on (the caller
/// waits for it before answering, so a refusal never rests on state a crash could roll back).
pub(crate) struct Refusal {
    error: Error,
    ticket: Option<Ticket>,
}

impl Refusal {
    /// A refusal answered at once: it rests on nothing staged.
    fn now(error: Error) -> Refusal {
        Refusal {
            error,
            ticket: None,
        }
    }

    /// A refusal by the order of checks on a stream whose staged state reaches `last_lsn`.
    ///
    /// Rows 4 to 9 rest on staged guard state (closure, producers, Stream-Seq) that a crash
    /// could roll back, so they wait until it is durable. Rows 1 to 3 (`NotFound`, `Gone`,
    /// `IncarnationMismatch`) are answered at once, as a lookup answers them.
    fn checked(error: Error, shard: &Arc<Shard>, last_lsn: u64) -> Refusal {
        let ticket = match error {
            Error::NotFound | Error::Gone | Error::IncarnationMismatch { .. } => None,
            _ => Some(shard.ticket(last_lsn)),
        };
        Refusal { error, ticket }
    }
}

impl Engine {
    /// Appends to a live stream; the outcome is acknowledged once the returned `Pending`
    /// resolves. A refusal is returned only once the state it rested on is durable.
    pub(crate) fn append(
        &self,
        name: &StreamName,
        mut req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>> {
        Self::validate_append(&self.options, &mut req)?;
        let s = self.live(name)?;
        match self.append_to(&s, req) {
            Ok(p) => Ok(p),
            Err(Refusal { error, ticket }) => {
                // A refusal may rest on state that is not durable yet: wait for it first.
                if let Some(t) = ticket {
                    t.wait()?;
                }
                Err(error)
            }
        }
    }

    /// The append path without any blocking step, for async callers: `WouldBlock` hands the
    /// request back when the stream is not open (opening reads its files), has expired, or the
    /// body is large enough that validating it belongs on a blocking thread. A refusal comes
    /// back as a `Pending` that resolves to it once the state it rested on is durable.
    pub(crate) fn try_append(&self, name: &StreamName, mut req: AppendRequest) -> TryAppend {
        const INLINE_BODY: usize = 64 << 10;
        if let Err(e) = Self::validate_append(&self.options, &mut req) {
            return TryAppend::Done(Pending::refused(e, None));
        }
        if req.data.len() > INLINE_BODY {
            return TryAppend::WouldBlock(req);
        }
        let s = match self.live_in_memory(name) {
            Some(Ok(s)) => s,
            Some(Err(e)) => return TryAppend::Done(Pending::refused(e, None)),
            None => return TryAppend::WouldBlock(req),
        };
        TryAppend::Done(match self.append_to(&s, req) {
            Ok(p) => p,
            Err(Refusal { error, ticket }) => Pending::refused(error, ticket),
        })
    }

    /// The group-commit policy for an async caller about to wait on an append while up to
    /// `writers` tasks (itself included) may be appending: in Buffered mode the first writer
    /// to wait commits the whole queue on its own thread, so with other writers about it lets
    /// their ready appends enqueue first (one journal write and one write per stream carry all
    /// of them); the only writer commits at once, so it never waits for others' unrelated work
    /// (such as the fan-out of the last append to a thousand live readers) before its own is
    /// written. In Sync mode the shard thread commits: nothing to gain by waiting.
    pub(crate) fn commit_hint(&self, writers: usize) -> Commit {
        if self.options.durability == Durability::Buffered && writers > 1 {
            Commit::Batch
        } else {
            Commit::Now
        }
    }

    /// Row 0 of the order of checks, before the stream is looked up: the body's size, the
    /// Stream-Seq's length and the producer's bounds. Replaces the request's Stream-Seq with
    /// its filtered value (a non-printable one is dropped, as if absent).
    fn validate_append(options: &Options, req: &mut AppendRequest) -> Result<()> {
        if req.data.len() > options.max_append_bytes {
            return Err(Error::TooLarge(format!(
                "body is larger than {} bytes",
                options.max_append_bytes
            )));
        }
        req.stream_seq = filter_stream_seq(req.stream_seq.take())?;
        if let Some(p) = &req.producer {
            validate_producer(p)?;
        }
        if req.producer_digest.is_some() && req.producer.is_none() {
            return Err(Error::InvalidArgument(
                "a producer digest needs the producer's id, epoch and seq".into(),
            ));
        }
        Ok(())
    }

    /// Steps 1 and 2 of the write path for a validated append (see
    /// [`Engine::validate_append`]) to a stream found live: converts the body outside any lock,
    /// then under `core` runs the whole order of checks on the staged state, stages the change
    /// and enqueues its record, so journal order is check order.
    fn append_to(
        &self,
        s: &Arc<Stream>,
        req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>, Refusal> {
        // A type already in normal form (the HTTP layer sends it so) is compared as it is.
        let ct: Option<Cow<'_, str>> = match req.content_type.as_deref() {
            None => None,
            Some(c) if is_normal_essence(c) => Some(Cow::Borrowed(c)),
            Some(c) => Some(Cow::Owned(normalize_content_type(c).map_err(Refusal::now)?)),
        };
        let has_data = !req.data.is_empty();
        // Step 1: validate and convert the body outside any lock, and hash it against its
        // producer digest; a failure is row 9's.
        let digest = req
            .producer_digest
            .map(|d| (d, BodyDigest::of(&req.data) == d));
        let body = prepare_body(s.json, req.data, false, self.options.max_append_messages);
        // Buffered mode writes a large body once, to its segment (see `journal::Placed`). The
        // CRC its record carries is taken here, outside the lock; a one-message body keeps it
        // for the segment index.
        let placed = match &body {
            Ok(b)
                if self.options.durability == Durability::Buffered && b.data.len() >= PLACE_MIN =>
            {
                Some(Placed {
                    len: b.data.len() as u32,
                    crc: if b.ends.len() == 1 {
                        b.single_crc()
                    } else {
                        crc32fast::hash(&b.data)
                    },
                })
            }
            _ => None,
        };
        let shard = &self.shards[s.shard];
        // Step 2.
        let mut core = s.core.lock();
        let check = AppendCheck {
            body: &body,
            has_data,
            content_type: ct.as_deref(),
            close: req.close,
            stream_seq: req.stream_seq.as_deref(),
            producer: req.producer.as_ref(),
            digest: digest.as_ref().map(|(d, ok)| (d, *ok)),
            expect_tail: req.expect_tail.as_ref(),
        };
        let decision = core
            .state
            .order_of_checks(core.gone, req.expect.as_ref(), &check)
            .map_err(|e| Refusal::checked(e, shard, core.last_lsn))?;
        // The lookup that found `s` (`live`, or `try_append`'s) stamped it just now.
        s.touch_as_used();
        match decision {
            Decision::Answer(status) => {
                let echo = req
                    .producer
                    .as_ref()
                    .and_then(|p| core.state.producers.get(&p.id).map(|x| (x.epoch, x.seq)));
                let outcome = AppendOutcome {
                    status,
                    tail: core.state.tail,
                    closed: core.state.closed,
                    producer: echo,
                    incarnation: s.incarnation.clone(),
                };
                Ok(Pending::new(outcome, shard.ticket(core.last_lsn)))
            }
            Decision::Accept => {
                let rec = AppendRecord {
                    start: core.state.tail,
                    body: body.unwrap_or_default(),
                    close: req.close,
                    stream_seq: req.stream_seq,
                    producer: req.producer,
                    digest: req.producer_digest,
                };
                core.state.apply_append(&rec);
                self.counters.appended(rec.body.data.len());
                let outcome = AppendOutcome {
                    status: AppendStatus::Appended,
                    tail: core.state.tail,
                    closed: core.state.closed,
                    producer: rec.producer.as_ref().map(|p| (p.epoch, p.seq)),
                    incarnation: s.incarnation.clone(),
                };
                let ticket = shard
                    .push(s, s.append_record(rec, placed))
                    .map_err(Refusal::now)?;
                core.last_lsn = ticket.lsn;
                Ok(Pending::new(outcome, ticket))
            }
        }
    }
}
