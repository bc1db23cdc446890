//! Expiry: an expired stream behaves as absent. Requests that find one delete it on the spot
//! (`Engine::live`); the reaper thread deletes expired open streams every [`REAP_EVERY`], so
//! their waiters wake and their space is freed. Soft-deleted streams are kept for their forks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::state::now_ms;
use crate::types::Expiry;

use super::Engine;
use super::stream::Stream;

/// How often the reaper looks for expired streams.
const REAP_EVERY: Duration = Duration::from_millis(250);

impl Engine {
    /// Deletes an expired stream (without an incarnation check) and waits until the delete is
    /// durable. Best effort: a stream deleted meanwhile, or a failed delete, is left as it is
    /// (a poisoned shard refuses everything anyway).
    pub(super) fn expire(&self, s: &Arc<Stream>) {
        if let Ok(p) = self.delete_stream(s, None, true) {
            let _ = p.wait();
        }
    }
}

/// The reaper thread: every [`REAP_EVERY`] deletes the open streams that have expired, until
/// `stop` is set or the engine is dropped. It holds the engine only while it works.
pub(super) fn reaper(engine: &Weak<Engine>, stop: &(Mutex<bool>, Condvar)) {
    loop {
        {
            let (m, cv) = stop;
            let mut stopped = m.lock();
            if *stopped {
                return;
            }
            cv.wait_for(&mut stopped, REAP_EVERY);
            if *stopped {
                return;
            }
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let now = now_ms();
        let expired: Vec<Arc<Stream>> = engine
            .registry
            .lock()
            .values()
            .filter(|s| s.config.expiry != Expiry::Never && s.expired_at(now))
            .cloned()
            .collect();
        for s in expired {
            if !s.core.lock().state.soft_deleted {
                engine.expire(&s);
            }
        }
    }
}
