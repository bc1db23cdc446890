//! Create, fork, delete.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::Record;
use crate::name::{Incarnation, Offset, StreamName, is_json, normalize_content_type};
use crate::state::{
    AppendRecord, Config, StreamState, filter_stream_seq, now_ms, prepare_body, to_ms,
};
use crate::store::Pending;
use crate::types::{CreateOptions, Created, Expiry, ForkFrom};

use super::Engine;
use super::registry::evict;
use super::stream::Stream;

impl Engine {
    pub(crate) fn create(&self, name: &StreamName, req: CreateOptions) -> Result<Pending<Created>> {
        if req.data.len() > self.options.max_append_bytes {
            return Err(Error::TooLarge(format!(
                "body is larger than {} bytes",
                self.options.max_append_bytes
            )));
        }
        let stream_seq = filter_stream_seq(req.stream_seq.clone())?;
        let requested_ct = req
            .content_type
            .as_deref()
            .map(normalize_content_type)
            .transpose()?;
        if let Expiry::Ttl(s) = req.expiry
            && s > u64::MAX / 2000
        {
            return Err(Error::InvalidArgument("Stream-TTL is too large".into()));
        }
        let expiry = match req.expiry {
            Expiry::At(t) => Expiry::At(to_ms(t)),
            e => e,
        };

        // An existing stream: idempotent success or a conflict.
        if let Some(existing) = self.lookup(name.as_str())? {
            let expired = existing.expired_at(now_ms());
            if expired && !existing.core.lock().state.soft_deleted {
                self.expire(&existing);
            } else {
                return self.confirm_existing(&existing, &req, requested_ct.as_deref(), expiry);
            }
        }
        if req.expect.is_some() {
            return Err(Error::IncarnationMissing);
        }

        // Resolve the fork's source and position.
        let mut fork_ticket = None;
        let (content_type, base, fork, expiry, source) = match &req.fork {
            None => (
                requested_ct
                    .clone()
                    .unwrap_or_else(|| "application/octet-stream".into()),
                Offset::ZERO,
                None,
                expiry,
                None,
            ),
            Some(f) => {
                let src = self
                    .lookup(f.source.as_str())?
                    .ok_or(Error::ForkSourceNotFound)?;
                if src.core.lock().state.soft_deleted {
                    return Err(Error::ForkSourceGone);
                }
                if src.expired_at(now_ms()) {
                    self.expire(&src);
                    return Err(Error::ForkSourceNotFound);
                }
                let sct = src.config.content_type.clone();
                if let Some(ct) = &requested_ct
                    && *ct != sct
                {
                    return Err(Error::ContentTypeMismatch { expected: sct });
                }
                let pos = self.fork_position(&src, f)?;
                let expiry = match (expiry, src.config.expiry) {
                    (Expiry::Never, inherited) => inherited,
                    (own, _) => own,
                };
                (
                    sct,
                    pos,
                    Some((f.source.as_str().to_owned(), pos)),
                    expiry,
                    Some(src),
                )
            }
        };
        let json = is_json(&content_type);
        let body = prepare_body(json, req.data.clone(), true)?;
        let config = Config {
            name: name.as_str().to_owned(),
            incarnation: self.new_incarnation(name.as_str()),
            content_type,
            expiry,
            fork,
        };
        let mut state = StreamState::new(config, base);
        // A fork's data starts where its source's readable data starts: what retention retired
        // there is not served through the fork either (it may already be reclaimed).
        if let Some(src) = &source {
            state.earliest = src.visible().earliest;
        }

        let mut reg = self.registry.lock();
        if reg.get(name.as_str()).is_some_and(|s| !s.core.lock().gone) {
            drop(reg);
            // Lost a race with another create: answer as for an existing stream.
            let existing = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
            return self.confirm_existing(&existing, &req, requested_ct.as_deref(), expiry);
        }
        if let Some(src) = &source {
            let mut core = src.core.lock();
            if core.gone || core.state.soft_deleted {
                return Err(Error::ForkSourceGone);
            }
            let rec = Record::ForkRef {
                name: src.name.as_str().to_owned(),
                incarnation: src.incarnation.as_str().to_owned(),
                fork: name.as_str().to_owned(),
                add: true,
            };
            core.state.forks.insert(name.as_str().to_owned());
            let t = self.shards[src.shard].push(src, rec)?;
            core.last_lsn = t.lsn;
            fork_ticket = Some(t);
        }
        let shard = self.shard_of(name.as_str());
        let dir = fs::stream_dir(&self.root, name.as_str());
        let stream = Stream::new(state.clone(), dir, shard, None, 0, 0, false);
        let initial = AppendRecord {
            start: base,
            body,
            close: req.closed,
            stream_seq,
            producer: None,
        };
        let ticket = {
            let mut core = stream.core.lock();
            core.state.apply_append(&initial);
            let t = self.shards[shard].push(
                &stream,
                Record::Create {
                    state: Box::new(state),
                    initial,
                },
            )?;
            core.last_lsn = t.lsn;
            t
        };
        reg.insert(name.as_str().to_owned(), stream.clone());
        if reg.len() > self.options.max_open_streams {
            evict(&mut reg, self.options.max_open_streams);
        }
        drop(reg);
        if let Some(t) = fork_ticket {
            t.wait()?;
        }
        let info = stream.staged_info(&stream.core.lock().state);
        Ok(Pending {
            value: Created {
                created: true,
                info,
            },
            ticket,
        })
    }

