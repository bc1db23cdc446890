//! The seed's contract over a real socket, one test per sentence (or per tight group of
//! sentences): Stream-Seq, its 409s, producer deduplication, Stream-Incarnation, and the read
//! parameters the recipes rely on.

use crate::http_support::{R, Resp, Server};

const TEXT: (&str, &str) = ("content-type", "text/plain");

fn seq(v: &str) -> (&'static str, &str) {
    ("stream-seq", v)
}

#[track_caller]
fn accepted(r: &Resp) {
    assert!(
        matches!(r.status, 200 | 204),
        "status {}: {}",
        r.status,
        r.text()
    );
}

#[track_caller]
fn seq_conflict(r: &Resp, last: &str) {
    r.refused(409, "STREAM_SEQ_CONFLICT");
    assert_eq!(r.h("stream-last-seq"), Some(last));
}

async fn text_stream(s: &Server, path: &str) -> R<String> {
    s.create(path, "text/plain").await
}

// --- How Stream-Seq is checked --------------------------------------------------------------

/// "Each stream stores the last accepted Stream-Seq. An append that carries Stream-Seq is
/// accepted only when its value is strictly greater than the stored one, and the value is then
/// stored."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_seq_is_stored_and_must_grow_strictly() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/grow").await?;
    accepted(&s.post("/seq/grow", &[TEXT, seq("001")], "a").await?);
    accepted(&s.post("/seq/grow", &[TEXT, seq("002")], "b").await?);
    for stale in ["002", "001", "000"] {
        seq_conflict(&s.post("/seq/grow", &[TEXT, seq(stale)], "x").await?, "002");
    }
    accepted(&s.post("/seq/grow", &[TEXT, seq("003")], "c").await?);
    assert_eq!(s.read_all("/seq/grow").await?, b"abc");
    Ok(())
}

/// "The comparison is bytewise, not numeric: "10" sorts before "9"."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_seq_compares_bytewise() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/bytes").await?;
    accepted(&s.post("/seq/bytes", &[TEXT, seq("9")], "a").await?);
    seq_conflict(&s.post("/seq/bytes", &[TEXT, seq("10")], "x").await?, "9");
    accepted(&s.post("/seq/bytes", &[TEXT, seq("90")], "b").await?);
    // Zero-padded counters compare as numbers do.
    accepted(&s.post("/seq/bytes", &[TEXT, seq("91")], "c").await?);
    assert_eq!(s.read_all("/seq/bytes").await?, b"abc");
    Ok(())
}

/// "Values must be printable ASCII. A header with any other byte is ignored: the append is not
/// checked and nothing is stored."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_printable_stream_seq_is_ignored_and_not_stored() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/printable").await?;
    let p = "/seq/printable";
    let ct: (&str, &[u8]) = ("content-type", b"text/plain");
    accepted(&s.post(p, &[TEXT, seq("5")], "a").await?);
    // A tab: smaller than "5" bytewise, so it would be refused if it were checked.
    let r = s
        .send("POST", p, &[ct, ("stream-seq", b"0\t0")], "b")
        .await?;
    accepted(&r);
    // Not stored either: "6" is compared with "5", not with the ignored value.
    accepted(&s.post(p, &[TEXT, seq("6")], "c").await?);
    // A non-ASCII byte: ignored too (had it been stored, the next 409 would carry it).
    let r = s
        .send("POST", p, &[ct, ("stream-seq", b"\xff1")], "d")
        .await?;
    accepted(&r);
    seq_conflict(&s.post(p, &[TEXT, seq("6")], "x").await?, "6");
    assert_eq!(s.read_all(p).await?, b"abcd");
    Ok(())
}

