//! Request smuggling and framing edge cases over a real socket, against a real brook server: each
//! case sends raw bytes and asserts the exact statuses the client reads, what the server stored
//! (the case's stream, read back), and whether the connection closed. Every case runs twice:
//! on a fresh connection, whose first head brook's own HTTP/1.1 loop (src/http/h1.rs) reads,
//! and on a connection an earlier request handed to hyper. The expected outcomes are hyper's
//! (learned from `brook::fuzzing::Http1Check::run` on the same bytes); with the `fuzzing`
//! feature, [`the_vectors_frame_alike_in_brook_and_hyper`] checks every case's bytes with the
//! differential check itself.

use std::time::Duration;

use crate::http_support::{R, Server};
use crate::http1_loop::{Conn, req};

/// How long a server may take to close a connection it must close.
const CLOSE: Duration = Duration::from_secs(5);

/// The content type of every case's stream.
const TEXT: &str = "Content-Type: text/plain\r\n";

/// Which loop reads a case's bytes.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// A fresh connection: brook's loop reads the first head (and hands the connection to
    /// hyper itself where it does).
    Loop,
    /// A connection that [`handoff`] already gave to hyper.
    Hyper,
}

/// Both paths.
const VIAS: [Via; 2] = [Via::Loop, Via::Hyper];

/// The stream [`handoff`] appends to.
const HANDOFF: &str = "/smuggle/handoff";

/// A request that hands its connection to hyper (it has a `Transfer-Encoding`): a chunked
/// append of one byte to [`HANDOFF`], a stream of its own so that the cases' streams hold only
/// what the cases sent.
fn handoff() -> Vec<u8> {
    cat(
        &head(HANDOFF, "Transfer-Encoding: chunked\r\n"),
        b"1\r\n.\r\n0\r\n\r\n",
    )
}

/// The request a smuggling attempt hides: an append of `EVIL` to `p`.
fn evil(p: &str) -> Vec<u8> {
    req("POST", p, TEXT, b"EVIL")
}

/// An append's head to `p` with `framing` (header lines, each ending in CRLF) and no
/// `Content-Length` of its own.
fn head(p: &str, framing: &str) -> Vec<u8> {
    format!("POST {p} HTTP/1.1\r\nHost: t.test\r\n{TEXT}{framing}\r\n").into_bytes()
}

/// `a` then `b`.
fn cat(a: &[u8], b: &[u8]) -> Vec<u8> {
    [a, b].concat()
}

/// The chunked body `abc`.
const ABC_CHUNKED: &[u8] = b"3\r\nabc\r\n0\r\n\r\n";

/// CL.TE: a `Content-Length` that covers the chunked body and the request after it, then
/// `Transfer-Encoding: chunked`. Transfer-Encoding frames it (`abc`), and since the two
/// disagree the connection closes after the answer: `EVIL` is never read as a request.
fn cl_te(p: &str) -> Vec<u8> {
    let rest = cat(ABC_CHUNKED, &evil(p));
    let framing = format!(
        "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
        rest.len()
    );
    cat(&head(p, &framing), &rest)
}

/// TE.CL: `Transfer-Encoding: chunked`, then a `Content-Length` that ends the body before a
/// request hidden in the chunk. The chunk is the body; the connection closes after the answer.
fn te_cl(p: &str) -> Vec<u8> {
    let hidden = evil(p);
    let framing = "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n";
    let mut out = head(p, framing);
    out.extend_from_slice(format!("{:x}\r\n", hidden.len()).as_bytes());
    out.extend_from_slice(&hidden);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out.extend_from_slice(&evil(p));
    out
}

/// Two equal `Content-Length`s and a second request after the body.
fn equal_lengths(p: &str) -> Vec<u8> {
    let first = cat(
        &head(p, "Content-Length: 3\r\nContent-Length: 3\r\n"),
        b"abc",
    );
    cat(&first, &req("POST", p, TEXT, b"def"))
}

/// Two different `Content-Length`s, the larger covering the request after it.
fn different_lengths(p: &str) -> Vec<u8> {
    let first = cat(
        &head(p, "Content-Length: 3\r\nContent-Length: 4\r\n"),
        b"abcd",
    );
    cat(&first, &evil(p))
}

