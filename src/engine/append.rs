//! Appends.

use std::sync::Arc;
#[cfg(feature = "http")]
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::journal::Record;
use crate::name::{StreamName, normalize_content_type};
use crate::options::Options;
#[cfg(feature = "http")]
use crate::state::now_ms;
use crate::state::{
    AppendCheck, AppendRecord, Decision, filter_stream_seq, prepare_body, validate_producer,
};
use crate::store::Pending;
use crate::types::{AppendOutcome, AppendRequest, AppendStatus};

use super::Engine;
use super::stream::Stream;
use super::ticket::Ticket;

/// A refused append, with the durability ticket of the state the refusal rested on (the caller
/// waits for it before answering, so a refusal never rests on state a crash could roll back).
pub(crate) struct Refusal {
    pub(super) error: Error,
    pub(super) ticket: Option<Ticket>,
}

impl Refusal {
    pub(super) fn now(error: Error) -> Refusal {
        Refusal {
            error,
            ticket: None,
        }
    }
}

#[cfg(feature = "http")]
/// What [`Engine::try_append`] did.
pub(crate) enum Attempt {
    /// Accepted (or answered without writing): wait on the pending outcome.
    Accepted(Pending<AppendOutcome>),
    /// Refused: wait on the ticket, if any, then answer with the error.
    Refused(Error, Option<Ticket>),
    /// Needs a blocking thread: call [`Engine::append`] there with the request.
    Blocking(AppendRequest),
}

impl Engine {
    pub(crate) fn append(
        &self,
        name: &StreamName,
        req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>> {
        Self::validate_append(&self.options, &req)?;
        let s = self.live(name)?;
        match self.append_to(&s, name, req) {
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

    #[cfg(feature = "http")]
    /// The append path without any blocking step, for async callers: `Blocking` hands the
    /// request back when the stream is not open (opening reads its files), has expired, or the
    /// body is large enough that validating it belongs on a blocking thread.
    pub(crate) fn try_append(&self, name: &StreamName, req: AppendRequest) -> Attempt {
        const INLINE_BODY: usize = 64 << 10;
        if let Err(e) = Self::validate_append(&self.options, &req) {
            return Attempt::Refused(e, None);
        }
        if req.data.len() > INLINE_BODY {
            return Attempt::Blocking(req);
        }
        let s = {
            let reg = self.registry.lock();
            match reg.get(name.as_str()) {
                Some(s) => s.clone(),
                None => return Attempt::Blocking(req),
            }
        };
        {
            let core = s.core.lock();
            if core.gone {
                return Attempt::Refused(Error::NotFound, None);
            }
            if core.state.soft_deleted {
                return Attempt::Refused(Error::Gone, None);
            }
        }
        if s.expired_at(now_ms()) {
            return Attempt::Blocking(req);
        }
        s.last_used.store(now_ms(), Ordering::Relaxed);
        match self.append_to(&s, name, req) {
            Ok(p) => Attempt::Accepted(p),
            Err(Refusal { error, ticket }) => Attempt::Refused(error, ticket),
        }
    }

    pub(super) fn validate_append(options: &Options, req: &AppendRequest) -> Result<()> {
        if req.data.len() > options.max_append_bytes {
            return Err(Error::TooLarge(format!(
                "body is larger than {} bytes",
                options.max_append_bytes
            )));
        }
        filter_stream_seq(req.stream_seq.clone())?;
        if let Some(p) = &req.producer {
            validate_producer(p)?;
        }
        Ok(())
    }

    /// Steps 1 and 2 of the write path for an append to an open, live stream.
    pub(super) fn append_to(
        &self,
        s: &Arc<Stream>,
        name: &StreamName,
        req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>, Refusal> {
        let stream_seq = filter_stream_seq(req.stream_seq).map_err(Refusal::now)?;
        let ct = req
            .content_type
            .as_deref()
            .map(normalize_content_type)
            .transpose()
            .map_err(Refusal::now)?;
        s.check_expect(req.expect.as_ref()).map_err(Refusal::now)?;
        let has_data = !req.data.is_empty();
        // Step 1: validate and convert the body outside any lock.
        let body = prepare_body(s.json, req.data, false);
        let shard = &self.shards[s.shard];
        let mut core = s.core.lock();
        if core.gone {
            return Err(Refusal::now(Error::NotFound));
        }
        if core.state.soft_deleted {
            return Err(Refusal::now(Error::Gone));
        }
        let check = AppendCheck {
            body: &body,
            has_data,
            content_type: ct.as_deref(),
            close: req.close,
            stream_seq: stream_seq.as_deref(),
            producer: req.producer.as_ref(),
        };
        let decision = match core.state.check_append(&check) {
            Ok(d) => d,
            Err(error) => {
                return Err(Refusal {
                    error,
                    ticket: Some(shard.ticket(core.last_lsn)),
                });
            }
        };
        s.touch();
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
                let ticket = shard.ticket(core.last_lsn);
                Ok(Pending {
                    value: outcome,
                    ticket,
                })
            }
            Decision::Accept => {
                let body = body.unwrap_or_default();
                let rec = AppendRecord {
                    start: core.state.tail,
                    body,
                    close: req.close,
                    stream_seq,
                    producer: req.producer,
                };
                core.state.apply_append(&rec);
                let outcome = AppendOutcome {
                    status: AppendStatus::Appended,
                    tail: core.state.tail,
                    closed: core.state.closed,
                    producer: rec.producer.as_ref().map(|p| (p.epoch, p.seq)),
                    incarnation: s.incarnation.clone(),
                };
                let record = Record::Append {
                    name: name.as_str().to_owned(),
                    incarnation: s.incarnation.as_str().to_owned(),
                    rec,
                };
                let ticket = shard.push(s, record).map_err(Refusal::now)?;
                core.last_lsn = ticket.lsn;
                Ok(Pending {
                    value: outcome,
                    ticket,
                })
            }
        }
    }
}
