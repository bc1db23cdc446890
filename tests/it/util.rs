//! Helpers shared by the integration tests: crash images, a small seeded RNG, reading whole streams.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brook::*;

/// The result every test returns.
pub type R = std::result::Result<(), Box<dyn std::error::Error>>;

/// Create options with just a content type.
pub fn typed(content_type: &str) -> CreateOptions {
    CreateOptions::with_content_type(content_type)
}

/// A stream name known to be valid.
pub fn name(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

/// A fresh data directory (canonical, as the simulated disk matches paths) watched by the
/// simulated disk; the directory lives as long as the returned guard.
pub fn watched() -> std::io::Result<(tempfile::TempDir, PathBuf, Arc<brook::sim::Disk>)> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().canonicalize()?.join("store");
    std::fs::create_dir_all(&root)?;
    let disk = brook::sim::Disk::install(&root)?;
    Ok((tmp, root, disk))
}

/// Copies a directory tree, skipping files that vanish while it runs (a background thread of a
/// forgotten store may still be removing trash).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = to.join(e.file_name());
        let ft = match e.file_type() {
            Ok(ft) => ft,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        let r = if ft.is_dir() {
            copy_dir(&e.path(), &t)
        } else {
            std::fs::copy(e.path(), &t).map(|_| ())
        };
        match r {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

/// Simulates a process crash of `store` (no shutdown, no checkpoint, threads left running on the
/// old directory) and returns a copy of its directory as the files stood, without `LOCK`.
///
/// Every call made on the store must have returned. Its threads may still be finishing work
/// (emptying the trash, a checkpoint), so the copy is retried until nothing changed while it
/// ran: a copy torn across such work would be a state no crash can produce.
pub fn crash_image(store: Store, dir: &Path) -> std::io::Result<tempfile::TempDir> {
    std::mem::forget(store);
    loop {
        let before = fingerprint(dir)?;
        let copy = tempfile::tempdir()?;
        copy_dir(dir, copy.path())?;
        if fingerprint(dir)? == before {
            let _ = std::fs::remove_file(copy.path().join("LOCK"));
            return Ok(copy);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Every path under `dir` with its length and modification time.
fn fingerprint(
    dir: &Path,
) -> std::io::Result<Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for e in rd {
            let e = e?;
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), m.len(), m.modified().ok()));
        }
    }
    out.sort();
    Ok(out)
}

/// Every file under `dir`, recursively, sorted.
pub fn files_under(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Reads a stream from its earliest retained offset to its tail in chunks of at most `max_bytes`, checking that the
/// chunks join up. Returns the stored data (JSON bodies unwrapped to their messages).
pub fn read_to_tail(
    store: &Store,
    n: &StreamName,
    max_bytes: Option<u64>,
) -> brook::Result<(Vec<u8>, ReadChunk)> {
    let mut from = ReadFrom::At(store.head(n, &Guard::NONE)?.earliest);
    let mut out = Vec::new();
    loop {
        let mut req = ReadRequest::from(from);
        req.max_bytes = max_bytes;
        let c = store.read(n, &req)?;
        let body = c.to_vec();
        if c.content_type.starts_with("application/json") {
            let inner = body.get(1..body.len().saturating_sub(1)).unwrap_or(&[]);
            if !inner.is_empty() {
                if !out.is_empty() {
                    out.push(b',');
                }
                out.extend_from_slice(inner);
            }
        } else {
            out.extend_from_slice(&body);
        }
        if c.up_to_date {
            return Ok((out, c));
        }
        if c.next <= c.start {
            return Err(Error::InvalidArgument(format!(
                "read made no progress at {}",
                c.start
            )));
        }
        from = ReadFrom::At(c.next);
    }
}

/// A small, seeded xorshift generator: tests print their seed so a failure can be replayed with
/// `BROOK_TEST_SEED`.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `BROOK_TEST_SEED`, or from the clock.
    pub fn from_env(what: &str) -> Rng {
        let seed = std::env::var("BROOK_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{what}: BROOK_TEST_SEED={seed}");
        Rng::new(seed)
    }

    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// `true` with probability `1/n`.
    #[cfg(feature = "fuzzing")]
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    #[cfg(feature = "fuzzing")]
    /// Random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A test's external prerequisite (a program it runs as a peer) is missing; `what` says which
/// and how to get it. Where every check must run (`BROOK_REQUIRE_ALL`, which scripts/test
/// exports, or `CI`, set to anything but empty, `0` or `false`) this is the error that fails the
/// test; elsewhere it says so on one line of standard error and returns `Ok`: the caller then
/// returns, the test passing with that check not made.
#[cfg(feature = "http")] // its callers all run a server
pub fn missing_prerequisite(test: &str, what: &str) -> Result<(), String> {
    let required = ["BROOK_REQUIRE_ALL", "CI"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|x| !matches!(x.trim(), "" | "0" | "false")));
    if required {
        return Err(format!(
            "{test}: {what} (BROOK_REQUIRE_ALL or CI is set: no check may be skipped)"
        ));
    }
    eprintln!("{test}: skipped: {what}");
    Ok(())
}

/// Runs test `test` of this test binary (`module::name`) alone in a child process with `env`,
/// waits for it to print a line ending in `READY` (at most 30 s), lets it run for `run_for`,
/// kills it (SIGKILL: a crash) and returns every line it printed.
pub fn run_then_kill(
    test: &str,
    env: &[(&str, String)],
    run_for: std::time::Duration,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    use std::io::BufRead;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().expect("lock").push(l);
            }
        })
    };
    let t0 = Instant::now();
    // libtest's "test ... " has no newline before the child's first line.
    while !lines
        .lock()
        .expect("lock")
        .iter()
        .any(|l| l.ends_with("READY"))
        && t0.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(run_for);
    child.kill()?;
    child.wait()?;
    reader.join().map_err(|_| "reader panicked")?;
    let lines = lines.lock().expect("lock").clone();
    Ok(lines)
}