/// "A value is at most 256 bytes." A longer one is refused with 400 and commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_seq_over_256_bytes_is_400_and_commits_nothing() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/long").await?;
    let p = "/seq/long";
    accepted(&s.post(p, &[TEXT, seq("5")], "a").await?);
    let tail = s.tail(p).await?;
    let long = "9".repeat(257);
    let r = s.post(p, &[TEXT, seq(&long)], "x").await?;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.h("content-type"), Some("application/problem+json"));
    assert_eq!(s.tail(p).await?, tail, "nothing committed");
    // Nothing stored: "6" is still greater than the stored value.
    accepted(&s.post(p, &[TEXT, seq("6")], "b").await?);
    // Exactly 256 bytes is a value like any other.
    accepted(&s.post(p, &[TEXT, seq(&"9".repeat(256))], "c").await?);
    seq_conflict(&s.post(p, &[TEXT, seq("7")], "x").await?, &"9".repeat(256));
    assert_eq!(s.read_all(p).await?, b"abc");
    Ok(())
}

/// "An equal or smaller value answers 409 Conflict with the error code `STREAM_SEQ_CONFLICT`,
/// and nothing from the request is committed. The 409 carries Stream-Next-Offset set to the
/// stream's current tail and Stream-Last-Seq set to the stream's last accepted Stream-Seq."
/// And: "A Stream-Seq 409 carries neither Stream-Closed nor Producer-Expected-Seq."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_seq_409_carries_the_tail_and_the_last_seq_only() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/409").await?;
    let p = "/seq/409";
    accepted(&s.post(p, &[TEXT, seq("0003")], "abc").await?);
    // Another writer moves the tail without Stream-Seq.
    accepted(&s.post(p, &[TEXT], "de").await?);
    let tail = s.tail(p).await?;
    let r = s.post(p, &[TEXT, seq("0003")], "LOST").await?;
    seq_conflict(&r, "0003");
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(r.h("stream-closed"), None);
    assert_eq!(r.h("producer-expected-seq"), None);
    // The same with producer headers on the request: still no producer header on the 409.
    let producer = [
        ("producer-id", "w"),
        ("producer-epoch", "0"),
        ("producer-seq", "0"),
    ];
    let r = s
        .post(
            p,
            &[TEXT, seq("0002"), producer[0], producer[1], producer[2]],
            "LOST",
        )
        .await?;
    seq_conflict(&r, "0003");
    assert_eq!(r.h("producer-expected-seq"), None);
    assert_eq!(r.h("stream-closed"), None);
    assert_eq!(s.tail(p).await?, tail);
    assert_eq!(s.read_all(p).await?, b"abcde");
    Ok(())
}

/// "Only a stream that accepted a Stream-Seq refuses one."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_a_stored_seq_accepts_any_value() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/fresh").await?;
    accepted(&s.post("/seq/fresh", &[TEXT], "a").await?);
    // "!" is the smallest printable value that survives header trimming.
    accepted(&s.post("/seq/fresh", &[TEXT, seq("!")], "b").await?);
    seq_conflict(&s.post("/seq/fresh", &[TEXT, seq("!")], "x").await?, "!");
    Ok(())
}

/// "The scope is the stream. A value is checked only against earlier values on the same
/// stream, whoever sent them."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_seq_scope_is_the_stream() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/scope-a").await?;
    text_stream(&s, "/seq/scope-b").await?;
    accepted(&s.post("/seq/scope-a", &[TEXT, seq("5")], "a").await?);
    accepted(&s.post("/seq/scope-b", &[TEXT, seq("1")], "b").await?);
    // Another client (its own connection) is checked against the same stored value.
    let other = reqwest::Client::new();
    let r = other
        .post(s.url("/seq/scope-a"))
        .header("content-type", "text/plain")
        .header("stream-seq", "5")
        .body("x")
        .send()
        .await?;
    let r = Resp::read(r).await?;
    seq_conflict(&r, "5");
    Ok(())
}

