//! A full disk (issues 13 and 32), on a small tmpfs mounted for the test: in both durability
//! modes every append is acknowledged or refused with `INSUFFICIENT_STORAGE` before any of it
//! was written (never `OUTCOME_UNKNOWN`: the journal's space is set aside and the free space
//! looked at before a batch is written). Once space is freed the store takes writes again
//! without a restart, and after a reopen exactly the acknowledged appends are there, in order.
//!
//! Mounting needs `CAP_SYS_ADMIN` (root in CI's container); without it each test prints
//! `SKIPPED` with the reason and passes without running.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use brook::*;

use crate::util::{R, name, read_to_tail, typed};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Mounts a tmpfs of `mib` MiB at `at`; false if this process may not mount.
fn mount_tmpfs(at: &Path, mib: u64) -> Res<bool> {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
        .arg(at)
        .output()?;
    if !out.status.success() {
        eprintln!("mount: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.status.success())
}

struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

/// Fills a 16 MiB tmpfs through a store in `durability` mode until five appends are refused,
/// frees space, and checks that the same store takes writes again and that a reopened one
/// holds exactly the acknowledged appends.
fn fill_refuse_heal(durability: Durability, test: &str) -> R {
    let mnt = tempfile::tempdir()?;
    if !mount_tmpfs(mnt.path(), 16)? {
        eprintln!("SKIPPED {test}: cannot mount a tmpfs here (needs CAP_SYS_ADMIN)");
        return Ok(());
    }
    let _unmount = Unmount(mnt.path());
    let dir = mnt.path().join("store");
    // A filler to delete later: the space that comes back.
    std::fs::write(mnt.path().join("filler"), vec![1u8; 4 << 20])?;
    let s = name("full/a");
    let piece = |i: usize| format!("{i:08}:{}\n", "x".repeat(64 << 10));
    let mut acked = Vec::new();
    let mut refused = 0;
    {
        let options = Options::default()
            .with_durability(durability)
            .with_checkpoint_bytes(1 << 20);
        let store = Store::open(&dir, options)?;
        store.create(&s, typed("text/plain"))?;
        for i in 0..2000 {
            match store.append(&s, AppendRequest::new(piece(i))) {
                Ok(_) => acked.push(i),
                Err(e) => {
                    // Refused before any of it was written: never an unknown outcome.
                    assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "append {i}: {e}");
                    refused += 1;
                    if refused >= 5 {
                        break;
                    }
                }
            }
        }
        eprintln!(
            "{test}: disk full after {} acknowledged appends; refused {refused}",
            acked.len()
        );
        assert!(refused >= 5, "the disk never filled");
        assert_eq!(
            store.stats().poisoned_shards,
            1,
            "the refusing shard is counted"
        );
        std::fs::remove_file(mnt.path().join("filler"))?;
        // Space exists again: writes are taken without a restart (the shard heals).
        let since = Instant::now();
        loop {
            match store.append(&s, AppendRequest::new(piece(2000))) {
                Ok(_) => break,
                Err(e) if since.elapsed() < Duration::from_secs(5) => {
                    assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("still refused 5 s after space came back: {e}"),
            }
        }
        acked.push(2000);
        store.append(&s, AppendRequest::new(piece(2001)))?;
        acked.push(2001);
        assert_eq!(store.stats().poisoned_shards, 0);
        store.shutdown()?;
    }
    let store = Store::open(&dir, Options::default().with_durability(durability))?;
    let (data, _) = read_to_tail(&store, &s, None)?;
    let text = String::from_utf8(data)?;
    let got: Vec<usize> = text
        .lines()
        .map(|l| l.split(':').next().unwrap_or("").parse())
        .collect::<Result<_, _>>()?;
    assert_eq!(
        got, acked,
        "after reopening: every acknowledged append, only those"
    );
    // The store takes writes again after the reopen.
    store.append(&s, AppendRequest::new("after\n"))?;
    Ok(())
}

#[test]
fn a_full_disk_refuses_before_writing_and_heals_in_sync_mode() -> R {
    fill_refuse_heal(Durability::Sync, "a_full_disk_..._sync_mode")
}

#[test]
fn a_full_disk_refuses_before_writing_and_heals_in_buffered_mode() -> R {
    fill_refuse_heal(Durability::Buffered, "a_full_disk_..._buffered_mode")
}

/// `brook serve` on a full disk, over a real socket: appends are refused `507
/// INSUFFICIENT_STORAGE` (never `503 OUTCOME_UNKNOWN`), the log says which shard refuses and
/// why (the operating system's "No space left on device"), readiness turns `503`; once space
/// is freed appends are answered `204` again within a few seconds, with no restart, and the
/// stream holds exactly the acknowledged appends.
#[cfg(feature = "http")]
#[test]
fn a_server_on_a_full_disk_answers_507_then_heals_without_a_restart() -> R {
    serve_fill_refuse_heal("sync")
}

/// [`a_server_on_a_full_disk_answers_507_then_heals_without_a_restart`] with `--durability
/// buffered`.
#[cfg(feature = "http")]
#[test]
fn a_buffered_server_on_a_full_disk_answers_507_then_heals_without_a_restart() -> R {
    serve_fill_refuse_heal("buffered")
}

/// The server test above, with `brook serve --durability <durability>`.
#[cfg(feature = "http")]
fn serve_fill_refuse_heal(durability: &str) -> R {
    let mnt = tempfile::tempdir()?;
    if !mount_tmpfs(mnt.path(), 16)? {
        eprintln!("SKIPPED a_server_on_a_full_disk_... ({durability}): cannot mount a tmpfs here");
        return Ok(());
    }
    let _unmount = Unmount(mnt.path());
    std::fs::write(mnt.path().join("filler"), vec![1u8; 4 << 20])?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(["--durability", durability, "--data-dir"])
        .arg(mnt.path().join("store"))
        .env("RUST_LOG", "info");
    let served = crate::http_support::spawn_serve(cmd).map_err(|e| e.to_string())?;
    let base = served.addr.clone();
    let mut acked = 0usize;
    let result = (|| -> R {
        let req = |method: &str, path: &str, body: &[u8]| -> Res<(u16, String)> {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(&base)?;
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: b.test\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            c.write_all(head.as_bytes())?;
            c.write_all(body)?;
            let mut out = Vec::new();
            c.read_to_end(&mut out)?;
            let out = String::from_utf8_lossy(&out).into_owned();
            let status = out
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or("status")?;
            Ok((status, out))
        };
        assert_eq!(req("PUT", "/full/s", b"")?.0, 201);
        let piece = vec![b'x'; 64 << 10];
        let mut refused = None;
        for _ in 0..400 {
            let (status, text) = req("POST", "/full/s", &piece)?;
            if status != 204 {
                refused = Some((status, text));
                break;
            }
            acked += 1;
        }
        let (status, text) = refused.ok_or("the disk never filled")?;
        assert!(
            status == 507 && text.contains("INSUFFICIENT_STORAGE"),
            "{text}"
        );
        let (status, text) = req("POST", "/full/s", b"more")?;
        assert_eq!(status, 507, "{text}");
        let (status, text) = req("GET", "/__brook/ready", b"")?;
        assert_eq!(status, 503, "{text}");
        std::thread::sleep(Duration::from_millis(200));
        let log = served.log_text();
        assert!(
            log.contains("journal shard refusing writes")
                && log.contains("No space left on device"),
            "{log}"
        );
        assert!(!log.contains("journal shard poisoned"), "{log}");
        std::fs::remove_file(mnt.path().join("filler"))?;
        let since = Instant::now();
        loop {
            let (status, text) = req("POST", "/full/s", &piece)?;
            if status == 204 {
                acked += 1;
                break;
            }
            assert_eq!(status, 507, "{text}");
            assert!(
                since.elapsed() < Duration::from_secs(5),
                "still refused 5 s after space came back: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(req("GET", "/__brook/ready", b"")?.0, 200);
        Ok(())
    })();
    let mut child = served.child;
    let _ = child.kill();
    let _ = child.wait();
    result?;
    // Reopened in process (the server was killed: what it acknowledged was in the journal
    // file, which a killed process does not lose in either mode): exactly the acknowledged
    // appends.
    let store = Store::open(mnt.path().join("store"), Options::default())?;
    let (data, _) = read_to_tail(&store, &name("full/s"), None)?;
    assert_eq!(
        data.len(),
        acked * (64 << 10),
        "exactly the acknowledged appends"
    );
    assert!(data.iter().all(|&b| b == b'x'));
    Ok(())
}
