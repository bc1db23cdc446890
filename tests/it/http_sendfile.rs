//! Large reads over a real socket, which the server sends from the segment and snapshot files
//! (`sendfile`) rather than from their maps: every byte must be the one at its offset, from any
//! start, across segment boundaries, bounded by `max_bytes`, from a snapshot blob, and from
//! segments that retention unlinks while the response is on its way.

use std::fmt::Write as _;
use std::time::Duration;

use brook::Options;
use brook::sim::noise;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http_support::{R, Server, config};

const OCTETS: (&str, &[u8]) = ("content-type", b"application/octet-stream");
const MESSAGE: usize = 700 << 10;
const MESSAGES: usize = 12;

/// A server with 1 MiB segments and a byte stream of `MESSAGES` appends of 700 KiB (8.2 MiB in
/// six segments). Returns the data and the offset after each append.
async fn big_stream(p: &str) -> R<(Server, Vec<u8>, Vec<String>)> {
    let s = Server::start_with(Options::default().with_segment_bytes(1 << 20), config()).await?;
    s.create(p, "application/octet-stream").await?;
    let data = noise(MESSAGE * MESSAGES, 0x9e37_79b9_7f4a_7c15);
    let mut after = Vec::new();
    for m in data.chunks(MESSAGE) {
        let r = s.send("POST", p, &[OCTETS], m.to_vec()).await?;
        assert_eq!(r.status, 204, "{}", r.text());
        after.push(r.need("stream-next-offset")?.to_owned());
    }
    Ok((s, data, after))
}

fn offset(bytes: usize) -> String {
    format!("{:016}_{bytes:016}", bytes / MESSAGE)
}

/// The byte half of an offset.
fn bytes_of(offset: &str) -> R<usize> {
    Ok(offset
        .split('_')
        .nth(1)
        .ok_or("offset without '_'")?
        .parse()?)
}

/// Reads from many starts (stream start, mid-segment, just before, at and after segment
/// boundaries, near the tail), whole and bounded by `max_bytes`, and compares byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_from_any_offset_are_byte_exact() -> R {
    let p = "/zc/offsets";
    let (s, data, after) = big_stream(p).await?;
    let max_read = 8 << 20;
    let catch_up = 64 << 20;
    let boundary = bytes_of(&after[1])?; // the second segment starts here
    let len = data.len();
    let starts = [
        0,
        1,
        4095,
        65_537,
        boundary - 1,
        boundary,
        boundary + 1,
        3_000_003,
        len - (40 << 10),
        len - 1,
    ];
    for from in starts {
        for max in [None, Some(1 << 20), Some(3_333_333), Some(17_000)] {
            let mut url = format!("{p}?offset={}", offset(from));
            if let Some(m) = max {
                let _ = write!(url, "&max_bytes={m}");
            }
            let r = s.get(&url, &[]).await?;
            assert_eq!(r.status, 200, "{url}: {}", r.text());
            // Without max_bytes the read spans chunks up to the catch-up size (64 MiB).
            let to = len.min(from + max.map_or(catch_up, |m| m.min(max_read)));
            assert_eq!(r.body.len(), to - from, "{url}: length");
            assert!(r.body == data[from..to], "{url}: bytes differ");
            assert_eq!(bytes_of(r.need("stream-next-offset")?)?, to, "{url}");
        }
    }
    // The whole stream along Stream-Next-Offset.
    assert!(s.read_all(p).await? == data, "read_all differs");
    Ok(())
}

/// A snapshot blob large enough to leave by `sendfile` reads back byte for byte, latest and by
/// offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_snapshot_blob_is_byte_exact() -> R {
    let s = Server::start().await?;
    let p = "/zc/blob";
    s.create(p, "application/octet-stream").await?;
    let r = s
        .send("POST", p, &[OCTETS], b"state so far".to_vec())
        .await?;
    let at = r.need("stream-next-offset")?.to_owned();
    let blob = noise(3 << 20, 42);
    let state = ("content-type", &b"application/x-state"[..]);
    let r = s
        .send("PUT", &format!("{p}/snapshot/{at}"), &[state], blob.clone())
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    for url in [format!("{p}/snapshot/{at}"), format!("{p}/snapshot")] {
        let r = s.get(&url, &[]).await?;
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        assert!(r.body == blob, "{url}: bytes differ");
    }
    Ok(())
}

