//! The SSE fan-out's shared tail: the frames (a `data` event and its `control` event) last
//! rendered for a stream, kept so that every subscriber at the same place takes the same bytes
//! instead of reading the engine and rendering them again. When one append wakes a thousand
//! subscribers, the first one woken reads and renders, and the others each clone a `Bytes`.
//!
//! A frame is keyed by what decides its bytes: where it starts, the connection's `max_bytes`
//! and the cursor in its control event (the incarnation, and with it the content type and the
//! encoding, is fixed per [`Tail`]). Its range is fixed by the key except at the tail: a frame
//! that reached the tail (`upToDate`) is taken only while the stream's durable tail and closure
//! are still what the frame says, so a subscriber gets exactly the bytes its own read would
//! have rendered at that moment. Only acknowledged data is ever in a frame (it was read from
//! the durable view).
//!
//! [`Tails`] maps each stream with SSE subscribers to its [`Tail`]; a connection holds its tail
//! through a [`TailRef`], and the entry goes when the last one does. A recreated stream (another
//! incarnation) gets a new tail; connections on the old one keep theirs until they end. A tail
//! also feeds its stream's writer (`service/seat.rs`, `transport/writer.rs`), which writes the
//! frames to the connections parked at it.
//!
//! Memory: a tail keeps at most [`TAIL_FRAMES`] frames, and only while two or more connections
//! hold it (a lone subscriber keeps none), so the frames kept add at most two events' worth
//! (each at most `SSE_EVENT_BYTES` of data, base64 a third larger) per live SSE reader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::{Incarnation, Offset, ReadFrom, ReadRequest, StreamName, Watch};

use super::AppState;
use super::cursor::interval_at;
use super::read::{has_data, read_woken};
use super::service::seat::{Feed, Frame, FrameKey, Writer};
use super::sse::{Encoding, render};

/// How many frames a tail keeps: subscribers a few appends apart (or with different
/// `max_bytes` or cursors) still share, and a lookup is a scan of this many keys.
const TAIL_FRAMES: usize = 4;

/// The frames last rendered for one incarnation of a stream.
pub(crate) struct Tail {
    /// The incarnation every frame here belongs to.
    incarnation: Incarnation,
    /// Up to [`TAIL_FRAMES`] frames, the newest last.
    frames: Mutex<Vec<Frame>>,
    /// The connections holding it ([`TailRef`]s; changed only under the map's lock).
    holders: AtomicUsize,
    /// What the writer of the connections parked here reads and renders with (set by the
    /// tail's first connection).
    pub(crate) source: std::sync::OnceLock<Source>,
    /// The writer of the connections parked at this tail.
    writer: Writer,
}

/// What a tail's writer reads and renders with, fixed per tail.
pub(crate) struct Source {
    /// The server.
    pub(crate) app: AppState,
    /// The stream.
    pub(crate) name: StreamName,
    /// Its incarnation (a read that finds another hands the seats back).
    pub(crate) incarnation: Incarnation,
    /// How its data events carry bytes.
    pub(crate) encoding: Encoding,
}

/// A tail feeds the transport's writer of its parked connections: the frames kept here, else
/// one read from the durable view and rendered (and kept for the others).
impl Feed for Tail {
    fn writer(&self) -> &Writer {
        &self.writer
    }

    fn watch(&self) -> Option<Watch> {
        let source = self.source.get()?;
        source.app.store.watch(&source.name).ok()
    }

    fn cursor_now(&self) -> u64 {
        interval_at(std::time::SystemTime::now())
    }

    fn frame(&self, key: &FrameKey, now: Option<(Offset, bool)>) -> Option<Frame> {
        if let Some(f) = self.get(key, now) {
            return Some(f);
        }
        let source = self.source.get()?;
        let req = ReadRequest {
            from: ReadFrom::At(key.start),
            max_bytes: key.max_bytes,
            expect: Some(source.incarnation.clone()),
            whole_messages: false,
        };
        let chunk = read_woken(&source.app.store, &source.name, &req).ok()?;
        if !has_data(&chunk) {
            return None;
        }
        let frame = render(&chunk, source.encoding, key.max_bytes, key.cursor);
        self.share(frame.clone());
        Some(frame)
    }
}

