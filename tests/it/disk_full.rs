//! A full disk (issue 13), on a small tmpfs mounted for the test: every append is acknowledged,
//! refused with `INSUFFICIENT_STORAGE` (then nothing of it is stored), or, at most once, answered
//! `OUTCOME_UNKNOWN` (it reached the journal before the commit failed). Once space is freed the
//! store takes writes again without a restart (unless the outcome was unknown), and after a
//! reopen exactly the acknowledged appends (and perhaps the unknown one) are there, in order.
//!
//! Mounting needs `CAP_SYS_ADMIN` (root in CI's container); without it the test says so and
//! passes without running.

use std::path::Path;
use std::process::Command;

use brook::*;

use crate::util::{R, name, read_to_tail, typed};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Mounts a tmpfs of `mib` MiB at `at`; false if this process may not mount.
fn mount_tmpfs(at: &Path, mib: u64) -> Res<bool> {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
        .arg(at)
        .output()?;
    Ok(out.status.success())
}

struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn a_full_disk_refuses_writes_truthfully_and_loses_nothing_acknowledged() -> R {
    let mnt = tempfile::tempdir()?;
    if !mount_tmpfs(mnt.path(), 16)? {
        eprintln!("SKIPPED a_full_disk_...: cannot mount a tmpfs here (needs CAP_SYS_ADMIN)");
        return Ok(());
    }
    let _unmount = Unmount(mnt.path());
    let dir = mnt.path().join("store");
    // A filler to delete later, so there is room to reopen.
    std::fs::write(mnt.path().join("filler"), vec![0u8; 2 << 20])?;
    let s = name("full/a");
    let piece = |i: usize| format!("{i:08}:{}\n", "x".repeat(16 << 10));
    let mut acked = Vec::new();
    let mut unknown = None;
    let mut refused = 0;
    {
        let store = Store::open(&dir, Options::default().with_checkpoint_bytes(1 << 20))?;
        store.create(&s, typed("text/plain"))?;
        for i in 0..2000 {
            match store.append(&s, AppendRequest::new(piece(i))) {
                Ok(_) => {
                    // Acknowledged after a refusal only once the shard healed (a checkpoint may
                    // free journal space); never after an unknown outcome (that poisons).
                    assert!(unknown.is_none(), "acknowledged after an unknown outcome");
                    acked.push(i);
                }
                Err(e @ Error::OutcomeUnknown { .. }) => {
                    assert!(
                        unknown.is_none() && refused == 0,
                        "a second unknown outcome: {e}"
                    );
                    assert_eq!(e.code(), "OUTCOME_UNKNOWN");
                    unknown = Some(i);
                }
                Err(e) => {
                    assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{e}");
                    refused += 1;
                    if refused >= 5 {
                        break;
                    }
                }
            }
        }
        eprintln!(
            "disk full after {} acknowledged appends; unknown {unknown:?}; refused {refused}",
            acked.len()
        );
        assert!(refused >= 5 || unknown.is_some(), "the disk never filled");
        std::fs::remove_file(mnt.path().join("filler"))?;
        if unknown.is_none() {
            // Space exists again: writes are taken without a restart (the shard heals).
            let since = std::time::Instant::now();
            let healed = loop {
                match store.append(&s, AppendRequest::new(piece(2000))) {
                    Ok(_) => break true,
                    Err(e) if since.elapsed() < std::time::Duration::from_secs(5) => {
                        assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{e}");
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    Err(e) => panic!("still refused 5 s after space came back: {e}"),
                }
            };
            assert!(healed);
            acked.push(2000);
        }
        drop(store);
    }
    let store = Store::open(&dir, Options::default())?;
    let (data, _) = read_to_tail(&store, &s, None)?;
    let text = String::from_utf8(data)?;
    let got: Vec<usize> = text
        .lines()
        .map(|l| l.split(':').next().unwrap_or("").parse())
        .collect::<Result<_, _>>()?;
    let mut want = acked.clone();
    if let Some(u) = unknown
        && got.len() == want.len() + 1
    {
        want.push(u);
    }
    assert_eq!(
        got,
        want,
        "after reopening: acknowledged {}, unknown {unknown:?}",
        acked.len()
    );
    // The store takes writes again after the reopen.
    store.append(&s, AppendRequest::new("after\n"))?;
    Ok(())
}

/// `brook serve` on a full disk: appends are refused `507 INSUFFICIENT_STORAGE`, the log says
/// which shard was poisoned and why (the operating system's "No space left on device"), and
/// readiness turns `503`.
#[cfg(feature = "http")]
#[test]
fn a_server_on_a_full_disk_logs_the_poisoning_and_is_not_ready() -> R {
    let mnt = tempfile::tempdir()?;
    if !mount_tmpfs(mnt.path(), 8)? {
        eprintln!("SKIPPED a_server_on_a_full_disk_...: cannot mount a tmpfs here");
        return Ok(());
    }
    let _unmount = Unmount(mnt.path());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(mnt.path().join("store"))
        .env("RUST_LOG", "info");
    let served = crate::http_support::spawn_serve(cmd).map_err(|e| e.to_string())?;
    let base = served.addr.clone();
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
            let mut out = String::new();
            c.read_to_string(&mut out)?;
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
        }
        let (status, text) = refused.ok_or("the disk never filled")?;
        assert!(
            status == 507 && text.contains("INSUFFICIENT_STORAGE")
                || status == 503 && text.contains("OUTCOME_UNKNOWN"),
            "{text}"
        );
        let (status, text) = req("POST", "/full/s", b"more")?;
        assert_eq!(status, 507, "{text}");
        let (status, text) = req("GET", "/__brook/ready", b"")?;
        assert_eq!(status, 503, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(200));
        let log = served.log_text();
        assert!(
            log.contains("journal shard poisoned") && log.contains("No space left on device"),
            "{log}"
        );
        Ok(())
    })();
    let mut child = served.child;
    let _ = child.kill();
    let _ = child.wait();
    result
}