/// A `Content-Length` that is a list of equal lengths.
fn length_list(p: &str) -> Vec<u8> {
    cat(&cat(&head(p, "Content-Length: 3, 3\r\n"), b"abc"), &evil(p))
}

/// `Transfer-Encoding: chunked, identity`: chunked is not the last coding.
fn chunked_identity(p: &str) -> Vec<u8> {
    let first = cat(
        &head(p, "Transfer-Encoding: chunked, identity\r\n"),
        ABC_CHUNKED,
    );
    cat(&first, &evil(p))
}

/// An obs-folded header line (a line that starts with a space continues the one before).
fn obs_fold(p: &str) -> Vec<u8> {
    cat(
        &cat(&head(p, "X-Note: a\r\n b\r\nContent-Length: 3\r\n"), b"abc"),
        &evil(p),
    )
}

/// The `Content-Length` value folded onto a second line.
fn obs_fold_length(p: &str) -> Vec<u8> {
    cat(
        &cat(&head(p, "Content-Length:\r\n 3\r\n"), b"abc"),
        &evil(p),
    )
}

/// A space between a header name and its colon (`Content-Length : 3`).
fn space_before_colon(p: &str) -> Vec<u8> {
    cat(&cat(&head(p, "Content-Length : 3\r\n"), b"abc"), &evil(p))
}

/// `Transfer-Encoding : chunked` (a space before the colon) with a `Content-Length`.
fn space_before_colon_te(p: &str) -> Vec<u8> {
    let first = cat(
        &head(p, "Transfer-Encoding : chunked\r\nContent-Length: 13\r\n"),
        ABC_CHUNKED,
    );
    cat(&first, &evil(p))
}

/// A NUL byte in a header value.
fn nul_in_value(p: &str) -> Vec<u8> {
    cat(
        &cat(&head(p, "X-Note: a\0b\r\nContent-Length: 3\r\n"), b"abc"),
        &evil(p),
    )
}

/// A bare CR in a header value.
fn cr_in_value(p: &str) -> Vec<u8> {
    cat(
        &cat(&head(p, "X-Note: a\rb\r\nContent-Length: 3\r\n"), b"abc"),
        &evil(p),
    )
}

/// Every line ended by a bare LF, then a second request.
fn bare_lf(p: &str) -> Vec<u8> {
    let first = format!(
        "POST {p} HTTP/1.1\nHost: t.test\nContent-Type: text/plain\nContent-Length: 3\n\nabc"
    );
    cat(first.as_bytes(), &req("POST", p, TEXT, b"def"))
}

/// Bare LF and CRLF mixed in one head, then a second request.
fn mixed_lf(p: &str) -> Vec<u8> {
    let first = format!(
        "POST {p} HTTP/1.1\r\nHost: t.test\nContent-Type: text/plain\r\nContent-Length: 3\n\r\nabc"
    );
    cat(first.as_bytes(), &req("POST", p, TEXT, b"def"))
}

/// An absolute-form target, then a second request.
fn absolute_form(p: &str) -> Vec<u8> {
    let first = format!(
        "POST http://t.test{p} HTTP/1.1\r\nHost: t.test\r\n{TEXT}Content-Length: 3\r\n\r\nabc"
    );
    cat(first.as_bytes(), &req("POST", p, TEXT, b"def"))
}

/// How many bytes [`short_body`]'s body still lacks.
const SHORT_BY: usize = 5;

/// A body shorter than its `Content-Length` followed by a whole request: all of it is body,
/// which still lacks [`SHORT_BY`] bytes.
fn short_body(p: &str) -> Vec<u8> {
    let rest = cat(b"abc", &evil(p));
    let framing = format!("Content-Length: {}\r\n", rest.len() + SHORT_BY);
    cat(&head(p, &framing), &rest)
}

/// A chunked body whose chunk size line is `size`, then a request.
fn chunk_size(p: &str, size: &[u8]) -> Vec<u8> {
    let mut out = head(p, "Transfer-Encoding: chunked\r\n");
    out.extend_from_slice(size);
    out.extend_from_slice(b"\r\nabc\r\n0\r\n\r\n");
    out.extend_from_slice(&evil(p));
    out
}

