//! Limits facing the internet: a cap on open connections and on live readers (SSE connections
//! and long-polls waiting at the tail), in total and per stream, and the counters of what the
//! edge refused. The request-header read timeout (slowloris) is enforced by brook's HTTP/1.1 loop
//! (`transport/h1/`) and by hyper's, both set from
//! [`ServerConfig::header_read_timeout`](super::ServerConfig::header_read_timeout); the TLS
//! handshake gets the same bound in `serve`.
//!
//! Every refusal is 503 with `Retry-After` and a problem+json `code`: `TOO_MANY_CONNECTIONS`
//! (answered on the refused connection itself, which is then closed) or
//! `TOO_MANY_LIVE_READERS`. Catch-up reads and writes are never refused by these caps.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use parking_lot::Mutex;

use crate::{Store, StreamName};

use super::ServerConfig;
use super::error::ApiError;
use super::reply::problem;

/// Most bytes of request headers (names and values) brook reads.
pub(crate) const MAX_HEADER_BYTES: usize = 64 << 10;

/// The `Retry-After` of every refusal here, in seconds.
pub(crate) const RETRY_AFTER_SECS: u32 = 2;

/// How long a connection refused for [`ServerConfig::max_connections`] may take to send its
/// request and read the 503 before it is closed regardless.
pub(crate) const REFUSAL_GRACE: Duration = Duration::from_secs(2);

/// Connections the lent stream-file budget counts in steps of ([`Lender`]).
const LEND_STEP: usize = 256;

/// Connections a lent budget leaves room for beyond the step of those open: what may be
/// accepted before the next step lowers the budget, and what the streams may hold over a
/// lowered budget until the next lookup puts the surplus at rest.
const LEND_HEADROOM: usize = 1024;

/// The fewest descriptors a lent budget gives the streams.
const LEND_MIN: usize = 128;

/// Descriptors the streams put at rest when accepting a connection fails for want of one.
pub(crate) const SHED_ON_EMFILE: usize = 512;

/// Lends the store's streams the descriptors the server's sockets leave
/// ([`ServerConfig::lend_descriptors`]): `limit - 256 - (sockets rounded up to LEND_STEP +
/// LEND_HEADROOM)`, at least [`LEND_MIN`], set again each time the sockets cross a step.
/// Sockets are every accepted connection, those being refused (over `max_connections`, for up
/// to [`REFUSAL_GRACE`]) included. A server sized for 10,000 connections under a 20,000 limit
/// that serves a few hundred then keeps 18,000 streams' files open, not 9,700; one that fills
/// up with connections gives them their descriptors back as streams go to rest.
pub(crate) struct Lender {
    store: Store,
    /// The soft open-file limit.
    limit: usize,
    /// Sockets open now.
    sockets: AtomicUsize,
    /// The step of open sockets the budget was last set for.
    step: AtomicUsize,
    /// Held while the budget is set, so the last one set is for the newest step.
    setting: Mutex<()>,
}

/// One socket counted by a [`Lender`] until dropped.
pub(crate) struct Socket(Arc<Lender>);

impl Drop for Socket {
    fn drop(&mut self) {
        let now = self.0.sockets.fetch_sub(1, Ordering::Relaxed) - 1;
        self.0.follow(now);
    }
}

impl Lender {
    /// A lender over `store`, its budget set for no connections; `None` when the open-file
    /// limit cannot be read.
    pub(crate) fn new(store: Store) -> Option<Lender> {
        let limit = usize::try_from(crate::fs::raise_open_file_limit()?).unwrap_or(usize::MAX);
        let lender = Lender {
            store,
            limit,
            sockets: AtomicUsize::new(0),
            step: AtomicUsize::new(0),
            setting: Mutex::new(()),
        };
        lender.lend();
        Some(lender)
    }

    /// Counts an accepted socket until the returned value is dropped.
    pub(crate) fn socket(self: &Arc<Self>) -> Socket {
        let now = self.sockets.fetch_add(1, Ordering::Relaxed) + 1;
        self.follow(now);
        Socket(self.clone())
    }

    /// `open` sockets are open now: sets the budget again if they crossed a step.
    fn follow(&self, open: usize) {
        let step = open.div_ceil(LEND_STEP);
        if self.step.swap(step, Ordering::Relaxed) != step {
            self.lend();
        }
    }

    /// The budget for the sockets of a step.
    fn budget_for(&self, step: usize) -> usize {
        self.limit
            .saturating_sub(crate::fs::DESCRIPTOR_RESERVE as usize)
            .saturating_sub(step * LEND_STEP + LEND_HEADROOM)
            .max(LEND_MIN)
    }

    fn lend(&self) {
        let _setting = self.setting.lock();
        let step = self.step.load(Ordering::Relaxed);
        self.store.set_max_stream_files(self.budget_for(step));
    }
}