/// "An append without Stream-Seq is not checked and leaves the stored value unchanged."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_without_stream_seq_is_unchecked_and_changes_nothing() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/absent").await?;
    let p = "/seq/absent";
    accepted(&s.post(p, &[TEXT, seq("5")], "a").await?);
    accepted(&s.post(p, &[TEXT], "b").await?);
    accepted(&s.post(p, &[TEXT], "c").await?);
    seq_conflict(&s.post(p, &[TEXT, seq("5")], "x").await?, "5");
    accepted(&s.post(p, &[TEXT, seq("6")], "d").await?);
    assert_eq!(s.read_all(p).await?, b"abcd");
    Ok(())
}

/// "A PUT that creates the stream stores its Stream-Seq as the starting value without checking
/// it." (and so a seeding PUT can make a first commit of 0 answer 409 on every retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creating_put_seeds_stream_seq() -> R {
    let s = Server::start().await?;
    let r = s
        .put("/seq/seeded", &[TEXT, seq("00000000000000000005")], "")
        .await?;
    assert_eq!(r.status, 201, "{}", r.text());
    for _ in 0..2 {
        let r = s
            .post("/seq/seeded", &[TEXT, seq("00000000000000000000")], "x")
            .await?;
        seq_conflict(&r, "00000000000000000005");
    }
    accepted(
        &s.post("/seq/seeded", &[TEXT, seq("00000000000000000006")], "a")
            .await?,
    );
    assert_eq!(s.read_all("/seq/seeded").await?, b"a");
    Ok(())
}

/// "A PUT that finds the stream already there ignores the header."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_an_existing_stream_ignores_stream_seq() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/existing").await?;
    accepted(&s.post("/seq/existing", &[TEXT, seq("5")], "a").await?);
    let r = s.put("/seq/existing", &[TEXT, seq("9")], "").await?;
    assert_eq!(r.status, 200, "{}", r.text());
    // The stored value is still "5".
    accepted(&s.post("/seq/existing", &[TEXT, seq("6")], "b").await?);
    // And a PUT that finds a stream without a stored value does not seed one.
    text_stream(&s, "/seq/existing-2").await?;
    let r = s.put("/seq/existing-2", &[TEXT, seq("9")], "").await?;
    assert_eq!(r.status, 200);
    accepted(&s.post("/seq/existing-2", &[TEXT, seq("1")], "c").await?);
    Ok(())
}

// --- Producer deduplication runs first ------------------------------------------------------

fn producer<'a>(id: &'a str, epoch: &'a str, seq: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("producer-id", id),
        ("producer-epoch", epoch),
        ("producer-seq", seq),
    ]
}

async fn post_as(
    s: &Server,
    p: &str,
    prod: [(&'static str, &str); 3],
    stream_seq: &str,
    body: &str,
) -> R<Resp> {
    s.post(p, &[TEXT, prod[0], prod[1], prod[2], seq(stream_seq)], body)
        .await
}

/// "A retry of an append that was already accepted from the same Producer-Id, Producer-Epoch
/// and Producer-Seq is answered as a duplicate, not 409, even though its Stream-Seq is no longer
/// greater than the stored value. A repeat of the producer's newest write carries its original
/// Stream-Next-Offset, and a repeat of an older write carries none."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_duplicates_win_over_stream_seq() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/dup").await?;
    let p = "/seq/dup";
    let r0 = post_as(&s, p, producer("pub", "0", "0"), "01", "a").await?;
    assert_eq!(r0.status, 200, "{}", r0.text());
    let tail0 = r0.need("stream-next-offset")?.to_owned();
    // The retry of the newest write: a duplicate with its original tail.
    let dup = post_as(&s, p, producer("pub", "0", "0"), "01", "a").await?;
    assert_eq!(dup.status, 204, "{}", dup.text());
    assert_eq!(dup.h("stream-next-offset"), Some(tail0.as_str()));
    assert_eq!(dup.h("stream-last-seq"), None);

    let r1 = post_as(&s, p, producer("pub", "0", "1"), "02", "b").await?;
    assert_eq!(r1.status, 200);
    let tail1 = r1.need("stream-next-offset")?.to_owned();
    // Another writer moves the tail on.
    accepted(&s.post(p, &[TEXT], "c").await?);
    let dup = post_as(&s, p, producer("pub", "0", "1"), "02", "b").await?;
    assert_eq!(dup.status, 204);
    assert_eq!(
        dup.h("stream-next-offset"),
        Some(tail1.as_str()),
        "the original tail, not the current one"
    );
    let old = post_as(&s, p, producer("pub", "0", "0"), "01", "a").await?;
    assert_eq!(old.status, 204);
    assert_eq!(
        old.h("stream-next-offset"),
        None,
        "a repeat of an older write carries no offset"
    );
    assert_eq!(s.read_all(p).await?, b"abc");
    Ok(())
}

/// "An append rejected with 409 uses up no Producer-Seq."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_seq_409_uses_up_no_producer_seq() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/nouse").await?;
    let p = "/seq/nouse";
    assert_eq!(
        post_as(&s, p, producer("pub", "0", "0"), "05", "a")
            .await?
            .status,
        200
    );
    seq_conflict(
        &post_as(&s, p, producer("pub", "0", "1"), "05", "x").await?,
        "05",
    );
    // Seq 1 again is neither a duplicate nor a gap.
    let r = post_as(&s, p, producer("pub", "0", "1"), "06", "b").await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.read_all(p).await?, b"ab");
    Ok(())
}

