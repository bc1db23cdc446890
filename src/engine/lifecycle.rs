//! A stream's lifecycle: create (and fork, a create with a source), confirming an existing
//! stream, delete (soft while forks read from it), and releasing a fork's source.
//!
//! Lock order here, as everywhere: registry → `core` (of the source, then of the new stream;
//! one stream's `core` at a time otherwise). Forks record themselves in their source's fork list
//! (a `ForkRef` record in the source's shard) before their own Create record is enqueued.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::journal::Record;
use crate::error::{Error, Result};
use crate::fs;
use crate::name::{
    Incarnation, MAX_FORK_DEPTH, Offset, StreamName, is_json, normalize_content_type,
};
use crate::options::Durability;
use crate::state::{AppendRecord, Config, StreamState, filter_stream_seq, prepare_body, to_ms};
use crate::store::Pending;
use crate::types::{CreateOptions, Created, Expiry, ForkFrom};

use super::Engine;
use super::stream::Stream;

impl Engine {
    /// Creates a stream (a fork when `req.fork` names a source), or answers for an existing
    /// one: idempotent success if the request matches its configuration, `ConfigMismatch` if
    /// not (see [`Engine::confirm_existing`]). An expired stream in the way is deleted first.
    ///
    /// The new stream is registered (and so visible to checks) at once, but nothing of it is
    /// readable until its Create record is durable; the returned `Pending` resolves then. A
    /// fork waits here for its `ForkRef` record in the source's shard.
    pub(crate) fn create(
        &self,
        name: &StreamName,
        mut req: CreateOptions,
    ) -> Result<Pending<Created>> {
        if req.data.len() > self.options.max_append_bytes {
            return Err(Error::TooLarge(format!(
                "body is larger than {} bytes",
                self.options.max_append_bytes
            )));
        }
        let stream_seq = filter_stream_seq(req.stream_seq.clone())?;
        req.retention.validate()?;
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
            let expired = existing.expired();
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
                if src.expired() {
                    self.expire(&src);
                    return Err(Error::ForkSourceNotFound);
                }
                self.check_fork_depth(&src)?;
                let sct = src.config.content_type.clone();
                if let Some(ct) = &requested_ct
                    && *ct != sct
                {
                    return Err(Error::ContentTypeMismatch { expected: sct });
                }
                let pos = self.fork_position(&src, f)?;
                if self.options.durability == Durability::Buffered {
                    // Acknowledged, so written: `pos` is at most the source's durable tail.
                    self.sync_fork_source(&src)?;
                }
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
        let body = prepare_body(
            json,
            std::mem::take(&mut req.data),
            true,
            self.options.max_append_messages,
        )?;
        let config = Config {
            name: name.as_str().to_owned(),
            incarnation: self.new_incarnation(name.as_str()),
            content_type,
            expiry,
            fork,
            retention: req.retention,
        };
        let mut state = StreamState::new(config, base);
        // A fork's data starts where its source's readable data starts: what retention retired
        // there is not served through the fork either (it may already be reclaimed).
        if let Some(src) = &source {
            state.earliest = src.visible().earliest;
        }

        let mut reg = self.room_to_open()?;
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
            let rec = src.fork_ref_record(name, true);
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
            digest: None,
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
        self.register(&mut reg, name.as_str(), stream.clone());
        drop(reg);
        self.counters.creates.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            stream = name.as_str(),
            incarnation = stream.incarnation.as_str(),
            fork = stream.config.fork.as_ref().map(|(src, _)| src.as_str()),
            "create stream"
        );
        if let Some(t) = fork_ticket {
            t.wait()?;
        }
        let info = stream.staged_info(&stream.core.lock().state);
        Ok(Pending::new(
            Created {
                created: true,
                info,
            },
            ticket,
        ))
    }

    /// Buffered mode: makes what a new fork inherits durable before the fork's create is
    /// journaled, with one `syncfs`. Nothing has synced its source's journal records or the
    /// bytes of its placed appends in its logs; a machine crash could otherwise take them and
    /// keep the fork's create (in another shard's journal, or in the same one: the placed bytes
    /// are in the log, not the journal), leaving a fork whose inherited range is gone. A failure
    /// poisons the source's shard: after a failed sync only recovery knows what is on disk.
    fn sync_fork_source(&self, src: &Stream) -> Result<()> {
        let synced = std::fs::File::open(&self.root).and_then(|dir| fs::sync_fs(&dir, &self.root));
        if let Err(e) = synced {
            let shard = &self.shards[src.shard];
            shard.poison(e.into());
            return Err(shard.poisoned_error());
        }
        Ok(())
    }

    /// The registry, locked, with room for one more open stream. At `max_open_streams` it
    /// closes idle streams; if every open stream still has unrecorded changes, it checkpoints
    /// (so they can close) and tries again, and refuses with `TooManyOpenStreams` only if that
    /// did not make room. A create that would open a stream's files (descriptors) beyond the
    /// budget is refused here, before its record reaches the journal, rather than failing there.
    fn room_to_open(&self) -> Result<parking_lot::MutexGuard<'_, HashMap<String, Arc<Stream>>>> {
        let mut reg = self.registry.lock();
        self.room_for_one(&mut reg)?;
        Ok(reg)
    }

    /// Refuses a fork of `src` when `src` is already [`MAX_FORK_DEPTH`] forks deep
    /// (`ForkTooDeep`), walking its chain (at most that many lookups).
    fn check_fork_depth(&self, src: &Arc<Stream>) -> Result<()> {
        let mut depth = 0;
        let mut cur = src.clone();
        while cur.config.fork.is_some() {
            depth += 1;
            if depth >= MAX_FORK_DEPTH {
                return Err(Error::ForkTooDeep {
                    max: MAX_FORK_DEPTH,
                });
            }
            cur = self.source_of(&cur)?;
        }
        Ok(())
    }

    /// Answers a create that found `s` (with `ct` the request's normalized content type and
    /// `expiry` its expiry): success without writing (`created: false`, durable once `s`'s
    /// staged state is) if the request's configuration matches, else `ConfigMismatch` naming
    /// the difference, or `IncarnationMismatch` for a wrong `expect`. A soft-deleted stream
    /// matches no request.
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
        if req.retention != s.config.retention {
            return Err(Error::ConfigMismatch("retention policy differs"));
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
        Ok(Pending::new(
            Created {
                created: false,
                info,
            },
            ticket,
        ))
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
        if !self.is_boundary(src, at.bytes)? || self.check_halves(src, at).is_err() {
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

    /// Deletes a live stream (see [`Engine::live`]) in the `expect`ed incarnation. A stream that
    /// live forks read from is only soft-deleted: it answers `Gone` to clients and goes once
    /// its last fork does. The returned `Pending` resolves once the delete record is durable.
    pub(crate) fn delete(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Result<Pending<()>> {
        let s = self.live(name)?;
        self.delete_stream(&s, expect, false)
    }

    /// The names among `names` (from `s`'s fork list, which may be stale) of forks that still
    /// exist and still read from `s`. Looks each one up: call without holding any lock.
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

    /// Deletes `s`: soft if live forks read from it, else hard (the stream becomes a tombstone
    /// and its source, if it is a fork, is released). `expiring` skips the incarnation check
    /// (the reaper's delete). Under the registry lock and `s`'s `core`, so no lookup finds the
    /// stream between the check and the record.
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
        let ticket = shard.push(s, s.delete_record(soft))?;
        core.last_lsn = ticket.lsn;
        if soft {
            core.state.soft_deleted = true;
        } else {
            core.gone = true;
        }
        drop(core);
        drop(reg);
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(stream = s.name.as_str(), soft, expiring, "delete stream");
        s.event.notify(usize::MAX);
        if !soft {
            self.release_source(s)?;
        }
        Ok(Pending::new((), ticket))
    }

    /// After a fork is gone: drop it from its source's fork list, and collect a soft-deleted
    /// source that no live fork reads any more (cascading up the chain).
    ///
    /// Recursion: collecting a source hard-deletes it, which releases *its* source in turn; it
    /// stops at the first source that is not soft-deleted or still has a live fork, and at the
    /// root of the chain (a stream that is no fork). Waits for each record to be durable.
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
            let rec = src.fork_ref_record(&fork.name, false);
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
            let t = self.shards[src.shard].push(&src, src.delete_record(false))?;
            core.last_lsn = t.lsn;
            core.gone = true;
            drop(core);
            drop(reg);
            tracing::debug!(
                stream = src.name.as_str(),
                "delete stream: its last fork is gone"
            );
            src.event.notify(usize::MAX);
            t.wait()?;
            self.release_source(&src)?;
        }
        Ok(())
    }
}
