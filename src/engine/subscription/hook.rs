//! The append path's view of subscriptions ([`Hook`]): whether any exist, which streams can
//! concern one, and the queue of published streams the subscription thread reads.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::name::StreamName;

use super::{Sub, TICK, glob};

/// The append path's view of subscriptions: whether any exist, which streams can concern one,
/// and the streams published since the subscription thread last looked.
pub(crate) struct Hook {
    pub(super) active: AtomicBool,
    filter: RwLock<Filter>,
    pub(super) queue: Mutex<HookQueue>,
    cv: Condvar,
}

/// The streams a publish can concern: every linked stream, and every stream under a pattern's
/// literal prefix (the thread matches the pattern itself).
#[derive(Default)]
struct Filter {
    names: HashSet<StreamName>,
    prefixes: Vec<String>,
}

#[derive(Default)]
pub(super) struct HookQueue {
    pub(super) touched: HashSet<StreamName>,
    stop: bool,
    /// The thread waits on `cv`: only then does a touch notify it.
    sleeping: bool,
}

impl Hook {
    /// A hook with no subscriptions.
    pub(crate) fn new() -> Arc<Hook> {
        Arc::new(Hook {
            active: AtomicBool::new(false),
            filter: RwLock::new(Filter::default()),
            queue: Mutex::new(HookQueue::default()),
            cv: Condvar::new(),
        })
    }

    /// Called by a committer for each stream a batch published. While no subscription exists
    /// that is one relaxed load; otherwise a stream no subscription can concern costs a read
    /// lock, a hash lookup and the pattern prefixes; one that can is queued for the
    /// subscription thread, which is woken only if it sleeps (so a burst of appends wakes it once).
    #[inline]
    pub(crate) fn touched(&self, name: &StreamName) {
        if self.active.load(Ordering::Relaxed) {
            self.touched_active(name);
        }
    }

    /// [`Hook::touched`] while subscriptions exist.
    fn touched_active(&self, name: &StreamName) {
        if name.as_str().starts_with("__ds/") {
            return;
        }
        {
            let f = self.filter.read();
            if !f.names.contains(name)
                && !f
                    .prefixes
                    .iter()
                    .any(|p| name.as_str().starts_with(p.as_str()))
            {
                return;
            }
        }
        let mut q = self.queue.lock();
        q.touched.insert(name.clone());
        if q.sleeping {
            self.cv.notify_one();
        }
    }

    /// Rebuilds the filter from every subscription.
    pub(super) fn refresh(&self, subs: &BTreeMap<String, Sub>) {
        let mut f = Filter::default();
        for sub in subs.values() {
            f.names.extend(sub.links.keys().cloned());
            if let Some(p) = &sub.config.pattern {
                f.prefixes
                    .push(format!("{}{}", sub.config.root, glob::literal_prefix(p)));
            }
        }
        *self.filter.write() = f;
        self.active.store(!subs.is_empty(), Ordering::Relaxed);
    }

    /// Tells the subscription thread to stop.
    pub(crate) fn stop(&self) {
        self.queue.lock().stop = true;
        self.cv.notify_all();
    }

    /// Waits up to `TICK` for touched names; `None` once stopped.
    pub(super) fn wait(&self) -> Option<Vec<StreamName>> {
        let mut q = self.queue.lock();
        if q.touched.is_empty() && !q.stop {
            q.sleeping = true;
            self.cv.wait_for(&mut q, TICK);
            q.sleeping = false;
        }
        if q.stop {
            return None;
        }
        Some(q.touched.drain().collect())
    }
}
