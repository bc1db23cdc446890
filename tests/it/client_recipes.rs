//! The seed's recipes through `brook::client`, over a real socket to brook's router served in
//! this process: the prefix-count race, outbox takeover and fencing, incarnation tracking, lost
//! responses, and the client's plain operations.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use brook::client::{
    Append, Client, Create, Error, Outbox, Position, PrefixCount, Published, Read, SseEvent,
    TailData, stream_seq,
};
use brook::http::{ServerConfig, serve};
use brook::{Options, Store};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// brook's router on `127.0.0.1:0` over a temporary data directory.
struct Server {
    base: String,
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    store: Store,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> R<Server> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), Options::default())?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let config = ServerConfig {
            long_poll_timeout: Duration::from_millis(300),
            sse_max_duration: Duration::from_millis(700),
            ..ServerConfig::default()
        };
        let task = tokio::spawn(serve(listener, store.clone(), config, async move {
            let _ = stopped.await;
        }));
        Ok(Server {
            base: format!("http://{addr}"),
            addr,
            stop: Some(stop),
            task: Some(task),
            store,
            _dir: dir,
        })
    }

    fn client(&self) -> R<Client> {
        Ok(Client::new(&self.base)?)
    }

    async fn stop(mut self) -> R {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await??;
        }
        self.store.shutdown()?;
        Ok(())
    }
}

/// A TCP proxy in front of a server that can swallow responses: while `drop` is above zero, the
/// next response's connection is closed as soon as the server starts answering, so the request
/// was applied and the client never learns it.
struct LossyProxy {
    base: String,
    drop: Arc<AtomicU32>,
}

impl LossyProxy {
    async fn start(upstream: std::net::SocketAddr) -> R<LossyProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let drop = Arc::new(AtomicU32::new(0));
        let d = drop.clone();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let d = d.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut down_r, mut down_w) = down.split();
                    let (mut up_r, mut up_w) = up.split();
                    let to_server = async {
                        let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
                        let _ = up_w.shutdown().await;
                    };
                    let to_client = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match up_r.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let swallow = d
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |x| {
                                    x.checked_sub(1)
                                })
                                .is_ok();
                            if swallow || down_w.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = down_w.shutdown().await;
                    };
                    // Either direction ending ends the connection.
                    tokio::select! {
                        () = to_server => {}
                        () = to_client => {}
                    }
                });
            }
        });
        Ok(LossyProxy { base, drop })
    }

    fn lose_next_response(&self) {
        self.drop.store(1, Ordering::SeqCst);
    }
}

