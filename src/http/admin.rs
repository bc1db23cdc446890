//! brook's operations routes under the reserved prefix `/__brook/` (no stream name starts with
//! it): `metrics` (Prometheus text), `live` and `ready` (health), `streams` (listing by prefix);
//! and the server's own request counters ([`Metrics`]). (While the store is still opening, the
//! transport's `serve_starting` answers instead.)
//!
//! | route | method | answers |
//! |---|---|---|
//! | `/__brook/metrics` | `GET` | `200`, the Prometheus text exposition (format 0.0.4) |
//! | `/__brook/live` | `GET` `HEAD` | `200` while the process serves requests (also while the store opens) |
//! | `/__brook/ready` | `GET` `HEAD` | `200` once the store is open; `503` `STARTING` while it opens, `503` `POISONED` while a journal shard is poisoned, `503` `MEMORY_BUDGET` while the memory budget outside its reserve is spent |
//! | `/__brook/streams?prefix=P&limit=N&after=C` | `GET` | `200`, a page of streams (JSON: name, content type, tail, closed) and the cursor of the next page |
//!
//! Request counting costs one relaxed atomic add per request (two more for an append's latency);
//! an error adds one short critical section (the count per error code).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use parking_lot::Mutex;
use prometheus::proto::{Bucket, Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::stats::{AtomicHistogram, LATENCY_BOUNDS};
use crate::{Histogram, Stats};

use super::budget::{Budget, Cause, Use};
use super::error::ApiError;
use super::reply::{json, problem};
use super::{AppState, Op, blocking};

/// What a request addressed, as its metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RouteKind {
    /// `PUT {s}`.
    Create,
    /// `POST {s}`.
    Append,
    /// `GET {s}` (catch-up, long-poll or SSE).
    Read,
    /// `HEAD {s}`.
    Head,
    /// `DELETE {s}`.
    Delete,
    /// `{s}/snapshot...`.
    Snapshot,
    /// `PUT {s}/retention/{offset}`.
    Retention,
    /// `GET {s}/bootstrap`.
    Bootstrap,
    /// `/__brook/...`.
    Admin,
    /// `/__ds/...`.
    Protocol,
    /// `OPTIONS` (CORS preflight).
    Preflight,
    /// A path that names no route (an invalid stream name), or a method no route serves.
    Other,
}

/// Every route kind, in declaration order (a kind's `as usize` is its index here).
pub(crate) const KINDS: [RouteKind; 12] = [
    RouteKind::Create,
    RouteKind::Append,
    RouteKind::Read,
    RouteKind::Head,
    RouteKind::Delete,
    RouteKind::Snapshot,
    RouteKind::Retention,
    RouteKind::Bootstrap,
    RouteKind::Admin,
    RouteKind::Protocol,
    RouteKind::Preflight,
    RouteKind::Other,
];

impl RouteKind {
    /// The `route` label.
    fn label(self) -> &'static str {
        match self {
            RouteKind::Create => "create",
            RouteKind::Append => "append",
            RouteKind::Read => "read",
            RouteKind::Head => "head",
            RouteKind::Delete => "delete",
            RouteKind::Snapshot => "snapshot",
            RouteKind::Retention => "retention",
            RouteKind::Bootstrap => "bootstrap",
            RouteKind::Admin => "admin",
            RouteKind::Protocol => "protocol",
            RouteKind::Preflight => "preflight",
            RouteKind::Other => "other",
        }
    }

    /// The kind of a stream route's request by its method.
    pub(crate) fn of_stream(m: &Method) -> RouteKind {
        match *m {
            Method::PUT => RouteKind::Create,
            Method::POST => RouteKind::Append,
            Method::GET => RouteKind::Read,
            Method::HEAD => RouteKind::Head,
            Method::DELETE => RouteKind::Delete,
            _ => RouteKind::Other,
        }
    }
}

/// Status codes 100 to 599, one counter each per route kind.
const STATUSES: usize = 500;

/// The server's own figures (the engine's come from [`Store::stats`](crate::Store::stats)).
pub(crate) struct Metrics {
    /// Requests answered, by route kind and status (`status - 100`).
    requests: Vec<[AtomicU64; STATUSES]>,
    /// Seconds from an append's request to its response head (its durability included).
    append_latency: AtomicHistogram,
    /// Refusals by problem `code`.
    errors: Mutex<BTreeMap<&'static str, u64>>,
    /// SSE connections open now.
    sse_readers: AtomicI64,
    /// Long-poll requests waiting now.
    long_poll_readers: AtomicI64,
}

