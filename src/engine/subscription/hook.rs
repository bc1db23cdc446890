//! The append path's view of subscriptions ([`Hook`]): whether any exist, which streams can
//! concern one, and the queue of published streams the subscription thread reads.

use std::collections::{BTreeMap, HashMap, HashSet};
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

/// The streams a publish can concern: every explicitly linked stream, and every stream under a
/// pattern's literal prefix (the thread matches the pattern itself; a glob link is always under
/// its pattern's prefix, so only explicit links need their names here).
#[derive(Default)]
struct Filter {
    /// Explicitly linked streams, with how many subscriptions link each.
    names: HashMap<StreamName, usize>,
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
            if !f.names.contains_key(name)
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

    /// Rebuilds the filter from every subscription (a create or a delete: one pass over the
    /// subscriptions and their links).
    pub(super) fn refresh(&self, subs: &BTreeMap<String, Sub>) {
        let mut f = Filter::default();
        for sub in subs.values() {
            for (name, l) in &sub.links {
                if l.explicit {
                    *f.names.entry(name.clone()).or_default() += 1;
                }
            }
            if let Some(p) = &sub.config.pattern {
                f.prefixes
                    .push(format!("{}{}", sub.config.root, glob::literal_prefix(p)));
            }
        }
        *self.filter.write() = f;
        self.active.store(!subs.is_empty(), Ordering::Relaxed);
    }

    /// Follows a change of explicit links: `true` for a stream now linked explicitly, `false`
    /// for one no longer (what [`Sub::apply`] returns).
    pub(super) fn explicit_changed(&self, changed: &[(StreamName, bool)]) {
        if changed.is_empty() {
            return;
        }
        let mut f = self.filter.write();
        for (name, linked) in changed {
            if *linked {
                *f.names.entry(name.clone()).or_default() += 1;
            } else if let Some(n) = f.names.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    f.names.remove(name);
                }
            }
        }
    }

    /// Tells the subscription thread to stop.
    pub(crate) fn stop(&self) {
        self.queue.lock().stop = true;
        self.cv.notify_all();
    }

    /// Waits up to `TICK` for touched names; `false` once stopped. The names stay queued: the
    /// thread takes them with [`Hook::take`] while it holds the subscriptions' state.
    pub(super) fn wait(&self) -> bool {
        let mut q = self.queue.lock();
        if q.touched.is_empty() && !q.stop {
            q.sleeping = true;
            self.cv.wait_for(&mut q, TICK);
            q.sleeping = false;
        }
        !q.stop
    }

    /// Takes the touched names. Called with the subscriptions' state held, so whoever holds it
    /// finds a published name either here or among the subscriptions' candidates.
    pub(super) fn take(&self) -> Vec<StreamName> {
        self.queue.lock().touched.drain().collect()
    }

    /// Calls `f` on each touched name not taken yet.
    pub(super) fn peek(&self, mut f: impl FnMut(&StreamName)) {
        for n in &self.queue.lock().touched {
            f(n);
        }
    }
}
