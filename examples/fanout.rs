//! Load client for `scripts/bench-compare`: measures any Durable Streams server over plain
//! HTTP/1.1 on loopback (keep-alive connections, no HTTP library, so every server is measured by
//! the same code). Each mode prints one JSON line on stdout.
//!
//! ```text
//! cargo run --release --features http --example fanout -- MODE --url http://127.0.0.1:4437 [options]
//!
//! fanout   --stream S --subscribers 1000 --rate 100 --secs 8
//!          one text/plain stream, N SSE subscribers (`live=sse`), one writer appending a
//!          timestamp at a fixed rate; end-to-end delivery latency (append sent -> event read)
//! fanout-steps --stream S --subscribers 200 --appends 200 --warmup 20 [--sync-dir D]
//!          the same in lock step (each append only after every subscriber read the one
//!          before), for scripts/bench-instructions: a fixed count of events
//! longpoll --stream S --clients 10 --rounds 50 [--warmup 0 --park-ms 30 --sync-dir D]
//!          clients park a `live=long-poll` read at the tail, then one append; wake latency
//!          (append sent -> long-poll answer read); with `--sync-dir`, for
//!          scripts/bench-instructions: the measured rounds between its files, as fanout-steps
//! catchup  --stream S --clients 16 --secs 8
//!          clients read the whole stream from `offset=-1`, following Stream-Next-Offset until
//!          Stream-Up-To-Date, over and over; bytes/s of response bodies
//! fill     --stream S --bytes 67108864 --chunk 262144 [--content-type T]
//!          creates the stream and appends that many bytes
//! create   --prefix P --count 100000 --conns 64 [--body hello]
//!          creates P0000000.. (text/plain), each followed by one append of --body when given
//! ready    --stream S --timeout-ms 60000
//!          milliseconds until a HEAD of the stream answers 200 (server startup time)
//! ```
//!
//! Every loop is bounded by a count and a deadline; only loopback addresses are accepted.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// ---------------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client

