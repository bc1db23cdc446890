//! `brook mirror` between real servers: brook to a second brook, and brook to the Node reference
//! server (`conformance/reference-server.mjs`), with the mirror process killed (SIGKILL) in the
//! middle of the copy and started again; then every byte, every message boundary and the
//! metadata are compared.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::http_support::{R, Server};
use super::util::Rng;

/// Byte messages in the killed-and-resumed stream.
const BYTE_MESSAGES: usize = 400;

/// The zero offset.
const ZERO: &str = "0000000000000000_0000000000000000";

/// A child process killed (SIGKILL) and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `brook mirror` from `source` to `dest`, the names in `list`, progress in `state`.
fn mirror(source: &str, dest: &str, list: &Path, state: &Path, extra: &[&str]) -> R<Child> {
    Ok(Command::new(env!("CARGO_BIN_EXE_brook"))
        .arg("mirror")
        .arg(source)
        .arg(dest)
        .arg("--streams")
        .arg(list)
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?)
}

/// The byte position of the destination stream's tail (0 while it does not exist).
async fn dest_bytes(client: &reqwest::Client, url: &str) -> R<u64> {
    let r = client.head(url).send().await?;
    if r.status() != 200 {
        return Ok(0);
    }
    let tail = r.headers()["stream-next-offset"].to_str()?;
    Ok(tail.rsplit('_').next().unwrap_or("0").parse()?)
}