/// A response already under way keeps sending the right bytes after retention dropped its
/// segments and unlinked their files: its views hold the files open. The client reads through
/// a small receive buffer, so most of the 8.2 MiB body is still to be sent when retention runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_in_flight_survives_retention_of_its_segments() -> R {
    let p = "/zc/trimmed";
    let (s, data, after) = big_stream(p).await?;
    let logs = || -> R<usize> { Ok(count_logs(&s.dir.path().join("streams"))?) };
    let segments = logs()?;
    assert!(segments >= 5, "{segments} segment logs");

    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(16 << 10)?;
    let addr = s.base.trim_start_matches("http://").parse()?;
    let mut tcp = socket.connect(addr).await?;
    let request = format!(
        "GET {p}?offset={} HTTP/1.1\r\nhost: brook\r\nconnection: close\r\n\r\n",
        offset(0)
    );
    tcp.write_all(request.as_bytes()).await?;
    // The status line is here: the body's views were taken before the head was sent.
    let mut got = vec![0u8; 12];
    tcp.read_exact(&mut got).await?;
    assert_eq!(&got, b"HTTP/1.1 200");

    // Retention to a snapshot at message 8 reclaims the first four segments (5.5 MiB).
    let target = &after[7];
    let state = ("content-type", &b"application/x-state"[..]);
    let r = s
        .send(
            "PUT",
            &format!("{p}/snapshot/{target}"),
            &[state],
            b"s".to_vec(),
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s.put(&format!("{p}/retention/{target}"), &[], "").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    for _ in 0..50 {
        if logs()? <= segments - 4 {
            break;
        }
        s.store.checkpoint()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logs()? <= segments - 4, "retention unlinked the segments");

    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut got)).await??;
    let head_end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of head")?;
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    let body = &got[head_end + 4..];
    // The whole stream: one catch-up read spans the 8 MiB engine chunks to the tail.
    let expect = &data[..];
    assert!(
        head.contains(&format!("content-length: {}", expect.len())),
        "{head}"
    );
    assert_eq!(body.len(), expect.len());
    assert!(body == expect, "bytes differ");
    Ok(())
}

/// Segment logs (`*.log`) under `dir`.
fn count_logs(dir: &std::path::Path) -> std::io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            n += count_logs(&path)?;
        } else if path.extension().is_some_and(|e| e == "log") {
            n += 1;
        }
    }
    Ok(n)
}

/// The bytes `brook serve` (process `pid`) has read through `read`-family calls and
/// `sendfile`, from `/proc/<pid>/io` (`rchar`): `sendfile` counts the file bytes it sends,
/// writes from a map read nothing.
fn rchar(pid: u32) -> R<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let line = io
        .lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .ok_or("no rchar")?;
    Ok(line.trim().parse()?)
}

/// `brook serve` sends a large catch-up body with `sendfile` by default and writes it from the
/// map with `--no-sendfile`: the bytes it reads while serving a 4 MiB read (`rchar`) are the
/// body's (all but at most its last 16 KiB) in the first case and almost none in the second;
/// the body is the same in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sendfile_writes_catch_up_bodies_from_the_maps() -> R {
    use crate::http_support::ChildServer;
    let data = noise(4 << 20, 0x51f1_e5ed);
    for (flags, by_sendfile) in [(&[][..], true), (&["--no-sendfile"][..], false)] {
        let s = ChildServer::start(flags)?;
        let url = s.url("/sf/big");
        let put = s
            .client
            .put(&url)
            .header("content-type", "application/octet-stream");
        assert_eq!(put.body(data.clone()).send().await?.status(), 201);
        // The first read after the append checks the messages' checksums (through the map).
        let first = s.client.get(format!("{url}?offset=-1")).send().await?;
        assert_eq!(first.bytes().await?.len(), data.len());
        let before = rchar(s.child.id())?;
        let got = s.client.get(format!("{url}?offset=-1")).send().await?;
        let body = got.bytes().await?;
        // All of the body but a last piece under 16 KiB: a `sendfile` that sends part of a
        // mapped slice (the socket's buffer full) leaves the rest to the next call, and a rest
        // under 16 KiB is written with the pieces after it. The kernel counts a `sendfile`'s
        // bytes when the call returns, which can be after the client has read them: wait for
        // the count a moment.
        let least = (4 << 20) - (16 << 10);
        let mut read = rchar(s.child.id())? - before;
        for _ in 0..40 {
            if !by_sendfile || read >= least {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
            read = rchar(s.child.id())? - before;
        }
        drop(s);
        assert!(body[..] == data[..], "the body differs ({flags:?})");
        if by_sendfile {
            assert!(
                read >= least,
                "{read} bytes read by sendfile, flags {flags:?}"
            );
        } else {
            assert!(read < 1 << 20, "{read} bytes read with {flags:?}");
        }
    }
    Ok(())
}