impl Default for Metrics {
    /// Every count at zero.
    fn default() -> Self {
        Metrics {
            requests: KINDS
                .iter()
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            append_latency: AtomicHistogram::new(LATENCY_BOUNDS),
            errors: Mutex::new(BTreeMap::new()),
            sse_readers: AtomicI64::new(0),
            long_poll_readers: AtomicI64::new(0),
        }
    }
}

impl Metrics {
    /// Counts one answered request of `kind` with `status`, which took `took` to its head.
    pub(crate) fn request(&self, kind: RouteKind, status: StatusCode, took: Duration) {
        let i = kind as usize;
        let s = usize::from(status.as_u16())
            .saturating_sub(100)
            .min(STATUSES - 1);
        self.requests[i][s].fetch_add(1, Ordering::Relaxed);
        if kind == RouteKind::Append {
            self.append_latency.observe_duration(took);
        }
    }

    /// [`Metrics::request`] for a request that started at `started`: the clock is read only
    /// for the latency an append observes.
    pub(crate) fn request_since(
        &self,
        kind: RouteKind,
        status: StatusCode,
        started: std::time::Instant,
    ) {
        let took = if kind == RouteKind::Append {
            started.elapsed()
        } else {
            Duration::ZERO
        };
        self.request(kind, status, took);
    }

    /// Counts one refusal with problem `code`.
    pub(crate) fn error(&self, code: &'static str) {
        *self.errors.lock().entry(code).or_insert(0) += 1;
    }

    /// Counts an SSE connection as open until the returned guard is dropped.
    pub(crate) fn sse_reader(self: &std::sync::Arc<Self>) -> Reader {
        self.sse_readers.fetch_add(1, Ordering::Relaxed);
        Reader(self.clone(), true)
    }

    /// Counts a long-poll as waiting until the returned guard is dropped.
    pub(crate) fn long_poll_reader(self: &std::sync::Arc<Self>) -> Reader {
        self.long_poll_readers.fetch_add(1, Ordering::Relaxed);
        Reader(self.clone(), false)
    }
}

/// A live reader counted in [`Metrics`] (SSE when the flag is set, else long-poll) until dropped.
pub(crate) struct Reader(std::sync::Arc<Metrics>, bool);

impl Drop for Reader {
    /// Counts the reader out.
    fn drop(&mut self) {
        let gauge = if self.1 {
            &self.0.sse_readers
        } else {
            &self.0.long_poll_readers
        };
        gauge.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sends `/__brook/{rest}` to its handler.
pub(crate) async fn dispatch(
    app: &AppState,
    rest: &str,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let read_only = |allow: &'static str| {
        if parts.method == Method::GET || parts.method == Method::HEAD {
            Ok(())
        } else {
            Err(ApiError::MethodNotAllowed { allow })
        }
    };
    match rest {
        "metrics" => {
            read_only("GET, HEAD, OPTIONS")?;
            metrics(app).await
        }
        "live" => {
            read_only("GET, HEAD, OPTIONS")?;
            Ok(json(StatusCode::OK, r#"{"status":"live"}"#))
        }
        "ready" => {
            read_only("GET, HEAD, OPTIONS")?;
            Ok(ready(app))
        }
        "streams" => {
            read_only("GET, HEAD, OPTIONS")?;
            streams(app, parts).await
        }
        _ => Err(ApiError::no_such_route(parts.uri.path())),
    }
}

/// The default page size of `/__brook/streams`.
const DEFAULT_LIMIT: usize = 100;
/// The largest page size of `/__brook/streams`.
const MAX_LIMIT: usize = 1000;

/// `/__brook/streams?prefix=P&limit=N&after=C`: a page of the live streams whose names start
/// with `P` (default all), `N` per page (default 100, 1 to 1000), after cursor `C` (a page's
/// `next`), as `{"streams":[{"name","contentType","tail","closed"}],"next":C|null}`.
async fn streams(app: &AppState, parts: &Parts) -> Result<Response, ApiError> {
    let mut prefix = String::new();
    let mut after = None;
    let mut limit = DEFAULT_LIMIT;
    for (k, v) in super::request::query_params(parts) {
        match &*k {
            "prefix" => prefix = v.into_owned(),
            "after" => after = Some(v.into_owned()),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "INVALID_ARGUMENT",
                            format!("limit must be a whole number from 1 to {MAX_LIMIT}"),
                        )
                    })?;
            }
            _ => {}
        }
    }
    let store = app.store.clone();
    let page = blocking(Op::Read, move || {
        store.list_page(&prefix, after.as_deref(), limit)
    })
    .await?;
    let streams: Vec<serde_json::Value> = page
        .streams
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.name.as_str(),
                "contentType": s.content_type,
                "tail": s.tail.to_string(),
                "closed": s.closed,
            })
        })
        .collect();
    let body = serde_json::json!({ "streams": streams, "next": page.next });
    Ok(json(StatusCode::OK, body.to_string()))
}