    pub(super) fn confirm_existing(
        &self,
        s: &Arc<Stream>,
        req: &CreateOptions,
        ct: Option<&str>,
        expiry: Expiry,
    ) -> Result<Pending<Created>> {
        // Resolve the requested fork position (offset plus sub-offset) as a create would, before
        // taking this stream's lock.
        let requested_pos = match (&req.fork, &s.config.fork) {
            (Some(f), Some((src, _))) if f.source.as_str() == src && f.offset.is_some() => {
                match self.lookup(src)? {
                    Some(source) => self.fork_position(&source, f).ok(),
                    None => None,
                }
            }
            _ => None,
        };
        let core = s.core.lock();
        if core.state.soft_deleted {
            return Err(Error::ConfigMismatch(
                "the stream was deleted and is kept for its forks",
            ));
        }
        s.check_expect(req.expect.as_ref())?;
        let want_ct = match (ct, &req.fork) {
            (Some(ct), _) => ct.to_owned(),
            (None, Some(_)) => s.config.content_type.clone(),
            (None, None) => "application/octet-stream".to_owned(),
        };
        if want_ct != s.config.content_type {
            return Err(Error::ConfigMismatch("content type differs"));
        }
        if req.fork.is_none() && expiry != s.config.expiry {
            return Err(Error::ConfigMismatch("expiry differs"));
        }
        if req.closed != core.state.closed {
            return Err(Error::ConfigMismatch("closure status differs"));
        }
        match (&req.fork, &s.config.fork) {
            (None, None) => {}
            (Some(f), Some((src, at))) => {
                let differs = match requested_pos {
                    Some(pos) => pos.bytes != at.bytes,
                    None => f.offset.is_some_and(|o| o.bytes != at.bytes) || f.sub_offset != 0,
                };
                if f.source.as_str() != src || differs {
                    return Err(Error::ConfigMismatch("fork source or offset differs"));
                }
                if expiry != Expiry::Never && expiry != s.config.expiry {
                    return Err(Error::ConfigMismatch("expiry differs"));
                }
            }
            _ => return Err(Error::ConfigMismatch("fork configuration differs")),
        }
        let ticket = self.shards[s.shard].ticket(core.last_lsn);
        let info = s.staged_info(&core.state);
        Ok(Pending {
            value: Created {
                created: false,
                info,
            },
            ticket,
        })
    }