/// The bad chunk size lines: hex past `u64`, negative, not hex, garbage after the size,
/// a bare LF inside a chunk extension.
const BAD_SIZES: [(&str, &[u8]); 5] = [
    ("overflow", b"ffffffffffffffffff"),
    ("negative", b"-3"),
    ("not hex", b"g"),
    ("garbage after the size", b"3 x"),
    ("LF in an extension", b"3;a\nb"),
];

/// `Expect: 100-continue` and two of the body's five bytes, after which the client closes.
fn expect_then_close(p: &str) -> Vec<u8> {
    cat(
        &head(p, "Expect: 100-continue\r\nContent-Length: 5\r\n"),
        b"he",
    )
}

/// Two HTTP/1.0 requests, each with `connection` (a header line or nothing): an append of
/// `abc`, then a read.
fn http10(p: &str, connection: &str) -> Vec<u8> {
    format!(
        "POST {p} HTTP/1.0\r\nHost: t.test\r\n{TEXT}{connection}Content-Length: 3\r\n\r\nabc\
         GET {p}?offset=-1 HTTP/1.0\r\nHost: t.test\r\n{connection}\r\n"
    )
    .into_bytes()
}

/// A server with the [`HANDOFF`] stream.
async fn start() -> R<Server> {
    let s = Server::start().await?;
    s.create(HANDOFF, "text/plain").await?;
    Ok(s)
}

/// An HTTP/1.0 request with a chunked body (`Transfer-Encoding` is HTTP/1.1's), then a request.
fn http10_chunked(p: &str) -> Vec<u8> {
    let head =
        format!("POST {p} HTTP/1.0\r\nHost: t.test\r\n{TEXT}Transfer-Encoding: chunked\r\n\r\n");
    cat(&cat(head.as_bytes(), ABC_CHUNKED), &evil(p))
}

/// A stream for `case` on the path `via` names, and a connection on that path.
async fn setup(s: &Server, case: &str, via: Via) -> R<(String, Conn)> {
    let p = format!("/smuggle/{case}/{via:?}");
    s.create(&p, "text/plain").await?;
    let mut c = Conn::open(s).await?;
    if let Via::Hyper = via {
        c.send(&handoff()).await?;
        assert_eq!(c.response(false).await?.status, 204, "the hand-off request");
    }
    Ok((p, c))
}

/// The statuses of every response until the server closes the connection.
async fn until_closed(c: &mut Conn) -> R<Vec<u16>> {
    let mut statuses = Vec::new();
    loop {
        let more = tokio::time::timeout(CLOSE, async {
            if c.buf.is_empty() {
                c.fill().await
            } else {
                Ok(true)
            }
        })
        .await;
        match more {
            Ok(Ok(true)) => statuses.push(c.any_response(false).await?.status),
            Ok(Ok(false)) => return Ok(statuses),
            Ok(Err(e)) => return Err(format!("after {statuses:?}: {e}").into()),
            Err(_) => return Err(format!("after {statuses:?}, the connection stayed open").into()),
        }
    }
}

/// The statuses of the next `n` responses.
async fn next(c: &mut Conn, n: usize) -> R<Vec<u16>> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(c.any_response(false).await?.status);
    }
    Ok(statuses)
}

/// The connection still serves requests: a HEAD of `p` is answered 200.
async fn still_serves(c: &mut Conn, p: &str) -> R {
    c.send(format!("HEAD {p} HTTP/1.1\r\nHost: t.test\r\n\r\n").as_bytes())
        .await?;
    assert_eq!(c.response(true).await?.status, 200, "the next request");
    Ok(())
}

/// Sends `bytes` for `case` on each path and checks that the server answers `statuses`, then
/// closes the connection, having stored `stored` in the case's stream.
async fn closes_after(
    case: &str,
    bytes: fn(&str) -> Vec<u8>,
    statuses: &[u16],
    stored: fn(&str) -> Vec<u8>,
) -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, case, via).await?;
        c.send(&bytes(&p)).await?;
        assert_eq!(until_closed(&mut c).await?, statuses, "{case} via {via:?}");
        assert_eq!(
            String::from_utf8_lossy(&s.read_all(&p).await?),
            String::from_utf8_lossy(&stored(&p)),
            "{case} via {via:?}: what was stored"
        );
    }
    Ok(())
}