/// `/__brook/ready`: 200 once open (this handler runs only then), 503 `POISONED` while a journal
/// shard is poisoned (its writes fail until the store is reopened), 503 `MEMORY_BUDGET` while
/// the memory budget outside its reserve is spent (every upload past 64 KiB is refused until
/// some is given back: an orchestrator should send such work elsewhere).
fn ready(app: &AppState) -> Response {
    let poisoned = app.store.poisoned_shards();
    if poisoned == 0 {
        if app.budget.exhausted() {
            return budget_exhausted(&app.budget);
        }
        return json(StatusCode::OK, r#"{"status":"ready"}"#);
    }
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "POISONED",
        &format!(
            "{poisoned} journal shard(s) failed a write or sync; writes on them fail until the \
             store is reopened (restart brook)"
        ),
        HeaderMap::new(),
        serde_json::Map::new(),
    )
}

/// Readiness's 503 `MEMORY_BUDGET`: what the budget holds, per use, against its limit and
/// reserve.
fn budget_exhausted(budget: &Budget) -> Response {
    let shape = budget.shape();
    let mut extra = serde_json::Map::new();
    extra.insert("limit".into(), shape.limit.into());
    extra.insert("reserve".into(), shape.reserve.into());
    let held: serde_json::Map<String, serde_json::Value> = Use::ALL
        .iter()
        .map(|&u| (u.label().to_owned(), budget.held(u).into()))
        .collect();
    extra.insert("held".into(), held.into());
    let mut headers = HeaderMap::new();
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(super::limits::RETRY_AFTER_SECS),
    );
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "MEMORY_BUDGET",
        &format!(
            "the memory budget outside its reserve is spent ({} of {} bytes held, {} reserved \
             for small requests): uploads past 64 KiB are refused until some is given back",
            budget.total(),
            shape.limit,
            shape.reserve
        ),
        headers,
        extra,
    )
}

/// `/__brook/metrics`: the engine's figures and the server's, as Prometheus text.
async fn metrics(app: &AppState) -> Result<Response, ApiError> {
    let store = app.store.clone();
    let stats = blocking(Op::Read, move || Ok(store.stats())).await?;
    let scrape = Scrape {
        stats,
        http: Snapshot::of(&app.metrics),
        connections: app.connections.load(Ordering::Relaxed) as u64,
        open_fds: open_fds(),
        edge: [
            app.edge.connections_refused.load(Ordering::Relaxed),
            app.edge.live_readers_refused.load(Ordering::Relaxed),
            app.edge.unauthorized.load(Ordering::Relaxed),
            app.edge.forbidden.load(Ordering::Relaxed),
            app.edge.tls_handshakes_failed.load(Ordering::Relaxed),
            app.edge.tls_reloads_failed.load(Ordering::Relaxed),
        ],
        memory: Memory::of(&app.budget),
    };
    let mut text = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&scrape.families(), &mut text)
        .map_err(|_| ApiError::internal("the metrics did not encode"))?;
    let mut res = Response::new(Body::from(text));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// The descriptors open in this process (`/proc/self/fd`); `None` where there is no `/proc`.
fn open_fds() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64)
}