impl Tail {
    /// The frame for `key`, if one is kept and still what a read would render now: one short of
    /// the tail always is; one that reached the tail only while the stream's durable tail and
    /// closure (`now`, `None` once the stream cannot be read) are still the frame's.
    pub(crate) fn get(&self, key: &FrameKey, now: Option<(Offset, bool)>) -> Option<Frame> {
        let (tail, closed) = now?;
        let frames = self.frames.lock();
        let f = frames.iter().rev().find(|f| f.key == *key)?;
        if f.up_to_date && (f.next != tail || f.closed != closed) {
            return None;
        }
        Some(f.clone())
    }

    /// Keeps `frame` for the connections on this tail; none is kept while one connection or
    /// none holds it (nobody else could take it).
    pub(crate) fn share(&self, frame: Frame) {
        if self.holders.load(Ordering::Relaxed) > 1 {
            self.keep(frame);
        }
    }

    /// Keeps `frame` (in place of one with the same key, else of the oldest).
    fn keep(&self, frame: Frame) {
        let mut frames = self.frames.lock();
        if let Some(i) = frames.iter().position(|f| f.key == frame.key) {
            frames.remove(i);
        } else if frames.len() >= TAIL_FRAMES {
            frames.remove(0);
        }
        frames.push(frame);
    }
}

/// The tails of the streams that have SSE subscribers.
#[derive(Default)]
pub(crate) struct Tails {
    /// One entry per stream; it goes with the last [`TailRef`] of its tail.
    map: Mutex<HashMap<StreamName, Weak<Tail>>>,
}

/// A connection's hold on its stream's [`Tail`]; the map entry goes when the last one is dropped.
pub(crate) struct TailRef {
    /// The tail.
    tail: Arc<Tail>,
    /// Where it is registered.
    tails: Arc<Tails>,
    /// Under which name.
    name: StreamName,
}

impl std::ops::Deref for TailRef {
    type Target = Tail;

    fn deref(&self) -> &Tail {
        &self.tail
    }
}

impl TailRef {
    /// Keeps `frame` for the other connections on this tail (see [`Tail::share`]).
    pub(crate) fn put(&self, frame: Frame) {
        self.tail.share(frame);
    }

    /// The tail itself (for a connection's seat at its writer).
    pub(crate) fn shared(&self) -> Arc<Tail> {
        self.tail.clone()
    }
}

impl Drop for TailRef {
    /// Lets the frames go when one connection is left (it cannot share them), and removes the
    /// map entry when this was the last hold on a tail the map still names.
    fn drop(&mut self) {
        let mut map = self.tails.map.lock();
        let left = self.tail.holders.fetch_sub(1, Ordering::Relaxed) - 1;
        if left == 1 {
            self.tail.frames.lock().clear();
        }
        // Under the map lock no other connection can take a new hold through the map, so no
        // holder left is final.
        if left == 0
            && map
                .get(&self.name)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.tail)))
        {
            map.remove(&self.name);
        }
    }
}

impl Tails {
    /// The tail of `incarnation` of stream `name`, shared with every other connection on it (a
    /// new one when there is none, or the map's belongs to another incarnation).
    pub(crate) fn join(self: &Arc<Self>, name: &StreamName, incarnation: &Incarnation) -> TailRef {
        let mut map = self.map.lock();
        let tail = match map.get(name).and_then(Weak::upgrade) {
            Some(t) if t.incarnation == *incarnation => t,
            _ => {
                let t = Arc::new(Tail {
                    incarnation: incarnation.clone(),
                    frames: Mutex::new(Vec::with_capacity(TAIL_FRAMES)),
                    holders: AtomicUsize::new(0),
                    source: std::sync::OnceLock::new(),
                    writer: Writer::default(),
                });
                map.insert(name.clone(), Arc::downgrade(&t));
                t
            }
        };
        tail.holders.fetch_add(1, Ordering::Relaxed);
        drop(map);
        TailRef {
            tail,
            tails: self.clone(),
            name: name.clone(),
        }
    }

