//! SSE resumption the way a browser's own `EventSource` does it, over a real socket: `retry:` at
//! the start, `id: <streamNextOffset>` on data and control events, and `Last-Event-ID` (sent on
//! reconnection to the ORIGINAL URL) winning over the URL's `offset`.

use std::time::Duration;

use brook::Options;
use brook::http::ServerConfig;

use crate::http_support::{R, Server, config};

const JSON: (&str, &str) = ("content-type", "application/json");

/// Messages the resumption test appends.
const N: u64 = 300;

/// One dispatched SSE event, as a browser sees it: type, joined data, and the connection's last
/// event id after it.
#[derive(Debug, Clone)]
struct Event {
    kind: String,
    data: String,
    /// The `id:` field of this event's block, if it had one.
    id: Option<String>,
}

/// An SSE body's `retry:` values, and its events with data (`message` unless named), parsed by
/// the WHATWG rules brook relies on (`http_support::sse_blocks`).
fn parse(body: &str) -> (Vec<u64>, Vec<Event>) {
    let blocks = crate::http_support::sse_blocks(body);
    let retries = blocks.iter().filter_map(|b| b.retry).collect();
    let events = blocks
        .into_iter()
        .filter_map(|b| {
            Some(Event {
                data: b.data?,
                kind: b.kind.unwrap_or_else(|| "message".into()),
                id: b.id,
            })
        })
        .collect();
    (retries, events)
}

/// A server whose SSE connections end after `ms`.
async fn server(ms: u64) -> R<Server> {
    Server::start_with(
        Options::default(),
        ServerConfig {
            sse_max_duration: Duration::from_millis(ms),
            ..config()
        },
    )
    .await
}

/// One SSE connection read to its end: `url` with an optional `Last-Event-ID`.
async fn connect(s: &Server, url: &str, last_id: Option<&str>) -> R<(u16, String)> {
    let headers: Vec<(&str, &str)> = last_id.map(|i| ("last-event-id", i)).into_iter().collect();
    let r = s.get(url, &headers).await?;
    Ok((r.status, r.text()))
}

/// The `n` members of the JSON data events, in order.
fn numbers(events: &[Event]) -> R<Vec<u64>> {
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.kind == "data") {
        let v: serde_json::Value = serde_json::from_str(&e.data)?;
        for m in v.as_array().ok_or("data is an array")? {
            out.push(m["n"].as_u64().ok_or("n")?);
        }
    }
    Ok(out)
}