/// Sends `bytes` for `case` on each path and checks that the server answers `statuses` and
/// keeps serving the connection, having stored `stored`.
async fn keeps_open_after(
    case: &str,
    bytes: fn(&str) -> Vec<u8>,
    statuses: &[u16],
    stored: &[u8],
) -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, case, via).await?;
        c.send(&bytes(&p)).await?;
        assert_eq!(
            next(&mut c, statuses.len()).await?,
            statuses,
            "{case} via {via:?}"
        );
        still_serves(&mut c, &p).await?;
        assert_eq!(
            String::from_utf8_lossy(&s.read_all(&p).await?),
            String::from_utf8_lossy(stored),
            "{case} via {via:?}: what was stored"
        );
    }
    Ok(())
}

/// Nothing stored.
fn nothing(_: &str) -> Vec<u8> {
    Vec::new()
}

#[tokio::test]
async fn cl_te_is_answered_once_then_the_connection_closes() -> R {
    closes_after("cl-te", cl_te, &[204], |_| b"abc".to_vec()).await
}

#[tokio::test]
async fn te_cl_is_answered_once_then_the_connection_closes() -> R {
    closes_after("te-cl", te_cl, &[204], evil).await
}

#[tokio::test]
async fn two_equal_content_lengths_are_served_as_one() -> R {
    keeps_open_after("equal-lengths", equal_lengths, &[204, 204], b"abcdef").await
}

#[tokio::test]
async fn two_different_content_lengths_are_refused() -> R {
    closes_after("different-lengths", different_lengths, &[400], nothing).await
}

#[tokio::test]
async fn a_content_length_list_is_refused() -> R {
    closes_after("length-list", length_list, &[400], nothing).await
}

#[tokio::test]
async fn chunked_then_identity_is_refused() -> R {
    closes_after("chunked-identity", chunked_identity, &[400], nothing).await
}

#[tokio::test]
async fn obs_fold_is_refused() -> R {
    closes_after("obs-fold", obs_fold, &[400], nothing).await?;
    closes_after("obs-fold-length", obs_fold_length, &[400], nothing).await
}

#[tokio::test]
async fn a_space_before_the_colon_is_refused() -> R {
    closes_after("space-colon", space_before_colon, &[400], nothing).await?;
    closes_after("space-colon-te", space_before_colon_te, &[400], nothing).await
}

#[tokio::test]
async fn nul_and_bare_cr_in_header_values_are_refused() -> R {
    closes_after("nul", nul_in_value, &[400], nothing).await?;
    closes_after("cr", cr_in_value, &[400], nothing).await
}

#[tokio::test]
async fn bare_lf_line_endings_are_served() -> R {
    keeps_open_after("bare-lf", bare_lf, &[204, 204], b"abcdef").await?;
    keeps_open_after("mixed-lf", mixed_lf, &[204, 204], b"abcdef").await
}

#[tokio::test]
async fn absolute_form_targets_are_served() -> R {
    keeps_open_after("absolute", absolute_form, &[204, 204], b"abcdef").await
}

/// The bytes after a short body are body, whatever they look like: the request they spell is
/// stored as data, and only once the body is whole is it answered.
#[tokio::test]
async fn a_request_after_a_short_body_is_body() -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, "short-body", via).await?;
        c.send(&short_body(&p)).await?;
        c.send(&[b'.'; SHORT_BY]).await?;
        assert_eq!(next(&mut c, 1).await?, [204], "via {via:?}");
        still_serves(&mut c, &p).await?;
        let stored = [&b"abc"[..], &evil(&p), &[b'.'; SHORT_BY]].concat();
        assert_eq!(
            String::from_utf8_lossy(&s.read_all(&p).await?),
            String::from_utf8_lossy(&stored),
            "via {via:?}"
        );
    }
    Ok(())
}

/// A bad chunk size fails the body (chunked bodies are hyper's to read): the append handler
/// answers `400 INVALID_BODY`, hyper closes the connection, and nothing is stored.
async fn bad_chunk_size(case: &str, size: &[u8]) -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, case, via).await?;
        c.send(&chunk_size(&p, size)).await?;
        let r = c.response(false).await?;
        assert_eq!(r.status, 400, "{case} via {via:?}");
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            body.contains("\"code\":\"INVALID_BODY\""),
            "{case} via {via:?}: {body}"
        );
        let after = until_closed(&mut c).await?;
        assert!(
            after.is_empty(),
            "{case} via {via:?}: answered after the refusal: {after:?}"
        );
        assert_eq!(s.read_all(&p).await?, b"", "{case} via {via:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_chunk_size_past_u64_is_refused() -> R {
    bad_chunk_size("chunk-overflow", BAD_SIZES[0].1).await
}