struct Response {
    status: u16,
    headers: HashMap<String, String>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

struct Conn {
    io: BufReader<TcpStream>,
    host: String,
}

impl Conn {
    async fn open(addr: &str) -> Res<Conn> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Conn {
            io: BufReader::with_capacity(256 << 10, s),
            host: addr.to_owned(),
        })
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Res<()> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (k, v) in headers {
            let _ = write!(req, "{k}: {v}\r\n");
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            let _ = write!(req, "Content-Length: {}\r\n", body.len());
        }
        req.push_str("\r\n");
        let s = self.io.get_mut();
        if body.len() <= 16 << 10 {
            let mut buf = req.into_bytes();
            buf.extend_from_slice(body);
            s.write_all(&buf).await?;
        } else {
            s.write_all(req.as_bytes()).await?;
            s.write_all(body).await?;
        }
        Ok(())
    }

    async fn head(&mut self) -> Res<Response> {
        let mut line = String::new();
        if self.io.read_line(&mut line).await? == 0 {
            return Err("connection closed".into());
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .ok_or("bad status line")?
            .parse()?;
        let mut headers = HashMap::new();
        loop {
            line.clear();
            if self.io.read_line(&mut line).await? == 0 {
                return Err("connection closed in headers".into());
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        Ok(Response { status, headers })
    }

    /// Reads a whole body into `sink` (cleared first); `None` sink discards.
    async fn body(&mut self, r: &Response, method: &str, sink: &mut Vec<u8>) -> Res<()> {
        sink.clear();
        if method == "HEAD" || r.status == 204 || r.status == 304 {
            return Ok(());
        }
        if r.header("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"))
        {
            while let Some(n) = self.chunk_len().await? {
                let at = sink.len();
                sink.resize(at + n, 0);
                self.io.read_exact(&mut sink[at..]).await?;
                self.crlf().await?;
            }
            return Ok(());
        }
        let n: usize = r
            .header("content-length")
            .map(str::parse)
            .transpose()?
            .unwrap_or(0);
        sink.resize(n, 0);
        self.io.read_exact(sink).await?;
        Ok(())
    }

    async fn chunk_len(&mut self) -> Res<Option<usize>> {
        let mut line = String::new();
        if self.io.read_line(&mut line).await? == 0 {
            return Err("connection closed in a chunked body".into());
        }
        let hex = line.trim().split(';').next().unwrap_or("");
        let n = usize::from_str_radix(hex, 16)?;
        if n == 0 {
            // Trailers end with an empty line.
            loop {
                line.clear();
                self.io.read_line(&mut line).await?;
                if line.trim().is_empty() {
                    break;
                }
            }
            return Ok(None);
        }
        Ok(Some(n))
    }

    async fn crlf(&mut self) -> Res<()> {
        let mut b = [0u8; 2];
        self.io.read_exact(&mut b).await?;
        Ok(())
    }

    async fn call(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        sink: &mut Vec<u8>,
    ) -> Res<Response> {
        self.send(method, path, headers, body).await?;
        let r = self.head().await?;
        self.body(&r, method, sink).await?;
        Ok(r)
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments and helpers

struct Args {
    mode: String,
    kv: HashMap<String, String>,
}

impl Args {
    fn parse() -> Res<Args> {
        let mut it = std::env::args().skip(1);
        let mode = it
            .next()
            .ok_or("usage: fanout MODE --url URL [--key value]...")?;
        let mut kv = HashMap::new();
        while let Some(k) = it.next() {
            let k = k
                .strip_prefix("--")
                .ok_or_else(|| format!("expected --key, got {k}"))?
                .to_owned();
            let v = it.next().ok_or_else(|| format!("--{k} needs a value"))?;
            kv.insert(k, v);
        }
        Ok(Args { mode, kv })
    }
    fn s(&self, k: &str, d: &str) -> String {
        self.kv.get(k).cloned().unwrap_or_else(|| d.to_owned())
    }
    fn n(&self, k: &str, d: u64) -> Res<u64> {
        Ok(self.kv.get(k).map(|v| v.parse()).transpose()?.unwrap_or(d))
    }
}

/// `host:port` of a loopback URL.
fn loopback_addr(url: &str) -> Res<String> {
    let rest = url.strip_prefix("http://").ok_or("--url must be http://")?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
    if !(host == "localhost" || host.starts_with("127.") || host == "[::1]") {
        return Err("only loopback servers may be measured".into());
    }
    Ok(hostport.to_owned())
}

fn path_of(stream: &str) -> String {
    format!("/{}", stream.trim_start_matches('/'))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn latency_json(mut v: Vec<f64>, extra: &str) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "{{\"count\":{},\"p50_ms\":{:.3},\"p90_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}{extra}}}",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.9),
        pct(&v, 0.99),
        v.last().copied().unwrap_or(f64::NAN)
    )
}

async fn create(c: &mut Conn, path: &str, ct: &str) -> Res<()> {
    let mut sink = Vec::new();
    let r = c
        .call("PUT", path, &[("Content-Type", ct)], b"", &mut sink)
        .await?;
    if !(r.status == 200 || r.status == 201 || r.status == 204) {
        return Err(format!(
            "PUT {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&sink)
        )
        .into());
    }
    Ok(())
}

async fn append(c: &mut Conn, path: &str, ct: &str, body: &[u8]) -> Res<Response> {
    let mut sink = Vec::new();
    let r = c
        .call("POST", path, &[("Content-Type", ct)], body, &mut sink)
        .await?;
    if !(r.status == 200 || r.status == 204) {
        return Err(format!(
            "POST {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&sink)
        )
        .into());
    }
    Ok(r)
}

/// Finds `T` + 20 digits markers; returns the timestamps and how many bytes to keep (a marker may
/// be cut at the end of the buffer).
fn markers(buf: &[u8], out: &mut Vec<u64>) -> usize {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'T' {
            if i + 21 > buf.len() {
                return i;
            }
            let digits = &buf[i + 1..i + 21];
            if digits.iter().all(u8::is_ascii_digit) {
                let v = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                out.push(v);
                i += 21;
                continue;
            }
        }
        i += 1;
    }
    buf.len()
}

// ---------------------------------------------------------------------------------------------
// Modes

/// One SSE subscriber of the fan-out modes.
struct Subscriber {
    addr: String,
    path: String,
    /// Delivery latencies (ms) of every marker read.
    lat: Arc<std::sync::Mutex<Vec<f64>>>,
    /// Counts subscribers whose response head arrived (200).
    connected: Arc<AtomicUsize>,
    /// Counts markers read by every subscriber.
    received: Arc<AtomicU64>,
    /// Bounds how many subscribers connect at once.
    gate: Arc<tokio::sync::Semaphore>,
    /// No read waits past this.
    deadline: Instant,
    base: Instant,
}