async fn append(s: &Server, p: &str, n: u64) -> R<String> {
    let r = s.post(p, &[JSON], &format!(r#"{{"n":{n}}}"#)).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    Ok(r.need("stream-next-offset")?.to_owned())
}

/// The connection opens with one `retry:`; every data event and every control event carries
/// `id:` equal to the control event's `streamNextOffset`, including the up-to-date control of an
/// empty stream and the final `streamClosed` one.
#[tokio::test]
async fn sse_sends_retry_first_and_ids_on_every_event() -> R {
    let s = server(300).await?;
    let p = "/v1/stream/sse-ids";
    s.create(p, "application/json").await?;
    let (status, body) = connect(&s, &format!("{p}?offset=-1&live=sse"), None).await?;
    assert_eq!(status, 200);
    assert!(body.starts_with("retry: 1000\n\n"), "{body}");
    let (retries, ev) = parse(&body);
    assert_eq!(retries, [1000]);
    let tail = s.tail(p).await?;
    assert_eq!(ev[0].kind, "control");
    assert_eq!(ev[0].id.as_deref(), Some(tail.as_str()), "{body}");

    let mut after = Vec::new();
    for n in 1..=3 {
        after.push(append(&s, p, n).await?);
    }
    s.post(p, &[JSON, ("stream-closed", "true")], "").await?;
    let (_, body) = connect(&s, &format!("{p}?offset=-1&live=sse"), None).await?;
    let (retries, ev) = parse(&body);
    assert_eq!(retries, [1000], "one retry per connection: {body}");
    assert!(ev.len() >= 2, "{body}");
    for pair in ev.chunks(2) {
        let [data, control] = pair else {
            // A lone trailing control event (the closure after the data's own control).
            assert_eq!(pair[0].kind, "control", "{body}");
            continue;
        };
        if data.kind != "data" {
            continue;
        }
        assert_eq!(control.kind, "control", "{body}");
        let c: serde_json::Value = serde_json::from_str(&control.data)?;
        let next = c["streamNextOffset"].as_str().ok_or("streamNextOffset")?;
        assert_eq!(control.id.as_deref(), Some(next), "{body}");
        assert_eq!(data.id.as_deref(), Some(next), "{body}");
    }
    let last = ev.last().ok_or("events")?;
    let c: serde_json::Value = serde_json::from_str(&last.data)?;
    assert_eq!(c["streamClosed"], true);
    assert_eq!(last.id.as_deref(), Some(after[2].as_str()));
    assert!(
        ev.iter()
            .filter_map(|e| e.id.as_deref())
            .all(|i| !i.contains('\0')),
        "no NUL in ids"
    );
    Ok(())
}

/// A client that reconnects like `EventSource` (always to the original `offset=-1` URL, with the
/// last id seen as `Last-Event-ID`) while a writer appends gets every message exactly once, in
/// order, across many server-ended connections.
#[tokio::test]
async fn last_event_id_resumes_exactly_after_the_last_event() -> R {
    let s = std::sync::Arc::new(server(150).await?);
    let p = "/v1/stream/sse-resume";
    s.create(p, "application/json").await?;
    let writer = s.clone();
    let write = tokio::spawn(async move {
        for n in 1..=N {
            append(&writer, p, n).await.map_err(|e| e.to_string())?;
            if n % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
        Ok::<_, String>(())
    });
    let url = format!("{p}?offset=-1&live=sse");
    let mut last_id: Option<String> = None;
    let mut got = Vec::new();
    let mut connections = 0;
    // Bounded: the writer takes about 0.5 s and each connection lasts 150 ms.
    while got.len() < usize::try_from(N)? && connections < 200 {
        let (status, body) = connect(&s, &url, last_id.as_deref()).await?;
        assert_eq!(status, 200, "{body}");
        connections += 1;
        let (_, ev) = parse(&body);
        got.extend(numbers(&ev)?);
        if let Some(id) = ev.iter().rev().find_map(|e| e.id.clone()) {
            last_id = Some(id);
        }
    }
    write.await??;
    let want: Vec<u64> = (1..=N).collect();
    assert_eq!(got, want, "every message once, in order");
    assert!(connections > 1, "the test forced reconnections");
    Ok(())
}

/// `Last-Event-ID` wins over the URL's `offset`, whichever it is; other reads ignore it.
#[tokio::test]
async fn last_event_id_wins_over_the_offset() -> R {
    let s = server(200).await?;
    let p = "/v1/stream/sse-wins";
    s.create(p, "application/json").await?;
    let mut after = Vec::new();
    for n in 1..=4 {
        after.push(append(&s, p, n).await?);
    }
    for offset in ["-1", "now", after[0].as_str(), after[3].as_str()] {
        let url = format!("{p}?offset={offset}&live=sse");
        let (status, body) = connect(&s, &url, Some(&after[1])).await?;
        assert_eq!(status, 200, "{body}");
        assert_eq!(numbers(&parse(&body).1)?, [3, 4], "offset={offset}: {body}");
    }
    // `-1` in the header is the start, as in the URL.
    let url = format!("{p}?offset={}&live=sse", after[3]);
    let (_, body) = connect(&s, &url, Some("-1")).await?;
    assert_eq!(numbers(&parse(&body).1)?, [1, 2, 3, 4]);

    // Catch-up and long-poll reads go by the URL alone, even with a malformed header.
    for q in ["", "&live=long-poll"] {
        let r = s
            .get(
                &format!("{p}?offset={}{q}", after[2]),
                &[("last-event-id", "bogus")],
            )
            .await?;
        assert_eq!(r.status, 200, "{q}: {}", r.text());
        assert_eq!(r.text(), r#"[{"n":4}]"#);
    }
    Ok(())
}

/// A malformed `Last-Event-ID` is refused as a malformed `offset` is: 400 `INVALID_OFFSET`,
/// problem+json; offsets beyond the tail answer as they do in the URL.
#[tokio::test]
async fn malformed_last_event_id_is_400_invalid_offset() -> R {
    let s = server(200).await?;
    let p = "/v1/stream/sse-bad";
    s.create(p, "application/json").await?;
    let url = format!("{p}?offset=-1&live=sse");
    for bad in ["x", "12", "0000000000000001_000000000000000z", ""] {
        let r = s.get(&url, &[("last-event-id", bad)]).await?;
        r.refused(400, "INVALID_OFFSET");
        assert!(r.text().contains("Last-Event-ID"), "{}", r.text());
    }
    let far = "9999999999999999_9999999999999999";
    let by_url = s.get(&format!("{p}?offset={far}&live=sse"), &[]).await?;
    let by_header = s.get(&url, &[("last-event-id", far)]).await?;
    assert_eq!(by_header.status, by_url.status);
    assert_eq!(by_header.code(), by_url.code());
    Ok(())
}