#[tokio::test]
async fn a_negative_chunk_size_is_refused() -> R {
    bad_chunk_size("chunk-negative", BAD_SIZES[1].1).await
}

#[tokio::test]
async fn a_chunk_size_that_is_not_hex_is_refused() -> R {
    bad_chunk_size("chunk-not-hex", BAD_SIZES[2].1).await
}

#[tokio::test]
async fn garbage_after_a_chunk_size_is_refused() -> R {
    bad_chunk_size("chunk-garbage", BAD_SIZES[3].1).await
}

#[tokio::test]
async fn a_bare_lf_in_a_chunk_extension_is_refused() -> R {
    bad_chunk_size("chunk-ext-lf", BAD_SIZES[4].1).await
}

/// A client that asked for `100 Continue`, got it, sent part of the body and closed: nothing is
/// appended, and the server serves the next connection.
#[tokio::test]
async fn expect_continue_then_the_client_closes() -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, "expect-close", via).await?;
        let bytes = expect_then_close(&p);
        let (head, part) = bytes.split_at(bytes.len() - 2);
        c.send(head).await?;
        assert_eq!(next(&mut c, 1).await?, [100], "via {via:?}");
        c.send(part).await?;
        drop(c);
        let mut c = Conn::open(&s).await?;
        c.send(&req("POST", &p, TEXT, b"ok")).await?;
        assert_eq!(next(&mut c, 1).await?, [204], "via {via:?}");
        assert_eq!(s.read_all(&p).await?, b"ok", "via {via:?}");
    }
    Ok(())
}

/// HTTP/1.0 with `Connection: keep-alive`: both requests are served on one connection, which
/// stays open.
#[tokio::test]
async fn http10_keep_alive_serves_two_requests() -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, "http10-keep-alive", via).await?;
        c.send(&http10(&p, "Connection: keep-alive\r\n")).await?;
        let append = c.any_response(false).await?;
        assert_eq!((append.version.as_str(), append.status), ("HTTP/1.0", 204));
        let read = c.any_response(false).await?;
        assert_eq!((read.version.as_str(), read.status), ("HTTP/1.0", 200));
        assert_eq!(read.body, b"abc");
        still_serves(&mut c, &p).await?;
        assert_eq!(s.read_all(&p).await?, b"abc", "via {via:?}");
    }
    Ok(())
}

/// HTTP/1.0 without `Connection: keep-alive`: the first request is served, then the connection
/// closes and the second is never read.
#[tokio::test]
async fn http10_without_keep_alive_closes_after_one() -> R {
    let s = start().await?;
    for via in VIAS {
        let (p, mut c) = setup(&s, "http10-close", via).await?;
        let mut bytes = http10(&p, "");
        bytes.extend(evil(&p));
        c.send(&bytes).await?;
        assert_eq!(until_closed(&mut c).await?, [204], "via {via:?}");
        assert_eq!(s.read_all(&p).await?, b"abc", "via {via:?}");
    }
    Ok(())
}

#[tokio::test]
async fn http10_with_transfer_encoding_is_refused() -> R {
    closes_after("http10-chunked", http10_chunked, &[400], nothing).await
}

/// Every case's bytes (for stream `p`), named.
#[cfg(feature = "fuzzing")]
fn vectors(p: &str) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = [
        ("CL.TE", cl_te as fn(&str) -> Vec<u8>),
        ("TE.CL", te_cl),
        ("two equal Content-Lengths", equal_lengths),
        ("two different Content-Lengths", different_lengths),
        ("a Content-Length list", length_list),
        ("chunked, identity", chunked_identity),
        ("obs-fold", obs_fold),
        ("obs-fold in Content-Length", obs_fold_length),
        ("space before the colon", space_before_colon),
        (
            "space before the colon of Transfer-Encoding",
            space_before_colon_te,
        ),
        ("NUL in a value", nul_in_value),
        ("bare CR in a value", cr_in_value),
        ("bare LF", bare_lf),
        ("mixed LF and CRLF", mixed_lf),
        ("absolute-form target", absolute_form),
        ("a request after a short body", short_body),
        (
            "Expect: 100-continue, then the client closes",
            expect_then_close,
        ),
        ("HTTP/1.0 keep-alive", |p| {
            http10(p, "Connection: keep-alive\r\n")
        }),
        ("HTTP/1.0", |p| cat(&http10(p, ""), &evil(p))),
        ("HTTP/1.0 with Transfer-Encoding", http10_chunked),
    ]
    .into_iter()
    .map(|(name, bytes)| (name.to_owned(), bytes(p)))
    .collect();
    for (name, size) in BAD_SIZES {
        all.push((format!("chunk size: {name}"), chunk_size(p, size)));
    }
    all
}

