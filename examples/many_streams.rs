//! The embedded engine over many streams (issue 51, "A million streams"): 64 writer threads
//! append 256 B bodies to streams drawn at random among N, in each durability; prints what the
//! HTTP benchmark (`scripts/bench-streams`) prints for the server, so a library user sees the
//! same curve.
//!
//! ```text
//! cargo run --release --example many_streams -- [--streams 1000,100000,1000000]
//!     [--modes sync,buffered] [--writers 64] [--body 256] [--warmup 3] [--secs 10]
//!     [--crash-secs 3] [--create-threads 8] [--dir PATH]
//!     [--max-open-streams N] [--max-stream-files N] [--keep]
//! ```
//!
//! Every (N, mode) case runs in a child process of its own (this program run again with
//! `--case`), so one case's memory does not show in the next one's RSS. A case:
//!
//! 1. opens a store in a fresh directory under `--dir` (default `BROOK_BENCH_DIR`, else the
//!    system temp dir: put it on a real disk, `fdatasync` on tmpfs is free) and creates N
//!    streams (`bench/sNNNNNNNN`, content type `application/octet-stream`) from
//!    `--create-threads` threads, each submitting 64 creates before waiting for them: creates/s;
//! 2. runs `--writers` threads in a closed loop (`submit_append`, then `Pending::wait`), each
//!    drawing the next stream at random: `--warmup` seconds uncounted, then `--secs` measured;
//! 3. prints acknowledged appends/s, the process's CPU time per append (`getrusage`, user +
//!    system, every thread: the writers' own loop is in it, a few percent), latency p50/p99
//!    (submit to acknowledgement), RSS (`VmRSS` at the end of the window), open descriptors, disk
//!    used (allocated blocks) and files, and the appends and creates refused with
//!    `TooManyOpenStreams` ("retry shortly": each is retried after 20 ms);
//! 4. shuts the store down and times `Store::open` plus a first `head` of a stream ("open after
//!    close"); then a child process (`--crash-child`) opens the store and appends with the same
//!    writers for `--crash-secs`, and is killed with SIGKILL while it writes: the journal holds
//!    what it wrote since its last checkpoint (printed), and the open plus first `head` after it
//!    is timed too ("open after crash"). A step that fails is printed in its cell; the store's
//!    directory is then removed (minutes at 1M streams; `--keep` leaves it and prints its path).
//!
//! The store uses `Options::default()` but for the durability (`--max-open-streams` and
//! `--max-stream-files` override the caches). docs/benchmarks.md has the method and results.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brook::{AppendRequest, CreateOptions, Durability, Guard, Options, Store, StreamName};
use bytes::Bytes;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The command line.
#[derive(Clone, Debug)]
struct Args {
    streams: Vec<usize>,
    modes: Vec<Durability>,
    writers: usize,
    body: usize,
    warmup: f64,
    secs: f64,
    crash_secs: f64,
    create_threads: usize,
    dir: Option<PathBuf>,
    max_open_streams: Option<usize>,
    max_stream_files: Option<usize>,
    /// Run one case (the first of `streams` and `modes`) in this process.
    case: bool,
    /// Leave each case's store directory in place (its path goes to stderr).
    keep: bool,
    /// Open the store in this directory and append until killed.
    crash_child: Option<PathBuf>,
}