/// The subscribers of a fan-out run and what they count together.
struct Subscribers {
    /// Delivery latencies (ms) of every marker read.
    lat: Arc<std::sync::Mutex<Vec<f64>>>,
    /// Subscribers whose response head arrived (200).
    connected: Arc<AtomicUsize>,
    /// Markers read by every subscriber.
    received: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Res<()>>>,
}

impl Subscribers {
    /// Starts `n` subscribers of `path` (at most 64 connecting at once).
    fn spawn(n: usize, addr: &str, path: &str, deadline: Instant, base: Instant) -> Subscribers {
        let lat = Arc::new(std::sync::Mutex::new(Vec::with_capacity(1 << 20)));
        let connected = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(64));
        let tasks = (0..n)
            .map(|_| {
                spawn_subscriber(Subscriber {
                    addr: addr.to_owned(),
                    path: path.to_owned(),
                    lat: lat.clone(),
                    connected: connected.clone(),
                    received: received.clone(),
                    gate: gate.clone(),
                    deadline,
                    base,
                })
            })
            .collect();
        Subscribers {
            lat,
            connected,
            received,
            tasks,
        }
    }

    /// Ends every subscriber and waits for its task.
    async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Opens `live=sse` from the start of the stream and counts the markers of every event it
/// reads, until the connection ends, the deadline passes or the task is aborted.
fn spawn_subscriber(sub: Subscriber) -> tokio::task::JoinHandle<Res<()>> {
    let Subscriber {
        addr,
        path,
        lat,
        connected,
        received,
        gate,
        deadline,
        base,
    } = sub;
    tokio::spawn(async move {
        let permit = gate.acquire_owned().await;
        let mut c = Conn::open(&addr).await?;
        c.send(
            "GET",
            &format!("{path}?offset=-1&live=sse"),
            &[("Accept", "text/event-stream")],
            b"",
        )
        .await?;
        let r = c.head().await?;
        drop(permit);
        if r.status != 200 {
            return Err::<(), Box<dyn std::error::Error + Send + Sync>>(
                format!("SSE status {}", r.status).into(),
            );
        }
        connected.fetch_add(1, Ordering::AcqRel);
        let chunked = r
            .header("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"));
        let mut carry: Vec<u8> = Vec::new();
        let mut ts = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let read = async {
                if chunked {
                    match c.chunk_len().await? {
                        None => Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(0),
                        Some(n) => {
                            if buf.len() < n {
                                buf.resize(n, 0);
                            }
                            c.io.read_exact(&mut buf[..n]).await?;
                            c.crlf().await?;
                            Ok(n)
                        }
                    }
                } else {
                    Ok(c.io.read(&mut buf).await?)
                }
            };
            let Ok(Ok(n)) = tokio::time::timeout_at(deadline.into(), read).await else {
                break;
            };
            if n == 0 {
                break;
            }
            let now = base.elapsed().as_nanos() as u64;
            carry.extend_from_slice(&buf[..n]);
            ts.clear();
            let used = markers(&carry, &mut ts);
            carry.drain(..used);
            if !ts.is_empty() {
                let mut l = lat
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                l.extend(ts.iter().map(|t| now.saturating_sub(*t) as f64 / 1e6));
            }
            received.fetch_add(ts.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    })
}