/// Neighbours of the cases, for the differential check only: framing each loop must read as the
/// other does, whatever it comes to (a request after them may rightly run).
#[cfg(feature = "fuzzing")]
fn neighbours(p: &str) -> Vec<Vec<u8>> {
    let with = |framing: &str, body: &[u8]| cat(&cat(&head(p, framing), body), &evil(p));
    vec![
        with(
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
            ABC_CHUNKED,
        ),
        with(
            "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
            ABC_CHUNKED,
        ),
        with(
            "Transfer-Encoding: xchunked\r\nContent-Length: 13\r\n",
            ABC_CHUNKED,
        ),
        with(
            "Transfer-Encoding:\tchunked\r\nContent-Length: 13\r\n",
            ABC_CHUNKED,
        ),
        with("Transfer-Encoding: Chunked\r\n", ABC_CHUNKED),
        with(
            "Transfer-Encoding: chunked\r\n",
            b"3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n",
        ),
        with(
            "Transfer-Encoding: chunked\r\n",
            b"003\r\nabc\r\n0;x=y\r\n\r\n",
        ),
        with("Transfer-Encoding: chunked\r\n", b"3\nabc\n0\n\n"),
        with("Content-Length: +3\r\n", b"abc"),
        with("Content-Length: 0x3\r\n", b"abc"),
        with("Content-Length: 003\r\n", b"abc"),
        with("Content-Length: 3 \r\n", b"abc"),
        with("Content-Length: 18446744073709551616\r\n", b"abc"),
        with("Content-Length: 3\r\nContent-Length: 03\r\n", b"abc"),
        with("Content-Length: 2\r\n", b"abc"),
        with("Expect: 100-continue\r\nContent-Length: 3\r\n", b"abc"),
        with(
            "Connection: keep-alive, close\r\nContent-Length: 3\r\n",
            b"abc",
        ),
        with(
            "Connection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n",
            b"abc",
        ),
        format!("POST {p} HTTP/1.1\r\rHost: t.test\r\nContent-Length: 3\r\n\r\nabc").into_bytes(),
        format!("\r\nPOST {p} HTTP/1.1\r\nHost: t.test\r\nContent-Length: 3\r\n\r\nabc")
            .into_bytes(),
        format!("POST  {p} HTTP/1.1\r\nHost: t.test\r\nContent-Length: 3\r\n\r\nabc").into_bytes(),
    ]
}

/// The differential check on every case's bytes, on a fresh connection and after a hand-off to
/// hyper: a framing difference between brook's loop and hyper's on a known vector fails here.
#[cfg(feature = "fuzzing")]
#[test]
fn the_vectors_frame_alike_in_brook_and_hyper() -> R {
    let dir = tempfile::tempdir()?;
    let store = brook::Store::open(dir.path(), brook::Options::default())?;
    let check = brook::fuzzing::Http1Check::new(store);
    let p = "/smuggle/s";
    for (name, bytes) in vectors(p) {
        let (brook, hyper) = check.run(&bytes);
        assert_eq!(brook, hyper, "{name}");
        // Each vector reaches a handler or is refused (not only cut off): `EVIL` is never seen.
        assert!(
            brook.seen.iter().all(|seen| seen.body != "EVIL"),
            "{name}: the hidden request ran: {brook:?}"
        );
        check.check(&cat(&handoff(), &bytes));
    }
    for bytes in neighbours(p) {
        check.check(&bytes);
        check.check(&cat(&handoff(), &bytes));
    }
    Ok(())
}
