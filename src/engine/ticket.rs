//! Durability tickets and the batches they wait on.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use event_listener::{Event, Listener};

use crate::error::{Error, Result};

use super::shard::Shard;

/// The completion of one journal batch: every record in it becomes durable (or fails) at once,
/// so only the writers waiting on this batch are woken when it is synced.
pub(super) struct Batch {
    /// 0 pending, 1 durable, 2 failed (the shard is poisoned).
    pub(super) state: std::sync::atomic::AtomicU8,
    pub(super) event: Event,
}

impl Batch {
    pub(super) fn new() -> Arc<Batch> {
        Arc::new(Batch {
            state: std::sync::atomic::AtomicU8::new(0),
            event: Event::new(),
        })
    }

    pub(super) fn finish(&self, ok: bool) {
        self.state.store(if ok { 1 } else { 2 }, Ordering::Release);
        self.event.notify(usize::MAX);
    }
}

/// A durability ticket: what a caller must see durable before acknowledging. A writer's ticket
/// names its batch; a ticket for state read from the stream names an LSN.
pub(crate) struct Ticket {
    pub(super) shard: Option<Arc<Shard>>,
    pub(super) lsn: u64,
    pub(super) batch: Option<Arc<Batch>>,
}

impl Ticket {
    pub(super) fn poll(&self) -> Option<Result<()>> {
        if let Some(b) = &self.batch {
            return match b.state.load(Ordering::Acquire) {
                0 => None,
                1 => Some(Ok(())),
                _ => Some(Err(Error::Poisoned)),
            };
        }
        let shard = self.shard.as_ref()?;
        if shard.durable_lsn.load(Ordering::Acquire) >= self.lsn {
            return Some(Ok(()));
        }
        if shard.poisoned.load(Ordering::Acquire) {
            return Some(Err(Error::Poisoned));
        }
        None
    }

    pub(super) fn listen(&self) -> Option<event_listener::EventListener> {
        match (&self.batch, &self.shard) {
            (Some(b), _) => Some(b.event.listen()),
            (None, Some(shard)) => Some(shard.durable.listen()),
            (None, None) => None,
        }
    }

    /// Buffered mode: commits the batch on this thread unless another one is at it.
    pub(super) fn help(&self) {
        if let (Some(shard), Some(_)) = (&self.shard, &self.batch)
            && shard.inline
            && self.poll().is_none()
        {
            shard.commit_inline();
        }
    }

    /// The outcome if there is one, else a listener registered before a last look (so no
    /// completion can slip between the look and the sleep).
    pub(super) fn outcome_or_listener(
        &self,
    ) -> std::result::Result<Result<()>, event_listener::EventListener> {
        if let Some(r) = self.poll() {
            return Ok(r);
        }
        let Some(l) = self.listen() else {
            return Ok(Ok(()));
        };
        match self.poll() {
            Some(r) => Ok(r),
            None => Err(l),
        }
    }

    pub(crate) fn wait(&self) -> Result<()> {
        self.help();
        loop {
            match self.outcome_or_listener() {
                Ok(r) => return r,
                Err(l) => l.wait(),
            }
        }
    }

    pub(crate) async fn wait_async(&self) -> Result<()> {
        self.help();
        loop {
            match self.outcome_or_listener() {
                Ok(r) => return r,
                Err(l) => l.await,
            }
        }
    }
}

impl Drop for Ticket {
    /// A write nobody waits for is committed now, not when the shard thread next looks.
    fn drop(&mut self) {
        self.help();
    }
}