/// Starts the mirror, SIGKILLs it once the destination byte stream at `watch` holds more than
/// each of `kill_at` bytes, and finally lets a last run finish (it must exit 0).
async fn mirror_with_kills(
    source: &str,
    dest: &str,
    list: &Path,
    state: &Path,
    watch: &str,
    kill_at: &[u64],
) -> R {
    let client = reqwest::Client::new();
    for &at in kill_at {
        let mut child = Killed(mirror(source, dest, list, state, &[])?);
        let mut killed = false;
        for _ in 0..2000 {
            if dest_bytes(&client, watch).await? > at {
                child.0.kill()?;
                child.0.wait()?;
                killed = true;
                break;
            }
            if let Some(status) = child.0.try_wait()? {
                return Err(format!("the mirror ended ({status}) before it was killed").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(killed, "the copy reached {at} bytes");
    }
    let status = finish(mirror(source, dest, list, state, &[])?).await?;
    assert!(status.success(), "the resumed mirror failed: {status}");
    Ok(())
}

/// Waits for the mirror to end by itself (up to 60 s) without blocking the runtime that serves
/// the in-process servers it talks to.
async fn finish(child: Child) -> R<std::process::ExitStatus> {
    let mut child = Killed(child);
    for _ in 0..1200 {
        if let Some(status) = child.0.try_wait()? {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the mirror did not finish in 60 s".into())
}

/// The source streams: a byte stream of [`BYTE_MESSAGES`] messages of 1-200 bytes with a TTL,
/// a closed JSON stream with a snapshot in the middle and an `Expires-At`, and a closed text
/// stream. Returns the byte messages.
async fn fill_source(s: &Server, rng: &mut Rng) -> R<Vec<Vec<u8>>> {
    let r = s
        .put(
            "/m/bytes",
            &[
                ("content-type", "application/octet-stream"),
                ("stream-ttl", "3600"),
            ],
            "",
        )
        .await?;
    assert_eq!(r.status, 201);
    let mut messages = Vec::new();
    for _ in 0..BYTE_MESSAGES {
        let len = 1 + rng.below(200) as usize;
        let m: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let r = s
            .send(
                "POST",
                "/m/bytes",
                &[("content-type", b"application/octet-stream")],
                m.clone(),
            )
            .await?;
        assert!((200..300).contains(&r.status));
        messages.push(m);
    }
    let r = s
        .put(
            "/m/json",
            &[
                ("content-type", "application/json"),
                ("stream-expires-at", "2099-01-01T00:00:00Z"),
            ],
            "",
        )
        .await?;
    assert_eq!(r.status, 201);
    let mut snapshot_at = String::new();
    for batch in 0..20 {
        let items: Vec<String> = (0..5)
            .map(|i| format!(r#"{{"batch":{batch},"i":{i}}}"#))
            .collect();
        let r = s
            .post(
                "/m/json",
                &[("content-type", "application/json")],
                &format!("[{}]", items.join(",")),
            )
            .await?;
        assert!((200..300).contains(&r.status));
        if batch == 9 {
            r.need("stream-next-offset")?.clone_into(&mut snapshot_at);
        }
    }
    let r = s
        .send(
            "PUT",
            &format!("/m/json/snapshot/{snapshot_at}"),
            &[("content-type", b"application/json")],
            r#"{"state":"half"}"#,
        )
        .await?;
    assert!(
        (200..300).contains(&r.status),
        "snapshot: {} {}",
        r.status,
        r.text()
    );
    s.post("/m/json", &[("stream-closed", "true")], "").await?;
    s.put("/m/text", &[("content-type", "text/plain")], "hello ")
        .await?;
    s.post("/m/text", &[("content-type", "text/plain")], "world")
        .await?;
    s.post("/m/text", &[("stream-closed", "true")], "").await?;
    Ok(messages)
}

/// The messages of a byte stream on brook, one read each (`boundary=message`).
async fn brook_messages(s: &Server, path: &str) -> R<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut offset = ZERO.to_owned();
    loop {
        let r = s
            .get(
                &format!("{path}?boundary=message&max_bytes=1&offset={offset}"),
                &[],
            )
            .await?;
        assert_eq!(r.status, 200);
        if !r.body.is_empty() {
            out.push(r.body.to_vec());
        }
        if r.h("stream-up-to-date").is_some() {
            return Ok(out);
        }
        r.need("stream-next-offset")?.clone_into(&mut offset);
    }
}

/// Brook to brook, killed twice mid-copy: the destination holds the same messages at the same
/// offsets (so every boundary), the same content types, TTL, Expires-At, closure and snapshot.
#[tokio::test]
async fn mirror_to_brook_survives_kill_and_copies_everything() -> R {
    let src = Server::start().await?;
    let dst = Server::start().await?;
    let mut rng = Rng::from_env("mirror_to_brook");
    let messages = fill_source(&src, &mut rng).await?;
    let dir = tempfile::tempdir()?;
    let list = dir.path().join("streams.txt");
    std::fs::write(&list, "m/bytes\n/m/json\n# a comment\nm/text\n")?;
    let state = dir.path().join("state");
    mirror_with_kills(
        &src.base,
        &dst.base,
        &list,
        &state,
        &dst.url("/m/bytes"),
        &[2000, 12_000],
    )
    .await?;

    assert_eq!(
        brook_messages(&dst, "/m/bytes").await?,
        messages,
        "every message, whole"
    );
    for path in ["/m/bytes", "/m/json", "/m/text"] {
        let a = src.head(path, &[]).await?;
        let b = dst.head(path, &[]).await?;
        for h in [
            "content-type",
            "stream-next-offset",
            "stream-closed",
            "stream-ttl",
            "stream-expires-at",
            "stream-snapshot-offset",
            "stream-snapshot-digest",
        ] {
            assert_eq!(a.h(h), b.h(h), "{path}: {h}");
        }
        let a = src.get(&format!("{path}?offset={ZERO}"), &[]).await?;
        let b = dst.get(&format!("{path}?offset={ZERO}"), &[]).await?;
        assert!(a.body == b.body, "{path}: the same bytes");
    }
    let json = dst.get(&format!("/m/json?offset={ZERO}"), &[]).await?;
    let items: Vec<serde_json::Value> = serde_json::from_slice(&json.body)?;
    assert_eq!(items.len(), 100, "every JSON message once");
    let snap = dst.head("/m/json", &[]).await?;
    let at = snap.need("stream-snapshot-offset")?;
    let blob = dst.get(&format!("/m/json/snapshot/{at}"), &[]).await?;
    assert_eq!(blob.text(), r#"{"state":"half"}"#);
    assert_eq!(
        dst.head("/m/text", &[]).await?.h("stream-closed"),
        Some("true")
    );

    // A mirror started again finds everything done and writes nothing.
    let tail = dst
        .head("/m/bytes", &[])
        .await?
        .need("stream-next-offset")?
        .to_owned();
    let status = finish(mirror(&src.base, &dst.base, &list, &state, &[])?).await?;
    assert!(status.success());
    assert_eq!(
        dst.head("/m/bytes", &[])
            .await?
            .need("stream-next-offset")?,
        tail
    );
    Ok(())
}

/// With `--follow`, appends made after the copy caught up reach the destination, and so does a
/// closure, which ends the mirror.
#[tokio::test]
async fn mirror_follows_new_appends_until_closed() -> R {
    let src = Server::start().await?;
    let dst = Server::start().await?;
    src.put("/f/live", &[("content-type", "text/plain")], "a")
        .await?;
    let dir = tempfile::tempdir()?;
    let list = dir.path().join("streams.txt");
    std::fs::write(&list, "f/live\n")?;
    let mut child = Killed(mirror(
        &src.base,
        &dst.base,
        &list,
        &dir.path().join("state"),
        &["--follow", "--poll-ms", "300"],
    )?);
    for part in ["b", "c", "d"] {
        src.post("/f/live", &[("content-type", "text/plain")], part)
            .await?;
    }
    src.post("/f/live", &[("stream-closed", "true")], "")
        .await?;
    for _ in 0..400 {
        if let Some(status) = child.0.try_wait()? {
            assert!(status.success(), "{status}");
            let r = dst.get(&format!("/f/live?offset={ZERO}"), &[]).await?;
            assert_eq!(r.text(), "abcd");
            assert_eq!(r.h("stream-closed"), Some("true"));
            assert_eq!(brook_messages(&dst, "/f/live").await?.len(), 4);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the following mirror did not end after the closure".into())
}

/// The Node reference server, on a free port, killed when dropped.
struct NodeServer {
    base: String,
    _child: Killed,
}

impl NodeServer {
    async fn start() -> R<Option<NodeServer>> {
        if std::env::var_os("SKIP_NODE").is_some() {
            eprintln!("mirror: the Node reference server test is skipped (SKIP_NODE is set)");
            return Ok(None);
        }
        let conformance = concat!(env!("CARGO_MANIFEST_DIR"), "/conformance");
        let node = Command::new("node").arg("--version").output().is_ok();
        let modules = Path::new(conformance).join("node_modules/@durable-streams/server");
        if !node || !modules.exists() {
            let what = if node {
                "conformance/node_modules is not installed (scripts/node-deps installs it)"
            } else {
                "node not found (scripts/test needs it for the conformance suite too)"
            };
            crate::util::missing_prerequisite("mirror::mirror_to_node_reference", what)?;
            return Ok(None);
        }
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conformance/reference-server.mjs"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut child = Killed(
            Command::new("node")
                .arg(script)
                .args(["--port", &port.to_string(), "--long-poll-timeout-ms", "500"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("node (SKIP_NODE=1 skips this test): {e}"))?,
        );
        for _ in 0..200 {
            if let Some(status) = child.0.try_wait()? {
                return Err(format!("the Node reference server exited with {status}").into());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(Some(NodeServer {
                    base: format!("http://127.0.0.1:{port}"),
                    _child: child,
                }));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the Node reference server did not start".into())
    }
}

/// Brook to the Node reference server, killed mid-copy: the same bytes, the same JSON messages,
/// content types, TTL and closure (the Node server has no snapshots: the mirror goes on
/// without).
#[tokio::test]
async fn mirror_to_node_reference_survives_kill() -> R {
    let Some(node) = NodeServer::start().await? else {
        return Ok(());
    };
    let src = Server::start().await?;
    let mut rng = Rng::from_env("mirror_to_node");
    let messages = fill_source(&src, &mut rng).await?;
    let dir = tempfile::tempdir()?;
    let list = dir.path().join("streams.txt");
    std::fs::write(&list, "m/bytes\nm/json\nm/text\n")?;
    let state = dir.path().join("state");
    let watch = format!("{}/m/bytes", node.base);
    mirror_with_kills(&src.base, &node.base, &list, &state, &watch, &[5000]).await?;

    let client = reqwest::Client::new();
    let all: Vec<u8> = messages.concat();
    for (path, want) in [("/m/bytes", all), ("/m/text", b"hello world".to_vec())] {
        let r = client
            .get(format!("{}{path}?offset=-1", node.base))
            .send()
            .await?;
        let closed = r.headers().get("stream-closed").is_some();
        let ct = r.headers()["content-type"].to_str()?.to_owned();
        let body = r.bytes().await?;
        assert!(body.as_ref() == want.as_slice(), "{path}: every byte once");
        assert_eq!(closed, path == "/m/text", "{path}: closure");
        let want_ct = src.head(path, &[]).await?.need("content-type")?.to_owned();
        assert_eq!(ct, want_ct);
    }
    let head = client.head(format!("{}/m/bytes", node.base)).send().await?;
    assert_eq!(head.headers()["stream-ttl"].to_str()?, "3600");
    let r = client
        .get(format!("{}/m/json?offset=-1", node.base))
        .send()
        .await?;
    assert!(r.headers().get("stream-closed").is_some());
    let got: Vec<serde_json::Value> = serde_json::from_slice(&r.bytes().await?)?;
    let want: Vec<serde_json::Value> =
        serde_json::from_slice(&src.get(&format!("/m/json?offset={ZERO}"), &[]).await?.body)?;
    assert_eq!(got, want, "every JSON message once, in order");
    Ok(())
}

/// The append in flight when a mirror dies is resent, not lost and not doubled: a progress
/// file whose `pending` record names a JSON batch the destination already has (the mirror was
/// killed after the POST, before recording its acknowledgement) is resent with the same
/// `Producer-Seq`, the destination drops the duplicate, and the appends made since follow once.
#[tokio::test]
async fn mirror_resends_a_pending_batch_exactly_once() -> R {
    let src = Server::start().await?;
    let dst = Server::start().await?;
    src.put("/p/json", &[("content-type", "application/json")], "")
        .await?;
    src.post(
        "/p/json",
        &[("content-type", "application/json")],
        "[1,2,3]",
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let list = dir.path().join("streams.txt");
    std::fs::write(&list, "p/json\n")?;
    let state = dir.path().join("state");
    assert!(
        finish(mirror(&src.base, &dst.base, &list, &state, &[])?)
            .await?
            .success()
    );
    let files: Vec<_> = std::fs::read_dir(&state)?.collect::<Result<_, _>>()?;
    assert_eq!(files.len(), 1);
    let file = files[0].path();
    let mut p: serde_json::Value = serde_json::from_slice(&std::fs::read(&file)?)?;
    let tail = p["nextOffset"].clone();
    // Back to the moment after the first POST was sent and before its acknowledgement was saved.
    p["nextSeq"] = 0.into();
    p["nextOffset"] = ZERO.into();
    p["pending"] = serde_json::json!({"seq": 0, "from": ZERO, "to": tail, "count": 3});
    std::fs::write(&file, p.to_string())?;
    src.post("/p/json", &[("content-type", "application/json")], "[4,5]")
        .await?;
    assert!(
        finish(mirror(&src.base, &dst.base, &list, &state, &[])?)
            .await?
            .success()
    );
    let r = dst.get(&format!("/p/json?offset={ZERO}"), &[]).await?;
    assert_eq!(
        r.text(),
        "[1,2,3,4,5]",
        "the batch once, then the new appends"
    );
    let a = src.head("/p/json", &[]).await?;
    let b = dst.head("/p/json", &[]).await?;
    assert_eq!(a.h("stream-next-offset"), b.h("stream-next-offset"));
    Ok(())
}

/// Discovery through brook's `GET /__brook/streams` (the operations routes): `--prefix` picks
/// the streams under it. Runs where the listing route exists (it answers 404 on servers built
/// without it, and the test says so and stops).
#[tokio::test]
async fn mirror_discovers_streams_through_the_listing() -> R {
    let src = Server::start().await?;
    let dst = Server::start().await?;
    if src.get("/__brook/streams", &[]).await?.status == 404 {
        eprintln!("mirror: this server has no /__brook/streams listing; the discovery test stops");
        return Ok(());
    }
    for path in ["/keep/a", "/keep/b/c", "/other/x"] {
        src.put(path, &[("content-type", "text/plain")], "data")
            .await?;
    }
    let dir = tempfile::tempdir()?;
    let status = finish(
        Command::new(env!("CARGO_BIN_EXE_brook"))
            .args([
                "mirror",
                &src.base,
                &dst.base,
                "--prefix",
                "keep/",
                "--state-dir",
            ])
            .arg(dir.path().join("state"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()?,
    )
    .await?;
    assert!(status.success());
    for (path, there) in [("/keep/a", true), ("/keep/b/c", true), ("/other/x", false)] {
        let r = dst.get(&format!("{path}?offset={ZERO}"), &[]).await?;
        assert_eq!(r.status == 200, there, "{path}");
        if there {
            assert_eq!(r.text(), "data");
        }
    }
    Ok(())
}