/// The op ids of a prefix-count log, one entry per commit in log order, each with its events;
/// an error when the log is not a serial history (a commit whose events do not all record the
/// count before the commit, or a commit split in two).
fn commits_of(log: &[Value]) -> Result<Vec<(String, Vec<Value>)>, String> {
    let mut commits: Vec<(String, Vec<Value>)> = Vec::new();
    for (i, e) in log.iter().enumerate() {
        let op = e["op_id"]
            .as_str()
            .ok_or(format!("event {i} has no op_id"))?
            .to_owned();
        match commits.last_mut() {
            Some((last, events)) if *last == op => events.push(e.clone()),
            _ => {
                if e["seen"].as_u64() != Some(i as u64) {
                    return Err(format!("commit {op} at {i} says it saw {}", e["seen"]));
                }
                commits.push((op, vec![e.clone()]));
            }
        }
    }
    for (op, events) in &commits {
        let seen = &events[0]["seen"];
        if events.iter().any(|e| &e["seen"] != seen) {
            return Err(format!("commit {op} mixes counts"));
        }
        if events.len() as u64 != events[0]["size"].as_u64().unwrap_or(0) {
            return Err(format!(
                "commit {op} has {} events, not {}",
                events.len(),
                events[0]["size"]
            ));
        }
    }
    Ok(commits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_count_race_of_eight_writers_is_a_serial_history() -> R {
    const WRITERS: u64 = 8;
    const COMMITS: u64 = 5;
    let server = Server::start().await?;
    let client = server.client()?;
    PrefixCount::create(client.stream("race/log")).await?;

    let start = Arc::new(tokio::sync::Barrier::new(WRITERS as usize));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let handle = client.stream("race/log");
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let mut writer = PrefixCount::open(handle).await?;
            start.wait().await;
            let mut results = Vec::new();
            for c in 0..COMMITS {
                let size = 1 + (w + c) % 3;
                let op = format!("w{w}-c{c}");
                let commit = writer
                    .commit(&op, |n, events| {
                        // Validate against everything read: the log so far is a serial history.
                        commits_of(events)?;
                        if n != events.len() as u64 {
                            return Err(format!("count {n} is not the {} events read", events.len()));
                        }
                        Ok::<_, String>(
                            (0..size)
                                .map(|i| json!({"writer": w, "commit": c, "i": i, "seen": n, "size": size}))
                                .collect(),
                        )
                    })
                    .await?;
                assert_eq!(commit.events, size);
                assert!(!commit.recovered);
                results.push((op, commit));
            }
            Ok::<_, Error>(results)
        }));
    }
    let mut acknowledged = HashMap::new();
    let mut attempts = 0;
    for t in tasks {
        for (op, commit) in t.await?? {
            attempts += commit.attempts;
            acknowledged.insert(op, commit);
        }
    }
    assert!(
        attempts > (WRITERS * COMMITS) as u32,
        "the writers never raced ({attempts} appends for {} commits)",
        WRITERS * COMMITS
    );

    let log = client
        .stream("race/log")
        .read_to_tail(&Read::default())
        .await?;
    let commits = commits_of(log.messages())?;
    assert_eq!(
        commits.len() as u64,
        WRITERS * COMMITS,
        "every commit exactly once"
    );
    let mut seen = HashSet::new();
    let mut count = 0u64;
    for (op, events) in &commits {
        assert!(seen.insert(op.clone()), "commit {op} twice");
        // The count each writer was acknowledged with is where its commit sits.
        assert_eq!(acknowledged[op].count, count, "commit {op}");
        count += events.len() as u64;
    }
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_count_refuses_empty_commits_bounded_counts_and_a_seeded_stream() -> R {
    let server = Server::start().await?;
    let client = server.client()?;
    let mut writer = PrefixCount::create(client.stream("pc/rules")).await?;
    // Never an empty commit.
    let e = writer.commit("empty", |_, _| Ok::<_, String>(vec![])).await;
    assert!(matches!(e, Err(Error::EmptyCommit)), "{e:?}");
    // A refusal from the validation is the caller's.
    let e = writer
        .commit("no", |_, _| Err::<Vec<Value>, _>("not today"))
        .await;
    assert!(
        matches!(&e, Err(Error::Rejected(r)) if r.to_string() == "not today"),
        "{e:?}"
    );
    // The first commit on a new stream sends 0.
    let c = writer
        .commit("a", |_, _| {
            Ok::<_, String>(vec![json!({"n": 1}), json!({"n": 2})])
        })
        .await?;
    assert_eq!((c.count, c.events, c.attempts), (0, 2, 1));
    assert_eq!(writer.catch_up().await?, 2);
    // Paged reads (max_bytes) still count to the tail.
    let paged = PrefixCount::open(client.stream("pc/rules"))
        .await?
        .page_bytes(8);
    assert_eq!(paged.count(), 2);
    let mut paged = paged;
    let c = paged
        .commit("b", |n, _| Ok::<_, String>(vec![json!({"n": n})]))
        .await?;
    assert_eq!(c.count, 2);
    // The first writer's count is stale: its append answers 409, it reads on, validates the
    // longer log and retries with n + k.
    let mut saw = Vec::new();
    let c = writer
        .commit("c", |n, events| {
            saw.push((n, events.len()));
            Ok::<_, String>(vec![json!({"n": n})])
        })
        .await?;
    assert_eq!(saw, vec![(2, 2), (3, 3)]);
    assert_eq!((c.count, c.attempts), (3, 2));
    // Committing the same operation again finds it in the log instead of appending it twice.
    let again = writer
        .commit("c", |_, _| Ok::<_, String>(vec![json!({})]))
        .await?;
    assert!(
        again.recovered && again.count == 3 && again.attempts == 0,
        "{again:?}"
    );
    let log = client
        .stream("pc/rules")
        .read_to_tail(&Read::default())
        .await?;
    assert_eq!(log.messages().len(), 4);

    // A stream created with Stream-Seq stores a value the honest count never beats.
    let seeded = client.stream("pc/seeded");
    seeded
        .create(&Create::json().stream_seq(stream_seq(5)))
        .await?;
    let mut writer = PrefixCount::open(seeded).await?;
    let e = writer
        .commit("x", |_, _| Ok::<_, String>(vec![json!({})]))
        .await;
    assert!(
        matches!(&e, Err(Error::StreamSeqAhead { last_seq, .. }) if *last_seq == stream_seq(5)),
        "{e:?}"
    );
    // The recipe needs a JSON stream.
    let bytes = client.stream("pc/bytes");
    bytes.create(&Create::new("text/plain")).await?;
    let e = PrefixCount::open(bytes).await;
    assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_count_resolves_a_lost_response_by_its_operation_id() -> R {
    let server = Server::start().await?;
    let proxy = LossyProxy::start(server.addr).await?;
    let client = Client::new(&proxy.base)?;
    let mut writer = PrefixCount::create(client.stream("pc/lost")).await?;
    writer
        .commit("first", |_, _| Ok::<_, String>(vec![json!({"v": 1})]))
        .await?;
    // Read past the own commit now, so the next request the commit sends is its append.
    assert_eq!(writer.catch_up().await?, 1);

    proxy.lose_next_response();
    let mut builds = 0;
    let c = writer
        .commit("second", |_, _| {
            builds += 1;
            Ok::<_, String>(vec![json!({"v": 2}), json!({"v": 3})])
        })
        .await?;
    // The append went through, its response was lost; the writer read the new events, found
    // its operation id and did not append again.
    assert_eq!(builds, 1);
    assert!(
        c.recovered && c.count == 1 && c.events == 2 && c.attempts == 1,
        "{c:?}"
    );
    let log = client
        .stream("pc/lost")
        .read_to_tail(&Read::default())
        .await?;
    let ops: Vec<_> = log
        .messages()
        .iter()
        .map(|e| e["op_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ops, ["first", "second", "second"]);
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_takeover_publishes_every_fact_once_in_order_and_fences_the_old_owner() -> R {
    let server = Server::start().await?;
    let client = server.client()?;
    let stream = client.stream("outbox/orders");
    stream.create(&Create::json()).await?;
    let fact = |n: u64| json!({"fact": n});

    // The old owner publishes facts 0..5.
    let mut old = Outbox::new(
        client.stream("outbox/orders"),
        "orders-db",
        0,
        "application/json",
    );
    for n in 0..5 {
        assert!(matches!(
            old.publish_json(n, &fact(n)).await?,
            Published::Appended { .. }
        ));
    }
    assert_eq!(old.producer_seq(), 5);

    // The new owner takes over with a higher epoch, Producer-Seq from 0, and republishes from
    // fact 3: the Stream-Seq 409 (with Stream-Last-Seq) means "already published".
    let mut new = Outbox::take_over(
        client.stream("outbox/orders"),
        "orders-db",
        0,
        "application/json",
    );
    assert_eq!((new.epoch(), new.producer_seq()), (1, 0));
    let p = new.publish_json(3, &fact(3)).await?;
    assert_eq!(
        p,
        Published::AlreadyPublished {
            last_seq: stream_seq(4),
            last_commit: Some(4)
        }
    );
    assert_eq!(new.producer_seq(), 0, "a 409 uses up no Producer-Seq");

    // Until the new owner's first append is accepted, the old owner may still publish a fact
    // that committed; the stream accepts it once.
    assert!(matches!(
        old.publish_json(5, &fact(5)).await?,
        Published::Appended { .. }
    ));

    // The new owner goes on with the same Producer-Seq: fact 4 and 5 are already there, 6.. are
    // appended (the first accepted append registers epoch 1).
    let summary = new
        .publish_all((4..10).map(|n| (n, format!("[{}]", fact(n)))))
        .await?;
    assert_eq!(
        (
            summary.appended,
            summary.already_published,
            summary.duplicates
        ),
        (4, 2, 0)
    );
    assert_eq!(new.producer_seq(), 4);

    // Now the old epoch is fenced: 403, whatever it sends.
    let e = old.publish_json(6, &fact(6)).await;
    assert!(
        matches!(e, Err(Error::ProducerEpochStale { current: 1 })),
        "{e:?}"
    );
    let e = old.publish_json(10, &fact(10)).await;
    assert!(
        matches!(e, Err(Error::ProducerEpochStale { current: 1 })),
        "{e:?}"
    );

    let log = stream.read_to_tail(&Read::default()).await?;
    let facts: Vec<u64> = log
        .messages()
        .iter()
        .filter_map(|m| m["fact"].as_u64())
        .collect();
    assert_eq!(
        facts,
        (0..10).collect::<Vec<_>>(),
        "every fact once, in order"
    );
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_never_skips_on_another_409_and_retries_a_lost_append_as_a_duplicate() -> R {
    let server = Server::start().await?;
    let proxy = LossyProxy::start(server.addr).await?;
    let client = Client::new(&proxy.base)?;
    let stream = client.stream("outbox/other-409");
    stream.create(&Create::json()).await?;
    let mut out = Outbox::new(
        client.stream("outbox/other-409"),
        "p",
        0,
        "application/json",
    );
    out.publish_json(0, &json!({"fact": 0})).await?;

    // A lost response: the retry with the same producer tuple is a duplicate.
    proxy.lose_next_response();
    let e = out.publish_json(1, &json!({"fact": 1})).await;
    assert!(matches!(&e, Err(e) if e.outcome_unknown()), "{e:?}");
    assert_eq!(out.in_flight(), Some(1));
    let e = out.publish_json(2, &json!({"fact": 2})).await;
    assert!(
        matches!(e, Err(Error::InvalidArgument(_))),
        "another fact before the retry: {e:?}"
    );
    assert_eq!(
        out.publish_json(1, &json!({"fact": 1})).await?,
        Published::Duplicate
    );
    assert_eq!(out.producer_seq(), 2);

    // A content-type mismatch is a 409 without Stream-Last-Seq: an error, never "published".
    let mut wrong = Outbox::new(client.stream("outbox/other-409"), "q", 0, "text/plain");
    let e = wrong.publish(2, "x").await;
    assert!(matches!(e, Err(Error::ContentTypeMismatch { .. })), "{e:?}");
    // So is a closed stream.
    stream.append(&Append::close_only()).await?;
    let e = out.publish_json(2, &json!({"fact": 2})).await;
    assert!(matches!(e, Err(Error::StreamClosed { .. })), "{e:?}");
    // Publishing out of commit order is refused by the publisher itself.
    let e = out.publish_json(1, &json!({"fact": 1})).await;
    assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");

    let log = stream.read_to_tail(&Read::default()).await?;
    assert_eq!(log.messages(), [json!({"fact": 0}), json!({"fact": 1})]);
    assert!(log.closed);
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incarnation_tracking_turns_a_recreated_stream_into_incarnation_changed() -> R {
    let server = Server::start().await?;
    let client = server.client()?;
    let mine = client.stream("inc/doc");
    let created = mine.create(&Create::json()).await?;
    let first = created
        .incarnation
        .clone()
        .ok_or("no Stream-Incarnation on a 201")?;
    assert_eq!(mine.incarnation(), Some(first.clone()));
    mine.append(&Append::json(&json!([{"v": 1}, {"v": 1.5}])))
        .await?;
    let old_tail = mine.read_to_tail(&Read::default()).await?.next;

    // Someone else deletes and recreates the stream at the same URL.
    let other = client.stream("inc/doc");
    other.delete().await?;
    let recreated = other.create(&Create::json()).await?;
    let second = recreated
        .incarnation
        .ok_or("no Stream-Incarnation on a 201")?;
    assert_ne!(first, second);
    // A read at the old tail, beyond the new stream's, answers 416 even with the header (the
    // seed); the handle asks HEAD with its token and reports the recreation.
    let e = mine.read(&Read::from(old_tail.clone())).await;
    assert!(
        matches!(&e, Err(Error::IncarnationChanged { current: Some(c) }) if *c == second),
        "{e:?}"
    );
    let e = client.stream("inc/doc").read(&Read::from(old_tail)).await;
    assert!(
        matches!(&e, Err(Error::Http { status: 416, .. })),
        "an untracked handle sees the 416: {e:?}"
    );

    // Every kind of request on the old handle answers IncarnationChanged with the new token,
    // and applies nothing.
    let e = mine.append(&Append::json(&json!([{"v": 2}]))).await;
    assert!(
        matches!(&e, Err(Error::IncarnationChanged { current: Some(c) }) if *c == second),
        "{e:?}"
    );
    let e = mine.read(&Read::default()).await;
    assert!(
        matches!(&e, Err(Error::IncarnationChanged { current: Some(c) }) if *c == second),
        "{e:?}"
    );
    let e = mine.long_poll(&Read::from(Position::start()), None).await;
    assert!(matches!(&e, Err(Error::IncarnationChanged { .. })), "{e:?}");
    let e = mine.head().await;
    assert!(matches!(&e, Err(Error::IncarnationChanged { .. })), "{e:?}");
    let e = mine.sse(Position::start()).next().await;
    assert!(
        matches!(&e, Some(Err(Error::IncarnationChanged { .. }))),
        "{e:?}"
    );
    let e = mine.delete().await;
    assert!(matches!(&e, Err(Error::IncarnationChanged { .. })), "{e:?}");
    let e = mine.create(&Create::json()).await;
    assert!(matches!(&e, Err(Error::IncarnationChanged { .. })), "{e:?}");
    let e = PrefixCount::open(mine.clone()).await;
    assert!(matches!(&e, Err(Error::IncarnationChanged { .. })), "{e:?}");
    let mut out = Outbox::new(mine.clone(), "p", 0, "application/json");
    let e = out.publish_json(0, &json!({})).await;
    assert!(matches!(&e, Err(Error::IncarnationChanged { .. })), "{e:?}");
    // The handle keeps the old token until the caller starts over on the new stream.
    assert_eq!(mine.incarnation(), Some(first));
    assert!(
        other
            .head()
            .await?
            .next
            .to_offset()
            .is_some_and(|o| o.messages == 0)
    );

    mine.accept_incarnation(second.clone());
    mine.append(&Append::json(&json!([{"v": 3}]))).await?;
    let log = mine.read_to_tail(&Read::default()).await?;
    assert_eq!(log.messages(), [json!({"v": 3})]);
    assert_eq!(log.incarnation, Some(second.clone()));

    // Deleted and not recreated: a 404 stays a 404 with the header; a PUT with the header
    // answers 412 without a token and creates nothing.
    other.delete().await?;
    let e = mine.read(&Read::default()).await;
    assert!(matches!(e, Err(Error::NotFound)), "{e:?}");
    let e = mine.create(&Create::json()).await;
    assert!(
        matches!(e, Err(Error::IncarnationChanged { current: None })),
        "{e:?}"
    );
    assert!(matches!(other.head().await, Err(Error::NotFound)));
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_operations_reads_tails_and_errors() -> R {
    let server = Server::start().await?;
    let client = server.client()?;
    let s = client.stream("/plain/json");
    let c = s
        .create(&Create::json().ttl(3600).data(r#"[{"n":0}]"#))
        .await?;
    assert!(c.created);
    assert!(
        !s.create(&Create::json().ttl(3600)).await?.created,
        "an idempotent PUT is 200"
    );
    let info = s.head().await?;
    assert_eq!(info.ttl, Some(3600));
    assert_eq!(info.content_type.as_deref(), Some("application/json"));

    for n in 1..20 {
        s.append(&Append::json(&json!([{"n": n, "pad": "xxxxxxxxxxxxxxxx"}])))
            .await?;
    }
    // A bounded read stops short of the tail without Stream-Up-To-Date; read_to_tail pages on
    // and flattens the arrays.
    let page = s
        .read(&Read::from(Position::start()).max_bytes(64).leader())
        .await?;
    assert!(!page.up_to_date && !page.messages()?.is_empty());
    let all = s.read_to_tail(&Read::default().max_bytes(64)).await?;
    let ns: Vec<u64> = all
        .messages()
        .iter()
        .filter_map(|m| m["n"].as_u64())
        .collect();
    assert_eq!(ns, (0..20).collect::<Vec<_>>());
    let tail = s.read_to_tail(&Read::from(all.next.clone())).await?;
    assert!(tail.messages().is_empty() && tail.next == all.next);

    // Long-poll tail: new data arrives, then the close ends the stream of chunks.
    let mut tail = Box::pin(s.tail(all.next.clone()));
    let writer = s.clone();
    let feeder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.append(&Append::json(&json!({"n": 20}))).await?;
        writer
            .append(&Append::json(&json!({"n": 21})).close())
            .await
    });
    let mut live = Vec::new();
    while let Some(chunk) = tail.next().await {
        live.extend(chunk?.messages()?);
    }
    feeder.await??;
    assert_eq!(live, [json!({"n": 20}), json!({"n": 21})]);

    // SSE from the start: every message once, then the closing control event.
    let mut events = Box::pin(s.sse(Position::start()));
    let mut sse_messages = Vec::new();
    let mut closed = false;
    while let Some(ev) = events.next().await {
        match ev? {
            SseEvent::Data(d) => sse_messages.extend(serde_json::from_slice::<Vec<Value>>(&d)?),
            SseEvent::Control(c) => closed = c.closed,
        }
    }
    assert!(closed);
    assert_eq!(sse_messages.len(), 22);

    // SSE on a byte stream across the server's connection lifetime: the client reconnects from
    // the last control event and loses or repeats nothing.
    let b = client.stream("plain/bytes");
    b.create(&Create::new("application/octet-stream")).await?;
    let mut events = Box::pin(b.sse(Position::start()));
    let writer = b.clone();
    let feeder = tokio::spawn(async move {
        for i in 0u8..6 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            writer
                .append(&Append::new("application/octet-stream", vec![i, 0xff]))
                .await?;
        }
        writer.append(&Append::close_only()).await
    });
    let mut got = Vec::new();
    while let Some(ev) = events.next().await {
        if let SseEvent::Data(d) = ev? {
            got.extend_from_slice(&d);
        }
    }
    feeder.await??;
    assert_eq!(got, (0u8..6).flat_map(|i| [i, 0xff]).collect::<Vec<_>>());
    let bytes = b.read_to_tail(&Read::default()).await?;
    assert!(matches!(&bytes.data, TailData::Bytes(v) if *v == got) && bytes.closed);

    // Errors carry what the caller needs.
    let e = s.append(&Append::json(&json!({}))).await;
    assert!(
        matches!(e, Err(Error::StreamClosed { tail: Some(_) })),
        "{e:?}"
    );
    let e = client.stream("plain/missing").read(&Read::default()).await;
    assert!(matches!(e, Err(Error::NotFound)), "{e:?}");
    let t = client.stream("plain/text");
    t.create(&Create::new("text/plain")).await?;
    let e = t
        .append(&Append::new("text/plain; charset=utf-8", "x"))
        .await;
    assert!(matches!(e, Err(Error::ContentTypeMismatch { .. })), "{e:?}");
    t.append(&Append::new("text/plain", "a").producer("p", 0, 0))
        .await?;
    let e = t
        .append(&Append::new("text/plain", "c").producer("p", 0, 2))
        .await;
    assert!(
        matches!(
            e,
            Err(Error::ProducerSeqGap {
                expected: 1,
                received: Some(2)
            })
        ),
        "{e:?}"
    );
    let dup = t
        .append(&Append::new("text/plain", "a").producer("p", 0, 0))
        .await?;
    assert!(dup.duplicate && dup.next.is_some(), "{dup:?}");
    let e = t
        .append(&Append::new("text/plain", "x").stream_seq("caf\u{e9}"))
        .await;
    assert!(
        matches!(e, Err(Error::InvalidArgument(_))),
        "a Stream-Seq the server would ignore: {e:?}"
    );
    t.append(&Append::new("text/plain", "b").stream_seq(stream_seq(7)))
        .await?;
    let e = t
        .append(&Append::new("text/plain", "x").stream_seq(stream_seq(7)))
        .await;
    assert!(
        matches!(&e, Err(Error::StreamSeqConflict { last_seq, tail: Some(_) }) if *last_seq == stream_seq(7)),
        "{e:?}"
    );
    server.stop().await
}