/// The server's figures copied out of [`Metrics`] for one scrape.
struct Snapshot {
    /// Non-zero request counts: route label, status, count.
    requests: Vec<(&'static str, u16, u64)>,
    append_latency: Histogram,
    errors: Vec<(&'static str, u64)>,
    sse_readers: i64,
    long_poll_readers: i64,
}

impl Snapshot {
    /// Copies `m`.
    fn of(m: &Metrics) -> Snapshot {
        let mut requests = Vec::new();
        for (kind, row) in KINDS.iter().zip(&m.requests) {
            for (i, c) in row.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    requests.push((kind.label(), 100 + i as u16, n));
                }
            }
        }
        Snapshot {
            requests,
            append_latency: m.append_latency.snapshot(),
            errors: m.errors.lock().iter().map(|(k, v)| (*k, *v)).collect(),
            sse_readers: m.sse_readers.load(Ordering::Relaxed),
            long_poll_readers: m.long_poll_readers.load(Ordering::Relaxed),
        }
    }
}

/// One scrape's figures.
struct Scrape {
    stats: Stats,
    http: Snapshot,
    connections: u64,
    open_fds: Option<u64>,
    /// What the internet-facing edge refused (connections, live readers, tokens, TLS).
    edge: [u64; 6],
    /// The memory budget's figures.
    memory: Memory,
}