/// What the internet-facing edge refused or failed, since the server started: relaxed atomic
/// counters on the app state, for the metrics endpoint to export (each only ever grows, except
/// [`EdgeCounters::live_readers`], a gauge).
#[derive(Debug, Default)]
pub(crate) struct EdgeCounters {
    /// Connections answered 503 `TOO_MANY_CONNECTIONS` (over `max_connections`).
    pub(crate) connections_refused: AtomicU64,
    /// Live reads answered 503 `TOO_MANY_LIVE_READERS` (over either live-reader cap).
    pub(crate) live_readers_refused: AtomicU64,
    /// Live readers open now (SSE connections, long-polls waiting at the tail).
    pub(crate) live_readers: AtomicUsize,
    /// TLS handshakes that failed or did not finish within `header_read_timeout`.
    pub(crate) tls_handshakes_failed: AtomicU64,
    /// Certificate reloads (file change) that failed and kept the certificate in use.
    pub(crate) tls_reloads_failed: AtomicU64,
    /// Requests refused 401 by access control (no, bad or expired token).
    pub(crate) unauthorized: AtomicU64,
    /// Requests refused 403 by access control (outside the token's grants).
    pub(crate) forbidden: AtomicU64,
}

/// The live readers of the server: their count (in [`EdgeCounters::live_readers`]) and, when a
/// per-stream cap is set, their count per stream.
#[derive(Debug, Default)]
pub(crate) struct LiveReaders {
    /// Live readers per stream; only kept when `max_live_readers_per_stream` is set.
    per_stream: Mutex<HashMap<StreamName, usize>>,
}

/// One admitted live reader; dropping it frees its place.
pub(crate) struct LiveSlot {
    /// The counters whose gauge counts it.
    counters: Arc<EdgeCounters>,
    /// Where it is counted per stream, if it is.
    stream: Option<(Arc<LiveReaders>, StreamName)>,
}

impl Drop for LiveSlot {
    /// Counts the reader out.
    fn drop(&mut self) {
        self.counters.live_readers.fetch_sub(1, Ordering::Relaxed);
        if let Some((live, name)) = &self.stream {
            let mut map = live.per_stream.lock();
            if let Some(n) = map.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    map.remove(name);
                }
            }
        }
    }
}

/// Admits one more live reader of `name`, or refuses it with 503 `TOO_MANY_LIVE_READERS` when
/// the server or the stream is at its cap.
pub(crate) fn admit_live_reader(
    config: &ServerConfig,
    counters: &Arc<EdgeCounters>,
    live: &Arc<LiveReaders>,
    name: &StreamName,
) -> Result<LiveSlot, ApiError> {
    let before = counters.live_readers.fetch_add(1, Ordering::Relaxed);
    // From here the slot counts itself out when dropped, refused or not.
    let mut slot = LiveSlot {
        counters: counters.clone(),
        stream: None,
    };
    if before >= config.max_live_readers {
        return Err(refuse_live(counters, "this server"));
    }
    if let Some(cap) = config.max_live_readers_per_stream {
        let mut map = live.per_stream.lock();
        let n = map.entry(name.clone()).or_insert(0);
        if *n >= cap {
            drop(map);
            return Err(refuse_live(counters, "this stream"));
        }
        *n += 1;
        drop(map);
        slot.stream = Some((live.clone(), name.clone()));
    }
    Ok(slot)
}

/// The refusal of a live reader over the cap of `whose`.
fn refuse_live(counters: &EdgeCounters, whose: &str) -> ApiError {
    counters
        .live_readers_refused
        .fetch_add(1, Ordering::Relaxed);
    ApiError::Unavailable {
        code: "TOO_MANY_LIVE_READERS",
        detail: format!(
            "{whose} has as many live readers (SSE, long-poll) as it accepts; retry later"
        ),
        retry_after: RETRY_AFTER_SECS,
    }
}

/// The answer on a connection over `max_connections`, which is then closed.
pub(crate) fn too_many_connections() -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "TOO_MANY_CONNECTIONS",
        "this server has as many connections open as it accepts; retry later",
        headers,
        serde_json::Map::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers are counted in and out, in total and per stream; a refused one leaves no count.
    #[test]
    fn live_readers_are_counted_in_and_out() {
        let config = ServerConfig {
            max_live_readers: 3,
            max_live_readers_per_stream: Some(2),
            ..ServerConfig::default()
        };
        let counters = Arc::new(EdgeCounters::default());
        let live = Arc::new(LiveReaders::default());
        let a = StreamName::new("a").expect("valid");
        let b = StreamName::new("b").expect("valid");
        let a1 = admit_live_reader(&config, &counters, &live, &a).expect("first");
        let a2 = admit_live_reader(&config, &counters, &live, &a).expect("second");
        let refused = |name| {
            admit_live_reader(&config, &counters, &live, name)
                .err()
                .map(|e| e.code())
        };
        assert_eq!(refused(&a), Some("TOO_MANY_LIVE_READERS"));
        let b1 = admit_live_reader(&config, &counters, &live, &b).expect("other stream");
        assert_eq!(refused(&b), Some("TOO_MANY_LIVE_READERS"), "total cap");
        assert_eq!(counters.live_readers.load(Ordering::Relaxed), 3);
        assert_eq!(counters.live_readers_refused.load(Ordering::Relaxed), 2);
        drop((a1, a2, b1));
        assert_eq!(counters.live_readers.load(Ordering::Relaxed), 0);
        assert!(live.per_stream.lock().is_empty());
    }
}