/// "A closed stream answers 409 with Stream-Closed: true" (and no Stream-Last-Seq).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_409_carries_stream_closed() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/closed").await?;
    let p = "/seq/closed";
    accepted(&s.post(p, &[TEXT, seq("5")], "a").await?);
    accepted(&s.post(p, &[("stream-closed", "true")], "").await?);
    for v in ["4", "6"] {
        let r = s.post(p, &[TEXT, seq(v)], "x").await?;
        r.refused(409, "STREAM_CLOSED");
        assert_eq!(r.h("stream-closed"), Some("true"));
        assert_eq!(r.h("stream-last-seq"), None);
    }
    Ok(())
}

/// "An out-of-order Producer-Seq answers 409 with Producer-Expected-Seq" (and no
/// Stream-Last-Seq, even when the Stream-Seq would conflict too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_gap_409_carries_the_expected_seq() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/seq/gap").await?;
    let p = "/seq/gap";
    assert_eq!(
        post_as(&s, p, producer("pub", "0", "0"), "05", "a")
            .await?
            .status,
        200
    );
    let r = post_as(&s, p, producer("pub", "0", "2"), "05", "x").await?;
    r.refused(409, "PRODUCER_SEQ_GAP");
    assert_eq!(r.h("producer-expected-seq"), Some("1"));
    assert_eq!(r.h("stream-last-seq"), None);
    assert_eq!(s.read_all(p).await?, b"a");
    Ok(())
}

/// "A Content-Type that differs from the stream's also answers 409, with the code
/// `CONTENT_TYPE_MISMATCH` and without Stream-Last-Seq. Types are compared after normalization,
/// which keeps parameters, so application/json; charset=utf-8 is not application/json."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_type_mismatch_is_409_without_last_seq() -> R {
    let s = Server::start().await?;
    s.create("/seq/ct", "application/json").await?;
    let p = "/seq/ct";
    accepted(
        &s.post(p, &[("content-type", "application/json"), seq("1")], "[1]")
            .await?,
    );
    let r = s
        .post(
            p,
            &[
                ("content-type", "application/json; charset=utf-8"),
                seq("2"),
            ],
            "[2]",
        )
        .await?;
    r.refused(409, "CONTENT_TYPE_MISMATCH");
    assert_eq!(r.h("stream-last-seq"), None);
    // Normalization: case and spacing do not matter.
    accepted(
        &s.post(p, &[("content-type", "Application/JSON"), seq("2")], "[2]")
            .await?,
    );
    s.create("/seq/ct-param", "text/plain; charset=utf-8")
        .await?;
    accepted(
        &s.post(
            "/seq/ct-param",
            &[("content-type", "text/plain;Charset=utf-8")],
            "a",
        )
        .await?,
    );
    s.post("/seq/ct-param", &[TEXT], "b")
        .await?
        .refused(409, "CONTENT_TYPE_MISMATCH");
    assert_eq!(s.read_all(p).await?, b"[1,2]");
    Ok(())
}