async fn fanout(a: &Args, addr: &str, base: Instant) -> Res<String> {
    let stream = a.s("stream", "bench/fanout");
    let path = path_of(&stream);
    let subs = a.n("subscribers", 1000)? as usize;
    let rate = a.n("rate", 100)?.max(1);
    let secs = a.n("secs", 8)?;
    let mut w = Conn::open(addr).await?;
    create(&mut w, &path, "text/plain").await?;
    let deadline = Instant::now() + Duration::from_secs(secs + 30);
    let subscribers = Subscribers::spawn(subs, addr, &path, deadline, base);
    let (lat, connected, received) = (
        subscribers.lat.clone(),
        subscribers.connected.clone(),
        subscribers.received.clone(),
    );
    // Wait (bounded) until every subscriber is connected.
    let connect_deadline = Instant::now() + Duration::from_mins(1);
    while connected.load(Ordering::Acquire) < subs && Instant::now() < connect_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ok_subs = connected.load(Ordering::Acquire);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let total = rate * secs;
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = 0u64;
    let mut ack = Vec::new();
    for _ in 0..total {
        tick.tick().await;
        let t = base.elapsed().as_nanos() as u64;
        let t0 = Instant::now();
        append(&mut w, &path, "text/plain", format!("T{t:020}").as_bytes()).await?;
        ack.push(t0.elapsed().as_secs_f64() * 1e3);
        sent += 1;
    }
    // Let deliveries finish (bounded), then end the subscribers.
    let expected = sent * ok_subs as u64;
    let settle = Instant::now() + Duration::from_secs(5);
    while received.load(Ordering::Relaxed) < expected && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    subscribers.stop().await;
    let got = received.load(Ordering::Relaxed);
    let v = std::mem::take(
        &mut *lat
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    ack.sort_by(f64::total_cmp);
    Ok(latency_json(
        v,
        &format!(
            ",\"subscribers\":{ok_subs},\"appends\":{sent},\"expected\":{expected},\"received\":{got},\"append_p50_ms\":{:.3}",
            pct(&ack, 0.5)
        ),
    ))
}

/// Waits (bounded by `limit`) until `path` exists.
async fn wait_for_file(path: &std::path::Path, limit: Duration) -> Res<()> {
    let until = Instant::now() + limit;
    while !path.exists() {
        if Instant::now() >= until {
            return Err(format!("{} did not appear within {limit:?}", path.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// `fanout-steps`: the fan-out in lock step, for counting instructions
/// (`scripts/bench-instructions`): N subscribers, then appends one at a time, each sent only
/// after every subscriber read the one before, so every append is one wake of every subscriber
/// and the server's work is the same from run to run. With `--sync-dir D` it hands off to the
/// script around the measured appends: after the warm-up ones it creates `D/ready` and waits for
/// `D/go`; after the measured ones it creates `D/done` and waits for `D/exit` before closing the
/// connections (so their teardown is not measured).
async fn fanout_steps(a: &Args, addr: &str, base: Instant) -> Res<String> {
    let path = path_of(&a.s("stream", "bench/fanout"));
    let subs = a.n("subscribers", 200)? as usize;
    let appends = a.n("appends", 200)?;
    let warmup = a.n("warmup", 20)?;
    let sync = a.kv.get("sync-dir").map(std::path::PathBuf::from);
    let limit = Duration::from_secs(a.n("timeout-secs", 600)?);
    let mut w = Conn::open(addr).await?;
    create(&mut w, &path, "text/plain").await?;
    let deadline = Instant::now() + limit;
    let subscribers = Subscribers::spawn(subs, addr, &path, deadline, base);
    let (connected, received) = (subscribers.connected.clone(), subscribers.received.clone());
    while connected.load(Ordering::Acquire) < subs {
        if Instant::now() >= deadline {
            return Err("not every subscriber connected".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every subscriber's first frames (retry, the up-to-date control) are out before the first
    // append: give them a moment, as nothing counts them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut measured_secs = 0.0;
    for i in 0..warmup + appends {
        if i == warmup
            && let Some(d) = &sync
        {
            std::fs::write(d.join("ready"), b"")?;
            wait_for_file(&d.join("go"), limit).await?;
        }
        let t0 = Instant::now();
        let t = base.elapsed().as_nanos() as u64;
        append(&mut w, &path, "text/plain", format!("T{t:020}").as_bytes()).await?;
        let want = (i + 1) * subs as u64;
        while received.load(Ordering::Acquire) < want {
            if Instant::now() >= deadline {
                return Err(format!(
                    "append {i}: {} of {want} events",
                    received.load(Ordering::Acquire)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        if i >= warmup {
            measured_secs += t0.elapsed().as_secs_f64();
        }
    }
    if let Some(d) = &sync {
        std::fs::write(d.join("done"), b"")?;
        wait_for_file(&d.join("exit"), limit).await?;
    }
    subscribers.stop().await;
    let got = received.load(Ordering::Acquire);
    Ok(format!(
        "{{\"subscribers\":{subs},\"warmup\":{warmup},\"appends\":{appends},\"events\":{},\"received\":{got},\"measured_secs\":{measured_secs:.3}}}",
        appends * subs as u64
    ))
}

/// `longpoll`: each round, a HEAD for the tail, every client's long-poll from it, a pause
/// (`--park-ms`) for them to park, then one append, which answers them all. `--warmup` rounds
/// come first, uncounted; with `--sync-dir D` it hands off to the script around the measured
/// rounds as `fanout-steps` does (`D/ready`, `D/go`, `D/done`, `D/exit`), and fails when a
/// measured long-poll was not answered 200.
async fn longpoll(a: &Args, addr: &str) -> Res<String> {
    let stream = a.s("stream", "bench/longpoll");
    let path = path_of(&stream);
    let clients = a.n("clients", 10)? as usize;
    let rounds = a.n("rounds", 50)?;
    let warmup = a.n("warmup", 0)?;
    let park = Duration::from_millis(a.n("park-ms", 30)?);
    let sync = a.kv.get("sync-dir").map(std::path::PathBuf::from);
    let limit = Duration::from_secs(a.n("timeout-secs", 600)?);
    let mut w = Conn::open(addr).await?;
    create(&mut w, &path, "text/plain").await?;
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(Conn::open(addr).await?);
    }
    let mut lat = Vec::new();
    let mut missed = 0u64;
    let mut sink = Vec::new();
    for i in 0..warmup + rounds {
        if i == warmup {
            lat.clear();
            missed = 0;
            if let Some(d) = &sync {
                std::fs::write(d.join("ready"), b"")?;
                wait_for_file(&d.join("go"), limit).await?;
            }
        }
        let h = w.call("HEAD", &path, &[], b"", &mut sink).await?;
        let tail = h
            .header("stream-next-offset")
            .ok_or("HEAD without Stream-Next-Offset")?
            .to_owned();
        let q = format!("{path}?offset={tail}&live=long-poll");
        for c in &mut conns {
            c.send("GET", &q, &[], b"").await?;
        }
        // Let every request park in the server.
        tokio::time::sleep(park).await;
        let t0 = Instant::now();
        append(&mut w, &path, "text/plain", format!("round {i}").as_bytes()).await?;
        let mut waits = Vec::new();
        for c in conns.drain(..) {
            waits.push(tokio::spawn(async move {
                let r = tokio::time::timeout(Duration::from_secs(10), c_head_body(c)).await;
                (r, Instant::now())
            }));
        }
        for wt in waits {
            let (r, at) = wt.await?;
            if let Ok(Ok((status, c))) = r {
                if status == 200 {
                    lat.push(at.duration_since(t0).as_secs_f64() * 1e3);
                } else {
                    missed += 1;
                }
                conns.push(c);
            } else {
                missed += 1;
                conns.push(Conn::open(addr).await?);
            }
        }
    }
    if let Some(d) = &sync {
        std::fs::write(d.join("done"), b"")?;
        wait_for_file(&d.join("exit"), limit).await?;
        if missed > 0 {
            return Err(format!("{missed} long-polls were not answered 200").into());
        }
    }
    Ok(latency_json(
        lat,
        &format!(",\"clients\":{clients},\"rounds\":{rounds},\"missed\":{missed}"),
    ))
}

async fn c_head_body(mut c: Conn) -> Res<(u16, Conn)> {
    let r = c.head().await?;
    let mut sink = Vec::new();
    c.body(&r, "GET", &mut sink).await?;
    Ok((r.status, c))
}

async fn catchup(a: &Args, addr: &str) -> Res<String> {
    let path = path_of(&a.s("stream", "bench/read"));
    let clients = a.n("clients", 16)? as usize;
    let secs = a.n("secs", 8)?;
    let bytes = Arc::new(AtomicU64::new(0));
    let passes = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (addr, path, bytes, passes, requests) = (
            addr.to_owned(),
            path.clone(),
            bytes.clone(),
            passes.clone(),
            requests.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(&addr).await?;
            let mut sink = Vec::with_capacity(16 << 20);
            // Bounded: the deadline, and at most 10 million requests.
            for _ in 0..10_000_000u64 {
                if Instant::now() >= end {
                    break;
                }
                let mut offset = "-1".to_owned();
                for _ in 0..100_000 {
                    let r = c
                        .call(
                            "GET",
                            &format!("{path}?offset={offset}"),
                            &[],
                            b"",
                            &mut sink,
                        )
                        .await?;
                    if r.status != 200 {
                        return Err::<(), Box<dyn std::error::Error + Send + Sync>>(
                            format!("GET status {}", r.status).into(),
                        );
                    }
                    requests.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(sink.len() as u64, Ordering::Relaxed);
                    let done = r.header("stream-up-to-date").is_some_and(|v| v == "true");
                    if done || Instant::now() >= end {
                        if done {
                            passes.fetch_add(1, Ordering::Relaxed);
                        }
                        break;
                    }
                    r.header("stream-next-offset")
                        .ok_or("no Stream-Next-Offset")?
                        .clone_into(&mut offset);
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let el = start.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"bytes_per_s\":{:.0},\"passes\":{},\"requests\":{},\"secs\":{el:.3}}}",
        bytes.load(Ordering::Relaxed) as f64 / el,
        passes.load(Ordering::Relaxed),
        requests.load(Ordering::Relaxed)
    ))
}

async fn fill(a: &Args, addr: &str) -> Res<String> {
    let path = path_of(&a.s("stream", "bench/read"));
    let total = a.n("bytes", 1 << 20)?;
    let chunk = a.n("chunk", 256 << 10)? as usize;
    let ct = a.s("content-type", "application/octet-stream");
    let mut c = Conn::open(addr).await?;
    create(&mut c, &path, &ct).await?;
    let body: Vec<u8> = (0..chunk).map(|i| b'a' + (i % 26) as u8).collect();
    let mut written = 0u64;
    let start = Instant::now();
    while written < total {
        let n = chunk.min((total - written) as usize);
        append(&mut c, &path, &ct, &body[..n]).await?;
        written += n as u64;
    }
    Ok(format!(
        "{{\"bytes\":{written},\"secs\":{:.3}}}",
        start.elapsed().as_secs_f64()
    ))
}

async fn create_many(a: &Args, addr: &str) -> Res<String> {
    let prefix = a.s("prefix", "idle/s");
    let count = a.n("count", 100_000)?;
    let conns = a.n("conns", 64)?.max(1);
    let body = a.s("body", "");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..conns {
        let (addr, prefix, body) = (addr.to_owned(), prefix.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(&addr).await?;
            let mut i = k;
            while i < count {
                let path = path_of(&format!("{prefix}{i:07}"));
                create(&mut c, &path, "text/plain").await?;
                if !body.is_empty() {
                    append(&mut c, &path, "text/plain", body.as_bytes()).await?;
                }
                i += conns;
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(format!(
        "{{\"created\":{count},\"secs\":{:.3}}}",
        start.elapsed().as_secs_f64()
    ))
}

async fn ready(a: &Args, addr: &str, base: Instant) -> Res<String> {
    let path = path_of(&a.s("stream", "idle/s0000000"));
    let timeout = Duration::from_millis(a.n("timeout-ms", 60_000)?);
    let mut sink = Vec::new();
    // Bounded by the timeout; one attempt every 5 ms.
    while base.elapsed() < timeout {
        if let Ok(mut c) = Conn::open(addr).await
            && let Ok(r) = c.call("HEAD", &path, &[], b"", &mut sink).await
            && r.status == 200
        {
            return Ok(format!(
                "{{\"ready_ms\":{:.1}}}",
                base.elapsed().as_secs_f64() * 1e3
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(format!("no 200 for HEAD {path} within {timeout:?}").into())
}

#[tokio::main]
async fn main() {
    let base = Instant::now();
    let run = async {
        let a = Args::parse()?;
        let addr = loopback_addr(&a.s("url", "http://127.0.0.1:4437"))?;
        match a.mode.as_str() {
            "fanout" => fanout(&a, &addr, base).await,
            "fanout-steps" => fanout_steps(&a, &addr, base).await,
            "longpoll" => longpoll(&a, &addr).await,
            "catchup" => catchup(&a, &addr).await,
            "fill" => fill(&a, &addr).await,
            "create" => create_many(&a, &addr).await,
            "ready" => ready(&a, &addr, base).await,
            m => Err(format!("unknown mode {m}").into()),
        }
    };
    match run.await {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("fanout: {e}");
            std::process::exit(1);
        }
    }
}
