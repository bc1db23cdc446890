//! JSON appends inside their limits, over a real socket (issue 50): a top-level array is split
//! into at most `--max-append-messages` messages, a longer one is refused 413 with nothing
//! written, and the split holds no parse tree, so a body of tens of millions of tiny messages
//! costs the server about its own size, not fifteen times it.

use crate::http_support::{ChildServer, R};

/// A JSON array of `n` zeros.
fn zeros(n: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(2 * n + 1);
    body.push(b'[');
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'0');
    }
    body.push(b']');
    body
}

/// The child's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(server: &ChildServer) -> R<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or("no VmHWM")?
        .parse()?;
    Ok(kb * 1024)
}

/// Found by an attacker test: one 60 MiB `[0,0,...]` took the server's RSS from 9 to 910 MiB
/// (a list of 31 million parsed values beside the body), three at once 2.07 GiB against a
/// 192 MiB budget. Now an array at the cap is stored, one past it is refused with nothing
/// written, and a 40 MiB array of 21 million zeros is refused while the server's peak RSS stays
/// within a small multiple of the body.
#[test]
fn a_json_array_past_the_message_cap_is_refused_without_a_parse_tree() -> R {
    let server = ChildServer::start(&["--max-append-messages", "1000"])?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let c = &server.client;
        let res = c
            .put(server.url("/json/cap"))
            .header("Content-Type", "application/json")
            .send()
            .await?;
        assert_eq!(res.status(), 201);
        let post = |body: Vec<u8>| {
            c.post(server.url("/json/cap"))
                .header("Content-Type", "application/json")
                .body(body)
                .send()
        };
        let res = post(zeros(1000)).await?;
        assert_eq!(res.status(), 204, "{}", res.text().await?);
        let res = post(zeros(1001)).await?;
        assert_eq!(res.status(), 413);
        let text = res.text().await?;
        assert!(text.contains("PAYLOAD_TOO_LARGE"), "{text}");
        assert!(text.contains("more than 1000 messages"), "{text}");
        let head = c.head(server.url("/json/cap")).send().await?;
        let tail = head
            .headers()
            .get("stream-next-offset")
            .and_then(|v| v.to_str().ok())
            .ok_or("no Stream-Next-Offset")?;
        assert!(
            tail.starts_with("0000000000001000_"),
            "tail {tail}: the refused append wrote"
        );

        let before = peak_rss(&server)?;
        let big = zeros(20 << 20);
        let len = big.len() as u64;
        let res = post(big).await?;
        assert_eq!(res.status(), 413);
        let peak = peak_rss(&server)?;
        assert!(
            peak < before + 4 * len,
            "a {len}-byte JSON body took the peak RSS from {before} to {peak}"
        );
        R::Ok(())
    })
}