// --- The recipes ----------------------------------------------------------------------------

/// The prefix-count compare-and-set, with the seed's own example: a writer that read 3 events
/// commits 2 with `Stream-Seq: 00000000000000000003`; a writer that also read 3 loses with 409
/// and Stream-Last-Seq 3, reads on, counts 5 and wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_count_commits_as_in_the_seed() -> R {
    let s = Server::start().await?;
    let p = "/demo/run-42";
    // Created without Stream-Seq, so the first commit's 0 is accepted.
    s.create(p, "application/json").await?;
    let json = ("content-type", "application/json");
    let count = |n: usize| format!("{n:020}");
    accepted(
        &s.post(
            p,
            &[json, seq(&count(0))],
            r#"[{"type":"step","n":1},{"type":"step","n":2}]"#,
        )
        .await?,
    );
    accepted(
        &s.post(p, &[json, seq(&count(2))], r#"[{"type":"step","n":3}]"#)
            .await?,
    );
    // Read to the tail with consistency=leader and count.
    let r = s
        .get(&format!("{p}?offset=-1&consistency=leader"), &[])
        .await?;
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    let n = serde_json::from_slice::<Vec<serde_json::Value>>(&r.body)?.len();
    assert_eq!(n, 3);
    let at = r.need("stream-next-offset")?.to_owned();
    // The seed's curl example.
    let r = s
        .post(
            p,
            &[json, seq("00000000000000000003")],
            r#"[{"type":"step","n":4},{"type":"step","n":5}]"#,
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    // A second writer that also read 3 events loses.
    let r = s
        .post(p, &[json, seq(&count(3))], r#"[{"type":"other"}]"#)
        .await?;
    seq_conflict(&r, &count(3));
    // It reads on from where it stopped, counts k = 2 new events, and retries with n + k.
    let r = s
        .get(&format!("{p}?offset={at}&consistency=leader"), &[])
        .await?;
    let k = serde_json::from_slice::<Vec<serde_json::Value>>(&r.body)?.len();
    assert_eq!(k, 2);
    accepted(
        &s.post(p, &[json, seq(&count(n + k))], r#"[{"type":"other"}]"#)
            .await?,
    );
    let all: Vec<serde_json::Value> = serde_json::from_slice(&s.read_all(p).await?)?;
    assert_eq!(all.len(), 6);
    Ok(())
}

/// The outbox publisher: both guards on every append; on takeover a higher epoch restarts at
/// Producer-Seq 0, skips facts answered with a 409 that carries Stream-Last-Seq, and fences the
/// old owner (403) once its first append is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_takeover_publishes_every_fact_once() -> R {
    let s = Server::start().await?;
    let p = "/outbox/orders";
    s.create(p, "application/json").await?;
    let publish = |epoch: &'static str, pseq: u64, fact: u64| {
        let s = &s;
        async move {
            let pseq = pseq.to_string();
            let number = format!("{fact:020}");
            let body = format!(r#"{{"fact":{fact}}}"#);
            let h = [
                ("content-type", "application/json"),
                ("producer-id", "orders-outbox"),
                ("producer-epoch", epoch),
                ("producer-seq", pseq.as_str()),
                ("stream-seq", number.as_str()),
            ];
            s.post(p, &h, &body).await
        }
    };
    // The old owner publishes facts 1 and 2.
    assert_eq!(publish("0", 0, 1).await?.status, 200);
    assert_eq!(publish("0", 1, 2).await?.status, 200);
    // The new owner republishes fact 2: "already published".
    let r = publish("1", 0, 2).await?;
    seq_conflict(&r, &format!("{:020}", 2));
    // Until the new owner's first accepted append, the old owner still publishes committed
    // facts, each at most once and in order.
    assert_eq!(publish("0", 2, 3).await?.status, 200);
    seq_conflict(&publish("1", 0, 3).await?, &format!("{:020}", 3));
    // The new owner goes on with the same Producer-Seq.
    assert_eq!(publish("1", 0, 4).await?.status, 200);
    // Now the old owner is fenced.
    let r = publish("0", 3, 4).await?;
    r.refused(403, "PRODUCER_EPOCH_STALE");
    assert_eq!(publish("1", 1, 5).await?.status, 200);
    let facts: Vec<serde_json::Value> = serde_json::from_slice(&s.read_all(p).await?)?;
    let numbers: Vec<u64> = facts.iter().filter_map(|f| f["fact"].as_u64()).collect();
    assert_eq!(numbers, [1, 2, 3, 4, 5]);
    Ok(())
}

// --- Read parameters --------------------------------------------------------------------------

/// The recipes read with `consistency=leader`: brook is always its own leader and accepts it
/// on every kind of read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_leader_is_accepted() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/read/leader").await?;
    accepted(&s.post("/read/leader", &[TEXT], "abc").await?);
    let r = s
        .get("/read/leader?offset=-1&consistency=leader", &[])
        .await?;
    assert_eq!((r.status, r.text().as_str()), (200, "abc"));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    let tail = r.need("stream-next-offset")?.to_owned();
    let r = s
        .get(
            &format!("/read/leader?offset={tail}&live=long-poll&consistency=leader"),
            &[],
        )
        .await?;
    assert_eq!(r.status, 204);
    assert_eq!(
        s.head("/read/leader?consistency=leader", &[]).await?.status,
        200
    );
    Ok(())
}

/// "A read shortened by `max_bytes` can stop inside a commit": `max_bytes` bounds a read, and a
/// bounded read that stops short of the tail carries no Stream-Up-To-Date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_bytes_bounds_a_read_without_up_to_date() -> R {
    let s = Server::start().await?;
    text_stream(&s, "/read/bounded").await?;
    for part in ["0123456789", "abcdefghij", "KLMNOPQRST"] {
        accepted(&s.post("/read/bounded", &[TEXT], part).await?);
    }
    let mut offset = "-1".to_owned();
    let mut all = Vec::new();
    let mut reads = 0;
    loop {
        let r = s
            .get(&format!("/read/bounded?offset={offset}&max_bytes=8"), &[])
            .await?;
        assert_eq!(r.status, 200);
        assert!(r.body.len() <= 8, "{} bytes", r.body.len());
        reads += 1;
        all.extend_from_slice(&r.body);
        offset = r.need("stream-next-offset")?.to_owned();
        if all.len() < 30 {
            assert_eq!(r.h("stream-up-to-date"), None, "stopped short of the tail");
        } else {
            assert_eq!(r.h("stream-up-to-date"), Some("true"));
            break;
        }
    }
    assert!(reads >= 4);
    assert_eq!(all, b"0123456789abcdefghijKLMNOPQRST");
    // On a JSON stream a bounded read ends on a message boundary, still without Up-To-Date.
    s.create("/read/bounded-json", "application/json").await?;
    accepted(
        &s.post(
            "/read/bounded-json",
            &[("content-type", "application/json")],
            r#"[{"a":1},{"b":2},{"c":3}]"#,
        )
        .await?,
    );
    let r = s
        .get("/read/bounded-json?offset=-1&max_bytes=8", &[])
        .await?;
    assert_eq!(r.text(), r#"[{"a":1}]"#);
    assert_eq!(r.h("stream-up-to-date"), None);
    Ok(())
}
