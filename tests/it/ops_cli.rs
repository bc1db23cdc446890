//! The `brook` commands on a data directory and on a server (plain and TLS): `ls`, `cat`,
//! `tail`, `head`, `check` (finding a flipped byte), and a clear refusal on a directory a
//! server holds.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use brook::*;

use crate::ops_support::{Proc, R, http};

/// Runs `brook` with `args`.
fn brook(args: &[&str]) -> R<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_brook"))
        .args(args)
        .stdin(Stdio::null())
        .output()?)
}

/// `out`'s stdout as text.
fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A stream name known to be valid.
fn name(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

/// A store in `dir` with a JSON stream `cli/json` (two messages, open) and a closed byte
/// stream `cli/bytes`; shut down cleanly.
pub(crate) fn cli_store(dir: &Path) -> R {
    let store = Store::open(dir, Options::default())?;
    add_cli_streams(&store)?;
    store.shutdown()?;
    Ok(())
}

fn add_cli_streams(store: &Store) -> R {
    store.create(&name("cli/json"), CreateOptions::json())?;
    store.append(
        &name("cli/json"),
        AppendRequest::new(r#"[{"a":1},{"b":2}]"#),
    )?;
    store.create(
        &name("cli/bytes"),
        CreateOptions::with_content_type("text/plain"),
    )?;
    store.append(&name("cli/bytes"), AppendRequest::new("hello ").closing())?;
    Ok(())
}

/// [`cli_store`]'s streams and `other/x`; shut down cleanly.
fn sample_store(dir: &Path) -> R {
    let store = Store::open(dir, Options::default())?;
    add_cli_streams(&store)?;
    store.create(&name("other/x"), CreateOptions::new().data("x"))?;
    store.shutdown()?;
    Ok(())
}

#[test]
fn ls_cat_and_head_read_a_data_directory() -> R {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_str().ok_or("path")?;
    sample_store(tmp.path())?;

    let out = brook(&["ls", "--data-dir", dir, "cli/"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "cli/bytes\ncli/json\n");
    let out = brook(&["ls", "--long", "--data-dir", dir])?;
    let text = stdout(&out);
    assert!(
        text.contains("cli/bytes\t0000000000000001_0000000000000006\ttext/plain\tclosed\n"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 3, "{text}");

    let out = brook(&["cat", "--data-dir", dir, "cli/json"])?;
    assert_eq!(stdout(&out), "{\"a\":1}\n{\"b\":2}\n");
    let out = brook(&["cat", "--data-dir", dir, "cli/bytes"])?;
    assert_eq!(stdout(&out), "hello ");
    let from = "0000000000000001_0000000000000008";
    let out = brook(&["cat", "--data-dir", dir, "cli/json", "--from", from])?;
    assert_eq!(stdout(&out), "{\"b\":2}\n");

    let out = brook(&["head", "--data-dir", dir, "cli/bytes"])?;
    let text = stdout(&out);
    assert!(text.contains("content-type: text/plain\n"), "{text}");
    assert!(text.contains("closed: true\n"), "{text}");
    assert!(
        text.contains("tail: 0000000000000001_0000000000000006\n"),
        "{text}"
    );

    let out = brook(&["cat", "--data-dir", dir, "cli/none"])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cli/none"), "{err}");

    // No store there: an error, and nothing created.
    let empty = tmp.path().join("empty");
    let out = brook(&["ls", "--data-dir", empty.to_str().ok_or("path")?])?;
    assert!(!out.status.success());
    assert!(!empty.exists());
    Ok(())
}

#[test]
fn a_command_on_a_directory_a_server_holds_says_so() -> R {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let mut p = Proc::serve(&data, &[], "info")?;
    p.addr()?;
    let out = brook(&["ls", "--data-dir", data.to_str().ok_or("path")?])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another brook process"), "{err}");
    assert!(err.contains("--url"), "{err}");
    p.stop()?;
    Ok(())
}

#[test]
fn ls_cat_head_and_tail_read_a_server() -> R {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    sample_store(&data)?;
    let mut p = Proc::serve(&data, &[], "info")?;
    let addr = p.addr()?;
    let url = format!("http://{addr}");

    let out = brook(&["ls", "--url", &url, "cli/"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "cli/bytes\ncli/json\n");
    let out = brook(&["cat", "--url", &url, "cli/json"])?;
    assert_eq!(stdout(&out), "{\"a\":1}\n{\"b\":2}\n");
    let out = brook(&["head", "--url", &url, "cli/bytes"])?;
    let text = stdout(&out);
    assert!(text.contains("closed: true\n"), "{text}");
    assert!(text.contains("content-type: text/plain\n"), "{text}");

    // tail follows appends until the stream is closed.
    let plain = [("content-type", "text/plain")];
    assert_eq!(http(&addr, "PUT", "/cli/live", &plain, b"")?.status, 201);
    let mut tail = Command::new(env!("CARGO_BIN_EXE_brook"))
        .args(["tail", "--url", &url, "cli/live", "--from", "-1"])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = std::io::BufReader::new(tail.stdout.take().ok_or("stdout")?).lines();
    assert_eq!(
        http(&addr, "POST", "/cli/live", &plain, b"one\n")?.status,
        204
    );
    assert_eq!(lines.next().ok_or("tail ended")??, "one");
    assert_eq!(
        http(&addr, "POST", "/cli/live", &plain, b"two\n")?.status,
        204
    );
    assert_eq!(lines.next().ok_or("tail ended")??, "two");
    let close = [("content-type", "text/plain"), ("stream-closed", "true")];
    assert_eq!(http(&addr, "POST", "/cli/live", &close, b"")?.status, 204);
    assert!(tail.wait()?.success());
    p.stop()?;
    Ok(())
}

/// `ls`, `cat`, `head` and `tail` read an `https://` server whose certificate a private CA
/// signed, trusting the CA given by `--ca-cert` (or `SSL_CERT_FILE`); without it the
/// certificate is refused, and a CA file that holds no certificate is named.
#[test]
fn ls_cat_head_and_tail_read_a_tls_server_with_a_ca_file() -> R {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    sample_store(&data)?;
    let pki = crate::http_tls::pki()?;
    let (cert, key) = crate::http_tls::write_pki(tmp.path(), &pki)?;
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca)?;
    let ca = ca.to_str().ok_or("path")?;
    let (cert, key) = (cert.to_str().ok_or("path")?, key.to_str().ok_or("path")?);
    let mut p = Proc::serve(&data, &["--tls-cert", cert, "--tls-key", key], "info")?;
    let line = p.wait_for("listening on https://")?;
    let port = line
        .split("https://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split([',', ' ', ';']).next())
        .ok_or("no port")?;
    let url = format!("https://localhost:{port}");
    let tls = |args: &[&str]| -> R<Output> {
        Ok(Command::new(env!("CARGO_BIN_EXE_brook"))
            .args(args)
            .args(["--url", &url])
            .env_remove("SSL_CERT_FILE")
            .stdin(Stdio::null())
            .output()?)
    };

    let out = tls(&["ls", "--ca-cert", ca, "cli/"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "cli/bytes\ncli/json\n");
    let out = tls(&["cat", "--ca-cert", ca, "cli/json"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "{\"a\":1}\n{\"b\":2}\n");
    let out = tls(&["head", "--ca-cert", ca, "cli/bytes"])?;
    let text = stdout(&out);
    assert!(text.contains("closed: true\n"), "{text}");
    assert!(
        text.contains("tail: 0000000000000001_0000000000000006\n"),
        "{text}"
    );

    // The CA from the environment, as OpenSSL and curl read it.
    let out = Command::new(env!("CARGO_BIN_EXE_brook"))
        .args(["cat", "--url", &url, "cli/bytes"])
        .env("SSL_CERT_FILE", ca)
        .stdin(Stdio::null())
        .output()?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "hello ");

    // Without the CA the server's certificate is not trusted.
    let out = tls(&["ls"])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("certificate"), "{err}");
    // A CA file with no certificate in it is named as such.
    let out = tls(&["ls", "--ca-cert", key])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no PEM CERTIFICATE"), "{err}");

    // tail follows appends over TLS until the stream is closed.
    let client = brook::client::Client::with_root_certificates(&url, pki.ca.as_bytes())?;
    let live = client.stream("cli/live");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(live.create(&brook::client::Create::new("text/plain")))?;
    let mut tail = Command::new(env!("CARGO_BIN_EXE_brook"))
        .args([
            "tail",
            "--url",
            &url,
            "--ca-cert",
            ca,
            "cli/live",
            "--from",
            "-1",
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = std::io::BufReader::new(tail.stdout.take().ok_or("stdout")?).lines();
    let append = |data: &'static str| {
        runtime.block_on(live.append(&brook::client::Append::new("text/plain", data)))
    };
    append("one\n")?;
    assert_eq!(lines.next().ok_or("tail ended")??, "one");
    append("two\n")?;
    assert_eq!(lines.next().ok_or("tail ended")??, "two");
    runtime.block_on(live.append(&brook::client::Append::close_only()))?;
    assert!(tail.wait()?.success());
    p.stop()?;
    Ok(())
}

#[test]
fn check_passes_a_sound_store_and_finds_a_flipped_byte() -> R {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_str().ok_or("path")?;
    let store = Store::open(tmp.path(), Options::default())?;
    for i in 0..5 {
        let n = name(&format!("chk/{i}"));
        store.create(&n, CreateOptions::with_content_type("text/plain"))?;
        for m in 0..3 {
            store.append(&n, AppendRequest::new(format!("message {m} of stream {i}")))?;
        }
    }
    store.shutdown()?;
    drop(store);

    let out = brook(&["check", "--data-dir", dir])?;
    let report = stdout(&out);
    assert!(out.status.success(), "{report} {out:?}");
    assert!(report.contains("checked 5 streams"), "{report}");
    assert!(report.contains("15 messages"), "{report}");
    assert!(report.contains("no damage found"), "{report}");

    // Flip one byte of the first message of one stream's log.
    let mut logs = Vec::new();
    let mut stack = vec![tmp.path().join("streams")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                logs.push(p);
            }
        }
    }
    logs.sort();
    let victim = &logs[0];
    let mut bytes = std::fs::read(victim)?;
    bytes[2] ^= 0x20;
    std::fs::write(victim, &bytes)?;

    let out = brook(&["check", "--data-dir", dir])?;
    let report = stdout(&out);
    assert!(!out.status.success(), "{report}");
    assert!(report.contains("1 problems:"), "{report}");
    assert!(report.contains("chk/"), "{report}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("damage found"), "{err}");

    // --repair moves the damaged stream into quarantine/: the store is sound again, the four
    // other streams read as before, and the damaged name is free.
    let out = brook(&["check", "--data-dir", dir, "--repair"])?;
    let report = stdout(&out);
    assert!(out.status.success(), "{report} {out:?}");
    assert!(report.contains("quarantined "), "{report}");
    let kept = std::fs::read_dir(tmp.path().join("quarantine"))?.count();
    assert_eq!(kept, 1, "one directory in quarantine/");
    let out = brook(&["check", "--data-dir", dir])?;
    let report = stdout(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("checked 4 streams"), "{report}");
    let store = Store::open(tmp.path(), Options::default())?;
    let mut missing = 0;
    for i in 0..5 {
        match store.head(&name(&format!("chk/{i}")), &Guard::NONE) {
            Ok(_) => {}
            Err(Error::NotFound) => missing += 1,
            Err(e) => return Err(e.into()),
        }
    }
    assert_eq!(missing, 1, "exactly the quarantined stream is gone");
    Ok(())
}

#[test]
fn export_and_import_move_a_data_directory() -> R {
    let tmp = tempfile::tempdir()?;
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let file = tmp.path().join("backup.brook");
    sample_store(&src)?;
    let (src, dst, file) = (
        src.to_str().ok_or("path")?,
        dst.to_str().ok_or("path")?,
        file.to_str().ok_or("path")?,
    );
    let out = brook(&["export", "--data-dir", src, file])?;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("exported 3 streams"));
    let out = brook(&["import", "--data-dir", dst, file])?;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("imported 3 streams"));
    for stream in ["cli/json", "cli/bytes", "other/x"] {
        let a = brook(&["head", "--data-dir", src, stream])?;
        let b = brook(&["head", "--data-dir", dst, stream])?;
        assert_eq!(stdout(&a), stdout(&b), "{stream}");
        assert!(stdout(&a).contains("incarnation: "), "{}", stdout(&a));
        let a = brook(&["cat", "--data-dir", src, stream])?;
        let b = brook(&["cat", "--data-dir", dst, stream])?;
        assert_eq!(a.stdout, b.stdout, "{stream}");
    }
    // Importing again is refused: the names exist.
    let out = brook(&["import", "--data-dir", dst, file])?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    Ok(())
}
