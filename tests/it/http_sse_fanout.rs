//! SSE fan-out over real sockets: subscribers of one stream share the frames rendered for the
//! same place (`fanout.rs`), so these tests check that sharing never hands a subscriber anything
//! but its own events: subscribers at different offsets, with different `max_bytes` or cursors,
//! on text and base64 streams, and one that falls far behind, each get exactly the stream's
//! bytes from where they started, in order, every data event followed by its control event.

use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use brook::Options;
use brook::http::ServerConfig;

use crate::http_support::{R, Server, config};

/// A server whose SSE connections outlive every test here.
async fn server() -> R<Server> {
    Server::start_with(
        Options::default(),
        ServerConfig {
            sse_max_duration: Duration::from_mins(2),
            ..config()
        },
    )
    .await
}

/// One SSE subscriber on a raw socket, so a test decides when it reads.
struct Sub {
    io: TcpStream,
    /// Bytes read and not yet de-chunked.
    raw: Vec<u8>,
    /// The de-chunked body so far.
    body: Vec<u8>,
    /// The final chunk arrived: the server ended the event stream.
    ended: bool,
    /// How far [`Sub::until`] has looked in `body`.
    seen: usize,
}

impl Sub {
    /// Opens `GET {path_and_query}` with `live=sse` and reads the response head.
    async fn open(s: &Server, path_and_query: &str) -> R<Sub> {
        let addr = s.base.trim_start_matches("http://").to_owned();
        let sock = tokio::net::TcpSocket::new_v4()?;
        // A small receive window: a subscriber that stops reading is soon held back by the
        // server rather than by the kernel's buffers.
        sock.set_recv_buffer_size(16 << 10)?;
        let mut io = sock.connect(addr.parse()?).await?;
        io.write_all(
            format!(
                "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
        let mut sub = Sub {
            io,
            raw: Vec::new(),
            body: Vec::new(),
            ended: false,
            seen: 0,
        };
        let end = loop {
            if let Some(i) = sub.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            sub.fill().await?;
        };
        let head = String::from_utf8_lossy(&sub.raw[..end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        sub.raw.drain(..end);
        Ok(sub)
    }

    /// Reads once more from the socket (bounded by 10 s).
    async fn fill(&mut self) -> R {
        let mut buf = vec![0u8; 16 << 10];
        let n = tokio::time::timeout(Duration::from_secs(10), self.io.read(&mut buf))
            .await
            .map_err(|_| {
                format!(
                    "nothing to read for 10 s; the body so far ends {:?}",
                    String::from_utf8_lossy(&self.body[self.body.len().saturating_sub(300)..])
                )
            })??;
        assert!(n > 0, "the connection closed before the event stream ended");
        self.raw.extend_from_slice(&buf[..n]);
        Ok(())
    }

    /// Moves every whole chunk from `raw` to `body`.
    fn dechunk(&mut self) -> R {
        loop {
            let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return Ok(());
            };
            let n = usize::from_str_radix(std::str::from_utf8(&self.raw[..eol])?, 16)?;
            if n == 0 {
                self.ended = true;
                return Ok(());
            }
            if self.raw.len() < eol + 2 + n + 2 {
                return Ok(());
            }
            self.body.extend_from_slice(&self.raw[eol + 2..eol + 2 + n]);
            self.raw.drain(..eol + 2 + n + 2);
        }
    }

    /// Reads until the body holds `needle` after what earlier calls found (bounded: 10 s per
    /// read).
    async fn until(&mut self, needle: &str) -> R {
        let needle = needle.as_bytes();
        self.dechunk()?;
        loop {
            if let Some(i) = self.body[self.seen..]
                .windows(needle.len())
                .position(|w| w == needle)
            {
                self.seen += i + needle.len();
                return Ok(());
            }
            self.seen = self.body.len().saturating_sub(needle.len());
            self.fill().await?;
            self.dechunk()?;
        }
    }

    /// Reads until the server ends the event stream (its final control event, on a closed
    /// stream); the events.
    async fn until_closed(&mut self) -> R<Vec<Event>> {
        self.dechunk()?;
        while !self.ended {
            self.fill().await?;
            self.dechunk()?;
        }
        Ok(parse(std::str::from_utf8(&self.body)?))
    }
}

/// One SSE event as a client dispatches it.
#[derive(Debug)]
struct Event {
    kind: String,
    /// The `data:` lines joined with LF.
    data: String,
    id: Option<String>,
}

/// The events of an SSE body: the blocks with an `event:` field.
fn parse(body: &str) -> Vec<Event> {
    crate::http_support::sse_blocks(body)
        .into_iter()
        .filter_map(|b| {
            Some(Event {
                kind: b.kind?,
                data: b.data.unwrap_or_default(),
                id: b.id,
            })
        })
        .collect()
}

/// What a subscriber was told: the payloads of its data events (decoded when `base64`), each
/// checked to be followed by a control event whose `streamNextOffset` is both events' `id`; the
/// cursors of its control events; and the last control event.
fn payloads(events: &[Event], base64: bool) -> R<(Vec<Vec<u8>>, Vec<u64>, serde_json::Value)> {
    let mut data = Vec::new();
    let mut cursors = Vec::new();
    let mut last = serde_json::Value::Null;
    let mut i = 0;
    while i < events.len() {
        let e = &events[i];
        if e.kind == "data" {
            let control = events
                .get(i + 1)
                .ok_or("a data event without its control")?;
            assert_eq!(control.kind, "control", "{events:?}");
            assert_eq!(e.id, control.id, "data and control ids");
            data.push(if base64 {
                base64::engine::general_purpose::STANDARD.decode(&e.data)?
            } else {
                e.data.clone().into_bytes()
            });
            i += 1;
            continue;
        }
        assert_eq!(e.kind, "control", "{events:?}");
        let c: serde_json::Value = serde_json::from_str(&e.data)?;
        assert_eq!(
            c["streamNextOffset"].as_str(),
            e.id.as_deref(),
            "control id is its offset"
        );
        if let Some(cur) = c["streamCursor"].as_str() {
            cursors.push(cur.parse()?);
        }
        last = c;
        i += 1;
    }
    Ok((data, cursors, last))
}

/// Subscribers of one text stream at the tail, from the start, from the middle, with a small
/// `max_bytes` and with a cursor ahead of the clock, and of one binary stream, all read while
/// appends arrive: each gets the stream's bytes from its own start exactly, its own cursors, and
/// the final `streamClosed`.
#[tokio::test]
async fn subscribers_at_different_places_get_their_own_events() -> R {
    let s = server().await?;
    let text = "/fan/text";
    let bin = "/fan/bin";
    s.create(text, "text/plain").await?;
    s.create(bin, "application/octet-stream").await?;
    let mut expected = String::new();
    for i in 0..5 {
        let m = format!("early {i}\n");
        s.post(text, &[("content-type", "text/plain")], &m).await?;
        expected.push_str(&m);
    }
    let middle = s.tail(text).await?;
    let from_middle = expected.len();
    let mut tail_subs = Vec::new();
    for _ in 0..6 {
        tail_subs.push(Sub::open(&s, &format!("{text}?offset={middle}&live=sse")).await?);
    }
    let mut start = Sub::open(&s, &format!("{text}?offset=-1&live=sse")).await?;
    let mut small = Sub::open(&s, &format!("{text}?offset=-1&live=sse&max_bytes=4")).await?;
    let ahead_cursor = u64::from(u32::MAX);
    let mut ahead = Sub::open(
        &s,
        &format!("{text}?offset={middle}&live=sse&cursor={ahead_cursor}"),
    )
    .await?;
    let mut bin_subs = Vec::new();
    for _ in 0..3 {
        bin_subs.push(Sub::open(&s, &format!("{bin}?offset=-1&live=sse")).await?);
    }
    let mut bin_expected = Vec::new();
    for i in 0..40u32 {
        let m = format!("late {i}\nwith a second line\n");
        s.post(text, &[("content-type", "text/plain")], &m).await?;
        expected.push_str(&m);
        let b: Vec<u8> = (0..=(i % 7) as u8)
            .map(|k| k.wrapping_mul(37) ^ 0xA5)
            .collect();
        let r = s
            .client
            .post(s.url(bin))
            .header("content-type", "application/octet-stream")
            .body(b.clone())
            .send()
            .await?;
        assert_eq!(r.status(), 204);
        bin_expected.extend_from_slice(&b);
        if i % 10 == 0 {
            // Some subscribers read as they go, some only at the end.
            for sub in &mut tail_subs[..3] {
                sub.until(&format!("late {i}")).await?;
            }
        }
    }
    for p in [text, bin] {
        let r = s.post(p, &[("stream-closed", "true")], "").await?;
        assert_eq!(r.status, 204, "{}", r.text());
    }
    let final_offset = s.tail(text).await?;

    let check_text = |events: Vec<Event>, from: usize, max: Option<usize>| -> R<Vec<u64>> {
        let (data, cursors, last) = payloads(&events, false)?;
        let got: String = data
            .iter()
            .map(|d| String::from_utf8(d.clone()))
            .collect::<Result<_, _>>()?;
        assert_eq!(got, expected[from..], "the stream's text from the start");
        if let Some(max) = max {
            assert!(data.iter().all(|d| d.len() <= max), "max_bytes respected");
        }
        assert_eq!(last["streamClosed"], true, "{last}");
        assert_eq!(
            last["streamNextOffset"].as_str(),
            Some(final_offset.as_str())
        );
        Ok(cursors)
    };
    let mut interval = None;
    for sub in &mut tail_subs {
        let cursors = check_text(sub.until_closed().await?, from_middle, None)?;
        assert!(!cursors.is_empty());
        interval.get_or_insert(cursors[0]);
        assert!(cursors.iter().all(|c| *c < ahead_cursor), "{cursors:?}");
    }
    check_text(start.until_closed().await?, 0, None)?;
    check_text(small.until_closed().await?, 0, Some(4))?;
    let cursors = check_text(ahead.until_closed().await?, from_middle, None)?;
    assert!(
        !cursors.is_empty() && cursors.iter().all(|c| *c > ahead_cursor),
        "a connection's cursor stays its own: {cursors:?}"
    );
    for sub in &mut bin_subs {
        let (data, _, last) = payloads(&sub.until_closed().await?, true)?;
        assert_eq!(data.concat(), bin_expected, "the binary stream's bytes");
        assert_eq!(last["streamClosed"], true);
    }
    Ok(())
}

/// A subscriber that reads nothing while hundreds of appends go by (its socket fills, the
/// server holds its place) still gets every message, in order, once it reads; the subscribers
/// that kept up got the same.
#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_every_event_in_order() -> R {
    let s = server().await?;
    let p = "/fan/behind";
    s.create(p, "application/json").await?;
    let mut slow = Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?;
    let mut quick = Vec::new();
    for _ in 0..3 {
        quick.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    // About 5 MB in all: more than the kernel buffers between the server and a reader hold.
    let pad = "x".repeat(16_000);
    let n = 300u64;
    for i in 0..n {
        let r = s
            .post(
                p,
                &[("content-type", "application/json")],
                &format!(r#"{{"n":{i},"pad":"{pad}"}}"#),
            )
            .await?;
        assert_eq!(r.status, 204, "{}", r.text());
        for q in &mut quick {
            q.until(&format!(r#""n":{i},"#)).await?;
        }
    }
    s.post(p, &[("stream-closed", "true")], "").await?;
    let numbers = |events: Vec<Event>| -> R<Vec<u64>> {
        let (data, _, last) = payloads(&events, false)?;
        assert_eq!(last["streamClosed"], true, "{last}");
        let mut out = Vec::new();
        for d in data {
            let v: serde_json::Value = serde_json::from_slice(&d)?;
            for m in v.as_array().ok_or("a JSON data event is an array")? {
                out.push(m["n"].as_u64().ok_or("n")?);
            }
        }
        Ok(out)
    };
    let all: Vec<u64> = (0..n).collect();
    assert_eq!(
        numbers(slow.until_closed().await?)?,
        all,
        "the slow subscriber"
    );
    for q in &mut quick {
        assert_eq!(numbers(q.until_closed().await?)?, all, "a quick subscriber");
    }
    Ok(())
}

/// The server's shutdown ends its subscribers at once, also ones that went back to waiting at
/// the tail many times since they connected (well within the keep-alive, 15 s, that would
/// otherwise be the next thing to wake them).
#[tokio::test]
async fn shutdown_ends_subscribers_that_waited_many_times() -> R {
    let s = server().await?;
    let p = "/fan/down";
    s.create(p, "text/plain").await?;
    let mut subs = Vec::new();
    for _ in 0..3 {
        subs.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    for i in 0..5 {
        s.post(p, &[("content-type", "text/plain")], &format!("m{i};"))
            .await?;
        for sub in &mut subs {
            sub.until(&format!("m{i};")).await?;
        }
    }
    // Dropping the server shuts it down.
    drop(s);
    for sub in &mut subs {
        let events = tokio::time::timeout(Duration::from_secs(5), sub.until_closed()).await??;
        let (data, _, last) = payloads(&events, false)?;
        assert_eq!(data.concat(), b"m0;m1;m2;m3;m4;");
        assert_ne!(
            last["streamClosed"], true,
            "ended by the shutdown, not a closure"
        );
    }
    Ok(())
}

/// A stream's live tail is written to its parked subscribers by one writer (`seat.rs`) while
/// subscribers come and go: ones that leave mid-stream (their sockets closed) take nothing
/// with them, ones that join at the tail get exactly what follows their start, and after every
/// subscriber left, a new one is served again.
#[tokio::test]
async fn subscribers_joining_and_leaving_mid_stream_get_exactly_their_part() -> R {
    let s = server().await?;
    let p = "/fan/churn";
    s.create(p, "text/plain").await?;
    let post = |i: u32| format!("m{i};");
    let mut stay = Vec::new();
    for _ in 0..4 {
        stay.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    let mut leave = Vec::new();
    for _ in 0..4 {
        leave.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    let mut expected = String::new();
    let mut joined: Vec<(Sub, usize)> = Vec::new();
    for i in 0..60u32 {
        let m = post(i);
        s.post(p, &[("content-type", "text/plain")], &m).await?;
        expected.push_str(&m);
        for sub in &mut stay {
            sub.until(&m).await?;
        }
        if i == 20 {
            // Half leave without a word, half after reading up to here.
            for (k, mut sub) in leave.drain(..).enumerate() {
                if k % 2 == 0 {
                    sub.until(&m).await?;
                }
                drop(sub);
            }
        }
        if i % 15 == 7 {
            let tail = s.tail(p).await?;
            let sub = Sub::open(&s, &format!("{p}?offset={tail}&live=sse")).await?;
            joined.push((sub, expected.len()));
        }
    }
    s.post(p, &[("stream-closed", "true")], "").await?;
    let text = |events: &[Event]| -> R<String> {
        let (data, _, last) = payloads(events, false)?;
        assert_eq!(last["streamClosed"], true, "{last}");
        Ok(data
            .iter()
            .map(|d| String::from_utf8(d.clone()))
            .collect::<Result<_, _>>()?)
    };
    for sub in &mut stay {
        assert_eq!(
            text(&sub.until_closed().await?)?,
            expected,
            "a subscriber that stayed"
        );
    }
    for (sub, from) in &mut joined {
        assert_eq!(
            text(&sub.until_closed().await?)?,
            expected[*from..],
            "a subscriber that joined at the tail"
        );
    }
    drop((stay, joined));
    // Every subscriber of the old stream left: a new stream's subscribers are served afresh.
    let q = "/fan/churn2";
    s.create(q, "text/plain").await?;
    let mut late = Sub::open(&s, &format!("{q}?offset=-1&live=sse")).await?;
    let mut late2 = Sub::open(&s, &format!("{q}?offset=-1&live=sse")).await?;
    for i in 0..5 {
        let m = post(i);
        s.post(q, &[("content-type", "text/plain")], &m).await?;
        late.until(&m).await?;
        late2.until(&m).await?;
    }
    Ok(())
}

/// A parked subscriber that stops reading while large events go by does not hold back the
/// others (each of them gets every event as it is appended), and is cut off once the server's
/// writes to it have made no progress for the write stall limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_subscriber_that_stops_reading_holds_back_nobody() -> R {
    let s = Server::start_with(
        Options::default(),
        ServerConfig {
            sse_max_duration: Duration::from_mins(2),
            write_stall_timeout: Duration::from_millis(500),
            ..config()
        },
    )
    .await?;
    let p = "/fan/stalled";
    s.create(p, "text/plain").await?;
    let mut stalled = Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?;
    let mut quick = Vec::new();
    for _ in 0..3 {
        quick.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    // Let every subscriber reach the tail and park.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // About 13 MB: more than the kernel's buffers between the server and the stalled reader
    // hold, so the server's writes to it stop making progress.
    let pad = "y".repeat(64_000);
    let started = std::time::Instant::now();
    for i in 0..200u32 {
        let m = format!("<{i}>{pad}");
        s.post(p, &[("content-type", "text/plain")], &m).await?;
        for q in &mut quick {
            q.until(&format!("<{i}>")).await?;
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the quick subscribers were held back: {:?}",
        started.elapsed()
    );
    // The stall must outlast the limit before the reader comes back: the posts alone can take
    // less (about 0.3 s on a quiet machine), and a reader that resumes within the limit is
    // rightly kept, to catch up from the log.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (got, took) = crate::http_support::read_until_cut_off(&mut stalled.io).await?;
    assert!(
        took < Duration::from_secs(20),
        "the stalled reader was never cut off"
    );
    assert!(
        got < 200 * 64_000,
        "received {got} bytes: the stalled reader was not cut off"
    );
    Ok(())
}

/// Parked subscribers still get their keep-alive comments when the stream is idle, and end at
/// their deadline (the connection's lifetime) with no event lost or repeated in between.
#[tokio::test]
async fn parked_subscribers_get_keep_alives_and_end_at_their_deadline() -> R {
    let s = Server::start_with(
        Options::default(),
        ServerConfig {
            sse_max_duration: Duration::from_millis(1500),
            sse_keepalive: Duration::from_millis(200),
            ..config()
        },
    )
    .await?;
    let p = "/fan/idle";
    s.create(p, "text/plain").await?;
    let mut subs = Vec::new();
    for _ in 0..3 {
        subs.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    let started = std::time::Instant::now();
    let mut expected = String::new();
    for i in 0..3 {
        let m = format!("m{i};");
        s.post(p, &[("content-type", "text/plain")], &m).await?;
        expected.push_str(&m);
        for sub in &mut subs {
            sub.until(&m).await?;
        }
        tokio::time::sleep(Duration::from_millis(350)).await;
    }
    for sub in &mut subs {
        let events = sub.until_closed().await?;
        assert!(started.elapsed() >= Duration::from_secs(1), "ended early");
        let (data, _, last) = payloads(&events, false)?;
        let got: String = data
            .iter()
            .map(|d| String::from_utf8(d.clone()))
            .collect::<Result<_, _>>()?;
        assert_eq!(got, expected);
        assert_ne!(last["streamClosed"], true, "ended by its deadline");
        let body = std::str::from_utf8(&sub.body)?;
        assert!(body.contains(": keep-alive\n\n"), "{body}");
    }
    Ok(())
}

/// Deleting a stream ends its parked subscribers.
#[tokio::test]
async fn deleting_the_stream_ends_parked_subscribers() -> R {
    let s = server().await?;
    let p = "/fan/deleted";
    s.create(p, "text/plain").await?;
    let mut subs = Vec::new();
    for _ in 0..3 {
        subs.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    s.post(p, &[("content-type", "text/plain")], "m0;").await?;
    for sub in &mut subs {
        sub.until("m0;").await?;
    }
    let r = s.delete(p, &[]).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    for sub in &mut subs {
        let events = tokio::time::timeout(Duration::from_secs(5), sub.until_closed()).await??;
        let (data, _, last) = payloads(&events, false)?;
        assert_eq!(data.concat(), b"m0;");
        assert_ne!(last["streamClosed"], true);
    }
    Ok(())
}

/// A subscriber whose socket filled while it did not read catches up on its own, and once back
/// at the tail it is served again at once: each new event arrives well within the keep-alive
/// interval (15 s), which is all that would wake a connection that waits without being
/// parked at its stream's writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_caught_up_is_served_again_at_once() -> R {
    let s = server().await?;
    let p = "/fan/caught-up";
    s.create(p, "text/plain").await?;
    let mut slow = Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?;
    let mut quick = Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?;
    // About 5 MB per round: more than the kernel's buffers hold, so the writer finds the slow
    // subscriber's socket full and hands it back to its own task.
    let pad = "z".repeat(64_000);
    for round in 0..3 {
        for j in 0..80 {
            let m = format!("<{round}.{j}>{pad}");
            s.post(p, &[("content-type", "text/plain")], &m).await?;
            quick.until(&format!("<{round}.{j}>")).await?;
        }
        slow.until(&format!("<{round}.79>")).await?;
        for k in 0..3 {
            let tick = format!("tick {round}.{k};");
            s.post(p, &[("content-type", "text/plain")], &tick).await?;
            quick.until(&tick).await?;
            tokio::time::timeout(Duration::from_secs(3), slow.until(&tick))
                .await
                .map_err(|_| format!("{tick} did not reach the subscriber that caught up"))??;
        }
    }
    Ok(())
}

/// A parked subscriber holds no task (`transport/h1/park.rs`): forty subscribers at the tail
/// add about one task to the runtime (their stream's writer), not forty, and they still get
/// every event; once woken (a keep-alive, the stream's deletion) each is served again.
#[tokio::test]
async fn parked_subscribers_hold_no_task() -> R {
    let s = Server::start_with(
        Options::default(),
        ServerConfig {
            sse_max_duration: Duration::from_mins(2),
            sse_keepalive: Duration::from_millis(300),
            ..config()
        },
    )
    .await?;
    let p = "/fan/taskless";
    s.create(p, "text/plain").await?;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = tasks();
    let mut subs = Vec::new();
    for _ in 0..40 {
        subs.push(Sub::open(&s, &format!("{p}?offset=-1&live=sse")).await?);
    }
    s.post(p, &[("content-type", "text/plain")], "m0;").await?;
    for sub in &mut subs {
        sub.until("m0;").await?;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let parked = tasks();
    assert!(
        parked < before + 5,
        "{} tasks for 40 parked subscribers ({before} before)",
        parked.saturating_sub(before)
    );
    // Keep-alives wake each one (a task for a moment), and new events still reach all.
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.post(p, &[("content-type", "text/plain")], "m1;").await?;
    for sub in &mut subs {
        sub.until("m1;").await?;
        assert!(
            std::str::from_utf8(&sub.body)?.contains(": keep-alive\n\n"),
            "no keep-alive"
        );
    }
    let r = s.delete(p, &[]).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    for sub in &mut subs {
        let events = tokio::time::timeout(Duration::from_secs(5), sub.until_closed()).await??;
        let (data, _, _) = payloads(&events, false)?;
        assert_eq!(data.concat(), b"m0;m1;");
    }
    Ok(())
}