    /// The divergence point of a fork: `offset` (default the source's tail) refined by the
    /// sub-offset, validated against the source.
    pub(super) fn fork_position(&self, src: &Arc<Stream>, f: &ForkFrom) -> Result<Offset> {
        let vis = src.visible();
        let at = f.offset.unwrap_or(vis.tail);
        if at.bytes > vis.tail.bytes {
            return Err(Error::InvalidForkPosition(format!(
                "offset {at} is beyond the source's tail {}",
                vis.tail
            )));
        }
        if at.bytes < vis.earliest.bytes {
            return Err(Error::InvalidForkPosition(format!(
                "offset {at} is before the source's retained start"
            )));
        }
        if !self.is_boundary(src, at.bytes)? {
            return Err(Error::InvalidForkPosition(format!(
                "offset {at} is not a position brook returned"
            )));
        }
        let mut pos = at.bytes;
        if f.sub_offset > 0 {
            if src.json {
                for _ in 0..f.sub_offset {
                    match self.next_boundary(src, pos)? {
                        Some(b) if b <= vis.tail.bytes => pos = b,
                        _ => {
                            return Err(Error::InvalidForkPosition(
                                "sub-offset reaches past the tail".into(),
                            ));
                        }
                    }
                }
            } else {
                let next = self
                    .next_boundary(src, pos)?
                    .unwrap_or(vis.tail.bytes)
                    .min(vis.tail.bytes);
                if pos + f.sub_offset > next {
                    return Err(Error::InvalidForkPosition(
                        "sub-offset reaches past the next message boundary".into(),
                    ));
                }
                pos += f.sub_offset;
            }
        }
        self.offset_at(src, pos)
    }

    pub(crate) fn delete(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Result<Pending<()>> {
        let s = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
        if s.core.lock().state.soft_deleted {
            return Err(Error::Gone);
        }
        if s.expired_at(now_ms()) {
            self.expire(&s);
            return Err(Error::NotFound);
        }
        self.delete_stream(&s, expect, false)
    }

    /// Forks of `s` that still exist and still read from it.
    pub(super) fn live_forks(&self, s: &Stream, names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|f| {
                matches!(self.lookup(f), Ok(Some(fs)) if !fs.core.lock().gone
                    && fs.config.fork.as_ref().is_some_and(|(src, _)| src == s.name.as_str()))
            })
            .cloned()
            .collect()
    }

    pub(super) fn delete_stream(
        &self,
        s: &Arc<Stream>,
        expect: Option<&Incarnation>,
        expiring: bool,
    ) -> Result<Pending<()>> {
        let forks: Vec<String> = s.core.lock().state.forks.iter().cloned().collect();
        let live = self.live_forks(s, &forks);
        let reg = self.registry.lock();
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        if core.state.soft_deleted {
            return Err(Error::Gone);
        }
        if !expiring {
            s.check_expect(expect)?;
        }
        let shard = &self.shards[s.shard];
        let soft = !live.is_empty();
        let record = Record::Delete {
            name: s.name.as_str().to_owned(),
            incarnation: s.incarnation.as_str().to_owned(),
            soft,
        };
        let ticket = shard.push(s, record)?;
        core.last_lsn = ticket.lsn;
        if soft {
            core.state.soft_deleted = true;
        } else {
            core.gone = true;
        }
        drop(core);
        drop(reg);
        s.event.notify(usize::MAX);
        if !soft {
            self.release_source(s)?;
        }
        Ok(Pending { value: (), ticket })
    }

    /// After a fork is gone: drop it from its source's fork list, and collect a soft-deleted
    /// source that no live fork reads any more (cascading up the chain).
    pub(super) fn release_source(&self, fork: &Stream) -> Result<()> {
        let Some((src_name, _)) = &fork.config.fork else {
            return Ok(());
        };
        let Some(src) = self.lookup(src_name)? else {
            return Ok(());
        };
        let remaining: Vec<String> = {
            let mut core = src.core.lock();
            if core.gone {
                return Ok(());
            }
            let rec = Record::ForkRef {
                name: src.name.as_str().to_owned(),
                incarnation: src.incarnation.as_str().to_owned(),
                fork: fork.name.as_str().to_owned(),
                add: false,
            };
            core.state.forks.remove(fork.name.as_str());
            let t = self.shards[src.shard].push(&src, rec)?;
            core.last_lsn = t.lsn;
            if !core.state.soft_deleted {
                drop(core);
                return t.wait();
            }
            core.state.forks.iter().cloned().collect()
        };
        if self.live_forks(&src, &remaining).is_empty() {
            let reg = self.registry.lock();
            let mut core = src.core.lock();
            if core.gone {
                return Ok(());
            }
            let rec = Record::Delete {
                name: src.name.as_str().to_owned(),
                incarnation: src.incarnation.as_str().to_owned(),
                soft: false,
            };
            let t = self.shards[src.shard].push(&src, rec)?;
            core.last_lsn = t.lsn;
            core.gone = true;
            drop(core);
            drop(reg);
            src.event.notify(usize::MAX);
            t.wait()?;
            self.release_source(&src)?;
        }
        Ok(())
    }
}
