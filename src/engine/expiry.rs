//! Expiry.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::state::now_ms;
use crate::types::Expiry;

use super::Engine;
use super::stream::Stream;

impl Engine {
    pub(super) fn expire(&self, s: &Arc<Stream>) {
        if let Ok(p) = self.delete_stream(s, None, true) {
            let _ = p.ticket.wait();
        }
    }
}
/// Deletes expired streams in the background, so their waiters wake and their space is freed.
pub(super) fn reaper(engine: Weak<Engine>, stop: Arc<(Mutex<bool>, Condvar)>) {
    loop {
        {
            let (m, cv) = &*stop;
            let mut stopped = m.lock();
            if *stopped {
                return;
            }
            cv.wait_for(&mut stopped, Duration::from_millis(250));
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