    /// How many streams have a tail now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn frame(start: u64, next: u64, cursor: u64, up_to_date: bool) -> Frame {
        Frame {
            key: FrameKey {
                start: Offset::new(0, start),
                max_bytes: Some(100),
                cursor,
            },
            next: Offset::new(0, next),
            up_to_date,
            closed: false,
            bytes: Bytes::from(format!("{start}..{next}")),
        }
    }

    /// A frame is found by its whole key; one at the tail only while the tail is still its
    /// end; one short of the tail always (while the stream can be read).
    #[test]
    fn frames_are_taken_only_while_they_are_what_a_read_renders() {
        let tails = Arc::new(Tails::default());
        let name = StreamName::new("s").expect("valid");
        let inc = Incarnation::new("i1").expect("valid");
        let t = tails.join(&name, &inc);
        let other = tails.join(&name, &inc);
        t.put(frame(0, 10, 7, false));
        t.put(frame(10, 20, 7, true));
        let at_20 = Some((Offset::new(0, 20), false));
        let got = t
            .get(&frame(10, 0, 7, true).key, at_20)
            .expect("at the tail");
        assert_eq!(&got.bytes[..], b"10..20");
        assert!(t.get(&frame(10, 0, 8, true).key, at_20).is_none(), "cursor");
        let at_30 = Some((Offset::new(0, 30), false));
        assert!(
            t.get(&frame(10, 0, 7, true).key, at_30).is_none(),
            "tail moved"
        );
        let closed_20 = Some((Offset::new(0, 20), true));
        assert!(
            t.get(&frame(10, 0, 7, true).key, closed_20).is_none(),
            "closed"
        );
        let got = t
            .get(&frame(0, 0, 7, false).key, at_30)
            .expect("short of the tail");
        assert_eq!(&got.bytes[..], b"0..10");
        assert!(t.get(&frame(0, 0, 7, false).key, None).is_none(), "deleted");
        // The oldest frame goes first; a frame with the same key replaces its predecessor.
        for i in 2..=TAIL_FRAMES as u64 {
            t.put(frame(i * 10, i * 10 + 10, 7, false));
        }
        assert!(
            t.get(&frame(0, 0, 7, false).key, at_30).is_none(),
            "evicted"
        );
        t.put(frame(20, 25, 7, false));
        let got = t.get(&frame(20, 0, 7, false).key, at_30).expect("replaced");
        assert_eq!(&got.bytes[..], b"20..25");
        assert_eq!(t.frames.lock().len(), TAIL_FRAMES);
        // With one connection left, nothing is kept.
        drop(other);
        assert!(
            t.get(&frame(20, 0, 7, false).key, at_30).is_none(),
            "let go"
        );
        t.put(frame(20, 25, 7, false));
        assert!(t.frames.lock().is_empty(), "a lone subscriber keeps none");
    }

    /// Connections on one incarnation share a tail; another incarnation gets its own; the entry
    /// goes with the last hold.
    #[test]
    fn tails_are_shared_per_incarnation_and_dropped_with_the_last_hold() {
        let tails = Arc::new(Tails::default());
        let name = StreamName::new("s").expect("valid");
        let (i1, i2) = (
            Incarnation::new("i1").expect("valid"),
            Incarnation::new("i2").expect("valid"),
        );
        let a = tails.join(&name, &i1);
        let b = tails.join(&name, &i1);
        assert!(Arc::ptr_eq(&a.tail, &b.tail));
        let c = tails.join(&name, &i2);
        assert!(!Arc::ptr_eq(&a.tail, &c.tail));
        drop((a, b));
        assert_eq!(
            tails.len(),
            1,
            "the old incarnation's holds do not remove the new entry"
        );
        drop(c);
        assert_eq!(tails.len(), 0);
    }
}