/// The memory budget's limit, and per use what it holds and how many leases it refused.
struct Memory {
    /// The limit, in bytes.
    limit: u64,
    /// The reserve, in bytes.
    reserve: u64,
    /// Per use: its label, bytes held, leases refused.
    uses: Vec<(&'static str, u64, u64)>,
    /// Per cause of refusal: its label, leases refused.
    causes: Vec<(&'static str, u64)>,
    /// Whether what lies outside the reserve is spent.
    exhausted: bool,
}

impl Memory {
    /// Copies `budget`'s figures.
    fn of(budget: &Budget) -> Memory {
        Memory {
            limit: budget.limit(),
            reserve: budget.shape().reserve,
            uses: Use::ALL
                .iter()
                .map(|&u| (u.label(), budget.held(u), budget.refused(u)))
                .collect(),
            causes: Cause::ALL
                .iter()
                .map(|&c| (c.label(), budget.refused_for(c)))
                .collect(),
            exhausted: budget.exhausted(),
        }
    }

    /// Its families: the limit, the bytes held and the refusals, per use.
    fn families(&self) -> Vec<MetricFamily> {
        let held = self
            .uses
            .iter()
            .map(|&(label, bytes, _)| {
                let mut g = Gauge::default();
                g.set_value(bytes as f64);
                let mut m = Metric::from_label(label_pairs(&[("use", label)]));
                m.set_gauge(g);
                m
            })
            .collect();
        let refused = self
            .uses
            .iter()
            .map(|&(label, _, n)| counter_metric(&[("use", label)], n))
            .collect();
        vec![
            gauge(
                "brook_memory_budget_bytes",
                "The server's memory budget (--max-memory)",
                self.limit as f64,
            ),
            family(
                "brook_memory_held_bytes",
                "Bytes held of the memory budget, per use",
                MetricType::GAUGE,
                held,
            ),
            family(
                "brook_memory_refused_total",
                "Work refused 503 MEMORY_BUDGET, per use it needed memory for",
                MetricType::COUNTER,
                refused,
            ),
            family(
                "brook_memory_refused_cause_total",
                "Work refused 503 MEMORY_BUDGET, per cause (budget, reserve, peer, token)",
                MetricType::COUNTER,
                self.causes
                    .iter()
                    .map(|&(label, n)| counter_metric(&[("cause", label)], n))
                    .collect(),
            ),
            gauge(
                "brook_memory_reserve_bytes",
                "The part of the memory budget kept for small work (--memory-reserve)",
                self.reserve as f64,
            ),
            gauge(
                "brook_memory_exhausted",
                "1 while the memory budget outside its reserve is spent (readiness answers 503)",
                if self.exhausted { 1.0 } else { 0.0 },
            ),
        ]
    }
}

/// A metric family of `kind` named `name` with `help` and its samples.
fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

/// A counter sample with `labels`.
pub(super) fn counter_metric(labels: &[(&str, &str)], v: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(v as f64);
    let mut m = Metric::from_label(label_pairs(labels));
    m.set_counter(c);
    m
}

/// The label pairs of a sample.
fn label_pairs(labels: &[(&str, &str)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect()
}

/// An unlabelled counter family.
pub(super) fn counter(name: &str, help: &str, v: u64) -> MetricFamily {
    family(
        name,
        help,
        MetricType::COUNTER,
        vec![counter_metric(&[], v)],
    )
}

/// An unlabelled gauge family.
fn gauge(name: &str, help: &str, v: f64) -> MetricFamily {
    let mut g = Gauge::default();
    g.set_value(v);
    family(name, help, MetricType::GAUGE, vec![Metric::from_gauge(g)])
}

/// An unlabelled histogram family (the encoder adds the `+Inf` bucket from the count).
fn histogram(name: &str, help: &str, h: &Histogram) -> MetricFamily {
    let mut p = prometheus::proto::Histogram::default();
    p.set_sample_count(h.count);
    p.set_sample_sum(h.sum);
    p.set_bucket(
        h.buckets
            .iter()
            .map(|(bound, n)| {
                let mut b = Bucket::default();
                b.set_upper_bound(*bound);
                b.set_cumulative_count(*n);
                b
            })
            .collect(),
    );
    let mut m = Metric::default();
    m.set_histogram(p);
    family(name, help, MetricType::HISTOGRAM, vec![m])
}

/// The cold tier's figures (all zero without a tier).
fn tier_families(s: &Stats) -> Vec<MetricFamily> {
    vec![
        counter(
            "brook_tier_uploads_total",
            "Objects uploaded to the cold tier and verified",
            s.tier_uploads,
        ),
        counter(
            "brook_tier_upload_bytes_total",
            "Bytes uploaded to the cold tier",
            s.tier_upload_bytes,
        ),
        counter(
            "brook_tier_failures_total",
            "Failed cold tier passes (retried with backoff) and cold reads",
            s.tier_failures,
        ),
        counter(
            "brook_tier_evictions_total",
            "Segment logs removed locally because the cold tier holds them",
            s.tier_evictions,
        ),
        counter(
            "brook_tier_evicted_bytes_total",
            "Bytes of segment logs removed locally",
            s.tier_evicted_bytes,
        ),
        counter(
            "brook_tier_cache_hits_total",
            "Cold reads served from the block cache",
            s.tier_cache_hits,
        ),
        counter(
            "brook_tier_cache_misses_total",
            "Cold reads that fetched a block from the tier",
            s.tier_cache_misses,
        ),
        counter(
            "brook_tier_fetch_bytes_total",
            "Bytes fetched from the tier by cold reads",
            s.tier_fetch_bytes,
        ),
        counter(
            "brook_tier_deletes_total",
            "Objects deleted from the tier (retention, deletes)",
            s.tier_deletes,
        ),
        gauge(
            "brook_tier_pending_streams",
            "Streams waiting for the tier's next pass",
            s.tier_pending_streams as f64,
        ),
        gauge(
            "brook_tier_local_bytes",
            "Bytes of uploaded segment logs still on the local disk",
            s.tier_local_bytes as f64,
        ),
        gauge(
            "brook_tier_cache_bytes",
            "Bytes in the cold block cache",
            s.tier_cache_bytes as f64,
        ),
    ]
}

impl Scrape {
    /// Every figure as a metric family named `brook_*`.
    fn families(&self) -> Vec<MetricFamily> {
        let s = &self.stats;
        let requests = self
            .http
            .requests
            .iter()
            .map(|(route, status, n)| {
                counter_metric(&[("route", route), ("status", &status.to_string())], *n)
            })
            .collect();
        let errors = self
            .http
            .errors
            .iter()
            .map(|(code, n)| counter_metric(&[("code", code)], *n))
            .collect();
        let mut out = vec![
            family(
                "brook_http_requests_total",
                "HTTP requests answered, by route and status",
                MetricType::COUNTER,
                requests,
            ),
            family(
                "brook_http_errors_total",
                "HTTP refusals, by problem code",
                MetricType::COUNTER,
                errors,
            ),
            histogram(
                "brook_append_latency_seconds",
                "Seconds from an HTTP append's request to its response head (durability included)",
                &self.http.append_latency,
            ),
            gauge(
                "brook_sse_readers",
                "SSE connections open",
                self.http.sse_readers as f64,
            ),
            gauge(
                "brook_long_poll_readers",
                "Long-poll reads waiting for data",
                self.http.long_poll_readers as f64,
            ),
            gauge(
                "brook_http_connections",
                "HTTP connections open",
                self.connections as f64,
            ),
            counter("brook_appends_total", "Appends accepted", s.appends),
            counter("brook_append_bytes_total", "Bytes appended", s.append_bytes),
            counter("brook_reads_total", "Reads served", s.reads),
            counter("brook_read_bytes_total", "Bytes read", s.read_bytes),
            counter("brook_streams_created_total", "Streams created", s.creates),
            counter("brook_streams_deleted_total", "Streams deleted", s.deletes),
            histogram(
                "brook_commit_batch_records",
                "Journal records per group commit",
                &s.commit_batch_records,
            ),
            histogram(
                "brook_journal_sync_seconds",
                "Seconds per journal fdatasync",
                &s.journal_sync_seconds,
            ),
            histogram(
                "brook_checkpoint_seconds",
                "Seconds per checkpoint",
                &s.checkpoint_seconds,
            ),
            gauge(
                "brook_open_streams",
                "Streams open (in memory; files open unless at rest)",
                s.open_streams as f64,
            ),
            gauge(
                "brook_resident_streams",
                "Streams closed with their state kept in memory",
                s.resident_streams as f64,
            ),
            gauge(
                "brook_checkpoint_files",
                "Checkpoint files holding some stream's newest image",
                s.checkpoint_files as f64,
            ),
            gauge(
                "brook_checkpoint_file_bytes",
                "Bytes of the checkpoint files",
                s.checkpoint_file_bytes as f64,
            ),
            counter(
                "brook_checkpoint_images_total",
                "Stream images written to checkpoint files instead of sidecars",
                s.checkpoint_images,
            ),
            counter(
                "brook_stream_loads_total",
                "Streams opened from their sidecar and directory (neither open nor resident)",
                s.stream_loads,
            ),
            gauge(
                "brook_stream_files",
                "Descriptors held by open streams' segment files",
                s.stream_files as f64,
            ),
            gauge(
                "brook_stream_file_budget",
                "Descriptors open streams' segment files may hold now",
                s.stream_file_budget as f64,
            ),
            gauge(
                "brook_journal_shards",
                "Journal shards",
                s.journal_shards as f64,
            ),
            gauge(
                "brook_poisoned_shards",
                "Journal shards poisoned by a failed write or sync (alert when above 0)",
                s.poisoned_shards as f64,
            ),
            gauge(
                "brook_recovered_journal_bytes",
                "Journal bytes the last start replayed",
                s.recovered_journal_bytes as f64,
            ),
            gauge(
                "brook_recovered_streams",
                "Streams the last start's replay touched",
                s.recovered_streams as f64,
            ),
            gauge(
                "brook_recovery_seconds",
                "Seconds the last start took to open the store",
                s.recovery_seconds,
            ),
        ];
        out.extend(tier_families(s));
        out.extend(super::retention::families(s));
        let [conns, live, unauthorized, forbidden, handshakes, reloads] = self.edge;
        out.extend([
            counter(
                "brook_connections_refused_total",
                "Connections answered 503 TOO_MANY_CONNECTIONS (over --max-connections)",
                conns,
            ),
            counter(
                "brook_live_readers_refused_total",
                "Live reads answered 503 TOO_MANY_LIVE_READERS (over a live-reader cap)",
                live,
            ),
            counter(
                "brook_auth_unauthorized_total",
                "Requests refused 401 by access control (no, bad or expired token)",
                unauthorized,
            ),
            counter(
                "brook_auth_forbidden_total",
                "Requests refused 403 by access control (outside the token's grants)",
                forbidden,
            ),
            counter(
                "brook_tls_handshakes_failed_total",
                "TLS handshakes that failed or did not finish within the header read timeout",
                handshakes,
            ),
            counter(
                "brook_tls_reloads_failed_total",
                "Certificate reloads that failed (the certificate in use was kept)",
                reloads,
            ),
        ]);
        out.extend(self.memory.families());
        if let Some(fds) = self.open_fds {
            out.push(gauge(
                "brook_open_fds",
                "File descriptors open in the process",
                fds as f64,
            ));
        }
        // A family without samples (no error yet) is left out, as the text format expects.
        out.retain(|f| !f.get_metric().is_empty());
        out
    }
}