fn mode_name(d: Durability) -> &'static str {
    match d {
        Durability::Sync => "sync",
        Durability::Buffered => "buffered",
    }
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        streams: vec![1000, 100_000, 1_000_000],
        modes: vec![Durability::Sync, Durability::Buffered],
        writers: 64,
        body: 256,
        warmup: 3.0,
        secs: 10.0,
        crash_secs: 3.0,
        create_threads: 8,
        dir: std::env::var_os("BROOK_BENCH_DIR").map(PathBuf::from),
        max_open_streams: None,
        max_stream_files: None,
        case: false,
        keep: false,
        crash_child: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--case" || flag == "--keep" {
            a.case |= flag == "--case";
            a.keep |= flag == "--keep";
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--streams" => {
                a.streams = value.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--modes" => {
                a.modes = value
                    .split(',')
                    .map(|m| match m {
                        "sync" => Ok(Durability::Sync),
                        "buffered" => Ok(Durability::Buffered),
                        _ => Err(format!("--modes: {m} is neither sync nor buffered")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--writers" => a.writers = value.parse()?,
            "--body" => a.body = value.parse()?,
            "--warmup" => a.warmup = value.parse()?,
            "--secs" => a.secs = value.parse()?,
            "--crash-secs" => a.crash_secs = value.parse()?,
            "--create-threads" => a.create_threads = value.parse()?,
            "--dir" => a.dir = Some(PathBuf::from(value)),
            "--max-open-streams" => a.max_open_streams = Some(value.parse()?),
            "--max-stream-files" => a.max_stream_files = Some(value.parse()?),
            "--crash-child" => a.crash_child = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    if a.streams.is_empty() || a.streams.contains(&0) || a.modes.is_empty() || a.writers == 0 {
        return Err("--streams, --modes and --writers need at least one (non-zero) value".into());
    }
    if !(a.secs > 0.0 && a.warmup >= 0.0 && a.crash_secs >= 0.0) {
        return Err("--secs must be positive, --warmup and --crash-secs not negative".into());
    }
    Ok(a)
}

/// The arguments that make a child run `case` on `n` streams in `mode`.
fn child_args(a: &Args, n: usize, mode: Durability) -> Vec<String> {
    let mut v = vec![
        "--streams".into(),
        n.to_string(),
        "--modes".into(),
        mode_name(mode).into(),
        "--writers".into(),
        a.writers.to_string(),
        "--body".into(),
        a.body.to_string(),
        "--warmup".into(),
        a.warmup.to_string(),
        "--secs".into(),
        a.secs.to_string(),
        "--crash-secs".into(),
        a.crash_secs.to_string(),
        "--create-threads".into(),
        a.create_threads.to_string(),
    ];
    if let Some(d) = &a.dir {
        v.extend(["--dir".into(), d.display().to_string()]);
    }
    if let Some(n) = a.max_open_streams {
        v.extend(["--max-open-streams".into(), n.to_string()]);
    }
    if let Some(n) = a.max_stream_files {
        v.extend(["--max-stream-files".into(), n.to_string()]);
    }
    if a.keep {
        v.push("--keep".into());
    }
    v
}

fn options(a: &Args, mode: Durability) -> Options {
    let mut o = Options::default().with_durability(mode);
    if let Some(n) = a.max_open_streams {
        o = o.with_max_open_streams(n);
    }
    if let Some(n) = a.max_stream_files {
        o = o.with_max_stream_files(n);
    }
    o
}

fn stream_name(i: usize) -> StreamName {
    StreamName::new(&format!("bench/s{i:08}")).expect("a valid stream name")
}

/// Deterministic, incompressible-looking bytes (xorshift64*).
fn noise(len: usize) -> Bytes {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out.into()
}

/// A small per-thread random number generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// User plus system CPU time of this process (every thread), in seconds.
#[expect(
    unsafe_code,
    reason = "getrusage(2) has no wrapper in std; libc's is an FFI call"
)]
fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` points to writable memory the size of a `rusage`, which getrusage fills.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) cannot fail");
    // SAFETY: zeroed is a valid `rusage` (integers only), and getrusage succeeded.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// Allocated bytes and number of files (directories included) under `dir`.
fn disk(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut files) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            bytes += m.blocks() * 512;
            files += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, files)
}

/// Whether `e` is the store's "retry shortly" refusal (`TooManyOpenStreams`: every open
/// stream has changes no checkpoint has recorded yet).
fn busy<T>(r: &Result<T, brook::Error>) -> bool {
    matches!(r, Err(brook::Error::TooManyOpenStreams { .. }))
}

/// Creates streams `0..n` from `threads` threads, each submitting 64 creates before waiting for
/// them (so creates share syncs). A create refused with `TooManyOpenStreams` is retried after
/// 20 ms; returns how many were.
fn create_streams(store: &Store, n: usize, threads: usize) -> Res<u64> {
    let threads = threads.clamp(1, n);
    std::thread::scope(|sc| -> Res<u64> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || -> Result<u64, brook::Error> {
                    let mut refused = 0;
                    let mine: Vec<usize> = (t..n).step_by(threads).collect();
                    for window in mine.chunks(64) {
                        let mut todo = window.to_vec();
                        while !todo.is_empty() {
                            let pending: Vec<_> = todo
                                .iter()
                                .map(|&i| {
                                    let req = CreateOptions::with_content_type(
                                        "application/octet-stream",
                                    );
                                    (i, store.submit_create(&stream_name(i), req))
                                })
                                .collect();
                            let mut again = Vec::new();
                            for (i, p) in pending {
                                let done = p.and_then(brook::Pending::wait);
                                if busy(&done) {
                                    again.push(i);
                                } else {
                                    done?;
                                }
                            }
                            if !again.is_empty() {
                                refused += again.len() as u64;
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            todo = again;
                        }
                    }
                    Ok(refused)
                })
            })
            .collect();
        let mut refused = 0;
        for h in handles {
            refused += h.join().map_err(|_| "a create thread panicked")??;
        }
        Ok(refused)
    })
}

/// What the writers did in the measured window.
struct Window {
    appends: u64,
    /// Appends refused with `TooManyOpenStreams` (warm-up included), each retried after 20 ms.
    refused: u64,
    secs: f64,
    cpu_secs: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn seed(thread: usize) -> Rng {
    Rng(0x2545_F491_4F6C_DD1D ^ ((thread as u64 + 1) << 20))
}

/// Runs `writers` threads appending `body` to random streams among `n` for `warmup + secs`
/// seconds, measuring the last `secs`.
fn write(
    store: &Store,
    n: usize,
    writers: usize,
    body: &Bytes,
    warmup: f64,
    secs: f64,
) -> Res<Window> {
    let from = Instant::now() + Duration::from_secs_f64(warmup);
    let until = from + Duration::from_secs_f64(secs);
    // A mark on stderr for a profiler to attach to the case's process (`perf record -p`).
    eprintln!("many_streams: writing, {warmup} s of warm-up");
    std::thread::scope(|sc| -> Res<Window> {
        let handles: Vec<_> = (0..writers)
            .map(|t| {
                sc.spawn(move || -> Result<(Vec<u32>, u64), brook::Error> {
                    let mut rng = seed(t);
                    let mut lat = Vec::new();
                    let mut refused = 0;
                    loop {
                        let i = rng.below(n);
                        let sent = Instant::now();
                        if sent >= until {
                            return Ok((lat, refused));
                        }
                        let done = store
                            .submit_append(&stream_name(i), AppendRequest::new(body.clone()))
                            .and_then(brook::Pending::wait);
                        if busy(&done) {
                            refused += 1;
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                        done?;
                        let done = Instant::now();
                        if sent >= from && done <= until {
                            let us = done.duration_since(sent).as_micros();
                            lat.push(u32::try_from(us).unwrap_or(u32::MAX));
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(from.saturating_duration_since(Instant::now()));
        let c0 = cpu_seconds();
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let cpu_secs = cpu_seconds() - c0;
        let (mut all, mut refused) = (Vec::new(), 0);
        for h in handles {
            let (lat, r) = h.join().map_err(|_| "a writer panicked")??;
            all.extend(lat);
            refused += r;
        }
        all.sort_unstable();
        let q = |p: f64| {
            all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
                .map_or(0.0, |&us| f64::from(us) / 1000.0)
        };
        Ok(Window {
            appends: all.len() as u64,
            refused,
            secs,
            cpu_secs,
            p50_ms: q(0.5),
            p99_ms: q(0.99),
        })
    })
}

/// Opens the store and heads one stream (what a server does before its first answer); seconds.
fn timed_open(dir: &Path, options: Options) -> Res<(Store, f64)> {
    let t = Instant::now();
    let store = Store::open(dir, options)?;
    store.head(&stream_name(0), &Guard::NONE)?;
    Ok((store, t.elapsed().as_secs_f64()))
}

fn journal_mb(dir: &Path) -> f64 {
    disk(&dir.join("journal")).0 as f64 / 1_048_576.0
}

/// One (N, mode) case; prints its table row (or where it failed) before its directory is
/// removed (which takes minutes at 1M streams: `--keep` leaves it).
fn run_case(a: &Args) -> Res<()> {
    let (n, mode) = (a.streams[0], a.modes[0]);
    let parent = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent)?;
    let tmp = tempfile::tempdir_in(&parent)?;
    let row = measure(a, &tmp.path().join("store"))
        .unwrap_or_else(|e| format!("failed: {} |", chain(e.as_ref())));
    println!("| {n} | {} | {row}", mode_name(mode));
    std::io::stdout().flush()?;
    if a.keep {
        eprintln!("many_streams: kept {}", tmp.keep().display());
    }
    Ok(())
}

/// An error and its sources, `: `-separated (brook's I/O failures carry the `io::Error`).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The case's measurements in `dir`: its table row but the first two cells.
fn measure(a: &Args, dir: &Path) -> Res<String> {
    let (n, mode) = (a.streams[0], a.modes[0]);
    let store = Store::open(dir, options(a, mode))?;
    let t = Instant::now();
    let creates_refused = create_streams(&store, n, a.create_threads)?;
    let creates_per_s = n as f64 / t.elapsed().as_secs_f64();
    let body = noise(a.body);
    let w = write(&store, n, a.writers, &body, a.warmup, a.secs)?;
    let (rss, fds) = (rss_mb(), open_fds());
    let budget = store.stats().stream_file_budget;
    let (bytes, files) = disk(dir);
    store.shutdown()?;
    drop(store);
    let row = format!(
        "{:.1}k | {:.1}k | {:.1} | {:.2} | {:.2} | {rss:.0} | {fds} / {budget} | {:.0} | {files} | {} (+{creates_refused} creates) |",
        creates_per_s / 1e3,
        w.appends as f64 / w.secs / 1e3,
        w.cpu_secs * 1e6 / w.appends.max(1) as f64,
        w.p50_ms,
        w.p99_ms,
        bytes as f64 / 1_048_576.0,
        w.refused,
    );
    let clean = match timed_open(dir, options(a, mode)) {
        Ok((store, secs)) => {
            store.shutdown()?;
            drop(store);
            format!("{secs:.2}")
        }
        Err(e) => return Ok(format!("{row} failed: {} | - |", chain(e.as_ref()))),
    };
    let journal = crash(a, dir)?;
    let crashed = match timed_open(dir, options(a, mode)) {
        Ok((store, secs)) => {
            store.shutdown()?;
            format!("{secs:.2}")
        }
        Err(e) => format!("failed: {}", chain(e.as_ref())),
    };
    Ok(format!(
        "{row} {clean} | {crashed} ({journal:.0} MB journal) |"
    ))
}

/// Runs a child that appends to the store in `dir` until it is killed (SIGKILL) mid-write: the
/// state a crash leaves. Returns the journal's size then, in MB.
fn crash(a: &Args, dir: &Path) -> Res<f64> {
    let (n, mode) = (a.streams[0], a.modes[0]);
    let mut child = Command::new(std::env::current_exe()?)
        .args(child_args(a, n, mode))
        .args(["--crash-child".into(), dir.display().to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    std::io::BufReader::new(child.stdout.take().ok_or("no child stdout")?).read_line(&mut ready)?;
    if ready.trim() != "writing" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("the crash child did not start writing: {ready:?}").into());
    }
    std::thread::sleep(Duration::from_secs_f64(a.crash_secs));
    child.kill()?;
    child.wait()?;
    Ok(journal_mb(dir))
}

/// The crash child: opens the store in `dir`, says "writing" and appends from `writers`
/// threads until it is killed (or, as a bound, for ten minutes: then it exits without shutting
/// the store down, as a crash would).
fn crash_child(a: &Args, dir: &Path) -> Res<()> {
    let (n, mode) = (a.streams[0], a.modes[0]);
    let store = Store::open(dir, options(a, mode))?;
    let body = noise(a.body);
    for t in 0..a.writers {
        let (store, body) = (store.clone(), body.clone());
        std::thread::spawn(move || {
            let mut rng = seed(t);
            loop {
                let req = AppendRequest::new(body.clone());
                let acked = store
                    .submit_append(&stream_name(rng.below(n)), req)
                    .and_then(brook::Pending::wait);
                if acked.is_err() {
                    return;
                }
            }
        });
    }
    println!("writing");
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_mins(10));
    std::process::exit(1)
}

fn main() -> Res<()> {
    let a = parse_args()?;
    if let Some(dir) = &a.crash_child {
        return crash_child(&a, dir);
    }
    if a.case {
        return run_case(&a);
    }
    println!(
        "{} writers, {} B appends at random, {} s warm-up, {} s measured; killed {} s into a second run",
        a.writers, a.body, a.warmup, a.secs, a.crash_secs
    );
    println!();
    println!(
        "| streams | mode | creates/s | appends/s | CPU us/append | p50 ms | p99 ms | RSS MB | fds / budget | disk MB | files | refused | open after close s | open after crash s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    std::io::stdout().flush()?;
    for &n in &a.streams {
        for &mode in &a.modes {
            let status = Command::new(std::env::current_exe()?)
                .args(child_args(&a, n, mode))
                .arg("--case")
                .status()?;
            if !status.success() {
                println!("| {n} | {} | failed: {status} |", mode_name(mode));
            }
        }
    }
    Ok(())
}
