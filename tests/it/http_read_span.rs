//! Catch-up reads that span several engine chunks: a byte stream's reader far behind the tail
//! gets up to `catch_up_read_bytes` in one response (consecutive `max_read_bytes` chunks joined),
//! byte for byte, with the offsets, `Stream-Up-To-Date`, `ETag` and caching of that whole range;
//! JSON streams and reads bounded by `max_bytes` still get one chunk.

use brook::Options;
use brook::http::ServerConfig;

use crate::http_support::{R, Server, config};

const OCTETS: (&str, &[u8]) = ("content-type", b"application/octet-stream");
/// The store's chunk in these tests (`max_read_bytes`).
const CHUNK: usize = 1 << 20;
const MESSAGE: usize = 300 << 10;
const MESSAGES: usize = 20;

/// Bytes that do not repeat at any short period, so a slice from a wrong offset cannot compare
/// equal.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A server whose engine chunk is 1 MiB (segments of 1 MiB), with `catch_up` as its catch-up
/// read size, and a byte stream of 20 appends of 300 KiB (6 MiB).
async fn stream(p: &str, catch_up: u64) -> R<(Server, Vec<u8>)> {
    let options = Options::default()
        .with_segment_bytes(1 << 20)
        .with_max_read_bytes(CHUNK as u64);
    let s = Server::start_with(
        options,
        ServerConfig {
            catch_up_read_bytes: catch_up,
            ..config()
        },
    )
    .await?;
    s.create(p, "application/octet-stream").await?;
    let data = noise(MESSAGE * MESSAGES);
    for m in data.chunks(MESSAGE) {
        let r = s.send("POST", p, &[OCTETS], m.to_vec()).await?;
        assert_eq!(r.status, 204, "{}", r.text());
    }
    Ok((s, data))
}

/// The byte half of an offset.
fn bytes_of(offset: &str) -> R<usize> {
    Ok(offset
        .split('_')
        .nth(1)
        .ok_or("offset without '_'")?
        .parse()?)
}

fn offset(bytes: usize) -> String {
    format!("{:016}_{bytes:016}", bytes / MESSAGE)
}

/// With the default catch-up size (64 MiB), a read from the start or from any offset returns
/// the rest of the stream in one response, though the engine's chunk is 1 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_far_behind_gets_the_rest_in_one_response() -> R {
    let p = "/span/whole";
    let (s, data) = stream(p, ServerConfig::default().catch_up_read_bytes).await?;
    let len = data.len();
    for from in [
        None,
        Some(0),
        Some(1),
        Some(CHUNK - 1),
        Some(3 * MESSAGE + 7),
    ] {
        let url = match from {
            None => format!("{p}?offset=-1"),
            Some(f) => format!("{p}?offset={}", offset(f)),
        };
        let start = from.unwrap_or(0);
        let r = s.get(&url, &[]).await?;
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        assert_eq!(r.body.len(), len - start, "{url}: one response to the tail");
        assert!(r.body == data[start..], "{url}: bytes differ");
        assert_eq!(bytes_of(r.need("stream-next-offset")?)?, len, "{url}");
        assert_eq!(r.h("stream-up-to-date"), Some("true"), "{url}");
        // The ETag names the whole range: it revalidates to 304.
        let tag = r.need("etag")?.to_owned();
        let again = s.get(&url, &[("if-none-match", &tag)]).await?;
        assert_eq!(again.status, 304, "{url}: {}", again.text());
    }
    Ok(())
}

/// A catch-up size of 3 MiB over 1 MiB chunks: exactly 3 MiB per response, byte-exact, not up to
/// date, immutable (more data follows an explicit offset), and the reader reaches the tail along
/// `Stream-Next-Offset`; `max_bytes` still bounds a read to one chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catch_up_size_bounds_a_response() -> R {
    let p = "/span/bounded";
    let (s, data) = stream(p, 3 * CHUNK as u64).await?;
    let url = format!("{p}?offset={}", offset(5));
    let r = s.get(&url, &[]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body.len(), 3 * CHUNK);
    assert!(r.body == data[5..5 + 3 * CHUNK], "bytes differ");
    assert_eq!(bytes_of(r.need("stream-next-offset")?)?, 5 + 3 * CHUNK);
    assert_eq!(r.h("stream-up-to-date"), None);
    assert!(
        r.need("cache-control")?.contains("immutable"),
        "{:?}",
        r.h("cache-control")
    );
    let r = s.get(&format!("{url}&max_bytes=5000000"), &[]).await?;
    assert_eq!(r.body.len(), CHUNK, "max_bytes reads one engine chunk");
    assert!(r.body == data[5..5 + CHUNK], "bytes differ");
    let mut requests = 0;
    let mut out = Vec::new();
    let mut at = "-1".to_owned();
    loop {
        let r = s.get(&format!("{p}?offset={at}"), &[]).await?;
        requests += 1;
        out.extend_from_slice(&r.body);
        r.need("stream-next-offset")?.clone_into(&mut at);
        if r.h("stream-up-to-date") == Some("true") {
            break;
        }
    }
    assert!(out == data, "the stream along Stream-Next-Offset differs");
    assert_eq!(requests, data.len().div_ceil(3 * CHUNK));
    Ok(())
}

/// A JSON stream's catch-up read stays one engine chunk of whole messages (a valid array), so no
/// response splits a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_reads_stay_one_chunk_of_whole_messages() -> R {
    let options = Options::default().with_max_read_bytes(4096);
    let s = Server::start_with(options, config()).await?;
    let p = "/span/json";
    s.create(p, "application/json").await?;
    let json = ("content-type", &b"application/json"[..]);
    for i in 0..100 {
        let m = format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(90));
        let r = s.send("POST", p, &[json], m.into_bytes()).await?;
        assert_eq!(r.status, 204, "{}", r.text());
    }
    let mut seen = Vec::new();
    let mut at = "-1".to_owned();
    loop {
        let r = s.get(&format!("{p}?offset={at}"), &[]).await?;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            r.body.len() <= 4096 + 2,
            "one chunk: {} bytes",
            r.body.len()
        );
        let items: Vec<serde_json::Value> = serde_json::from_slice(&r.body)?;
        seen.extend(items.into_iter().map(|v| v["i"].as_u64()));
        r.need("stream-next-offset")?.clone_into(&mut at);
        if r.h("stream-up-to-date") == Some("true") {
            break;
        }
    }
    assert_eq!(seen, (0..100).map(Some).collect::<Vec<_>>());
    Ok(())
}
