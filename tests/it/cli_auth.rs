//! The `brook` commands against servers with access control (`brook serve --auth-tokens`), over
//! real sockets: `ls`, `cat`, `head` and `tail` with `--token` and with `BROOK_TOKEN` (and
//! `BROOK_URL` for the server), `brook mirror` with a token for each end (`--source-token`,
//! `--token`, and their variables), and the 401 message naming the flag and the variable.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::http_support::token_file;
use crate::ops_cli::cli_store;
use crate::ops_support::{Proc, R, http};

/// The variables the commands read, removed from every child so the tests do not depend on the
/// environment they run in.
const VARS: [&str; 3] = ["BROOK_URL", "BROOK_TOKEN", "BROOK_SOURCE_TOKEN"];

/// `brook` with `args` and the variables `env`, none of [`VARS`] inherited.
fn brook_cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    for v in VARS {
        cmd.env_remove(v);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

/// Runs `brook` with `args` and the variables `env` to its end.
fn brook(args: &[&str], env: &[(&str, &str)]) -> R<Output> {
    Ok(brook_cmd(args, env).output()?)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that the command succeeded and printed exactly `want`.
fn printed(out: &Output, want: &str) {
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(out), want, "stderr: {}", stderr(out));
}

/// Asserts that the command failed with a 401 message that tells how to give the token (and
/// not the header the command line has no flag for).
fn needs_token(out: &Output) {
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(out);
    // (A HEAD's 401 has no body to carry the code.)
    assert!(
        err.contains("the server needs a bearer token (401"),
        "{err}"
    );
    assert!(
        err.contains("--token TOKEN or the BROOK_TOKEN environment variable"),
        "{err}"
    );
    assert!(!err.contains("Authorization: Bearer"), "{err}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// A `brook serve` over a store in `dir/name` (the sample store when `sample`, else empty),
/// with access control from a token file granting `tokens` (`(who, grants)`: the token is
/// `{who}-token`); returns it and its URL.
fn secured(dir: &Path, name: &str, sample: bool, tokens: &[(&str, &str)]) -> R<(Proc, String)> {
    let home = dir.join(name);
    std::fs::create_dir_all(&home)?;
    let data = home.join("data");
    if sample {
        cli_store(&data)?;
    }
    let tokens = token_file(&home, tokens)?;
    let tokens = tokens.to_str().ok_or("path")?;
    let mut p = Proc::serve(&data, &["--auth-tokens", tokens], "info")?;
    let addr = p.addr()?;
    Ok((p, format!("http://{addr}")))
}

/// Waits up to 30 s for `child` to exit and returns whether it succeeded; kills it past that.
fn finish(child: &mut Child) -> R<bool> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            return Err("the command did not end in 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ls`, `cat`, `head` and `tail --url` against `brook serve --auth-tokens`: refused without a
/// token with a message naming `--token` and `BROOK_TOKEN`; served with `--token`, with
/// `BROOK_TOKEN`, and with `BROOK_URL` naming the server; a token the server does not know is
/// said to be one.
#[test]
fn ls_cat_head_and_tail_send_the_token() -> R {
    let tmp = tempfile::tempdir()?;
    let (p, url) = secured(tmp.path(), "server", true, &[("cli", "read,write,admin /")])?;
    let url = url.as_str();
    let addr = url.trim_start_matches("http://").to_owned();
    let env_token = [("BROOK_TOKEN", "cli-token")];

    // No token: 401, and the message says how to give one.
    needs_token(&brook(&["ls", "--url", url], &[])?);
    needs_token(&brook(&["cat", "--url", url, "cli/json"], &[])?);
    needs_token(&brook(&["head", "--url", url, "cli/bytes"], &[])?);
    needs_token(&brook(&["tail", "--url", url, "cli/bytes"], &[])?);
    // An empty variable is no token.
    needs_token(&brook(&["ls", "--url", url], &[("BROOK_TOKEN", "")])?);

    // With --token.
    let token = ["--token", "cli-token"];
    let with = |args: &[&str]| -> R<Output> {
        let mut all = args.to_vec();
        all.extend(["--url", url]);
        all.extend(token);
        brook(&all, &[])
    };
    printed(&with(&["ls", "cli/"])?, "cli/bytes\ncli/json\n");
    printed(&with(&["cat", "cli/json"])?, "{\"a\":1}\n{\"b\":2}\n");
    let out = with(&["head", "cli/bytes"])?;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("content-type: text/plain\n"), "{text}");
    assert!(text.contains("closed: true\n"), "{text}");
    // tail of a closed stream from its start prints it and ends.
    printed(&with(&["tail", "cli/bytes", "--from", "-1"])?, "hello ");

    // With BROOK_TOKEN.
    printed(
        &brook(&["ls", "--long", "--url", url, "cli/b"], &env_token)?,
        "cli/bytes\t0000000000000001_0000000000000006\ttext/plain\tclosed\n",
    );
    printed(
        &brook(&["cat", "--url", url, "cli/bytes"], &env_token)?,
        "hello ",
    );
    let out = brook(&["head", "--url", url, "cli/json"], &env_token)?;
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("closed: false\n"), "{}", stdout(&out));

    // BROOK_URL names the server when neither --url nor --data-dir is given.
    let both = [("BROOK_URL", url), ("BROOK_TOKEN", "cli-token")];
    printed(&brook(&["ls", "cli/j"], &both)?, "cli/json\n");
    printed(&brook(&["cat", "cli/bytes"], &both)?, "hello ");
    needs_token(&brook(&["ls"], &[("BROOK_URL", url)])?);
    // --data-dir wins over BROOK_URL, and a token is not needed there.
    let local = tmp.path().join("local");
    cli_store(&local)?;
    let local = local.to_str().ok_or("path")?;
    printed(
        &brook(&["ls", "--data-dir", local, "cli/j"], &both)?,
        "cli/json\n",
    );
    // Neither, nor the variable: said so.
    let out = brook(&["ls"], &[])?;
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("BROOK_URL"), "{}", stderr(&out));

    // A token the server does not know.
    let out = brook(&["ls", "--url", url, "--token", "nobody-token"], &[])?;
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("the server did not accept the token (401 INVALID_TOKEN"),
        "{err}"
    );
    assert!(err.contains("--token or BROOK_TOKEN"), "{err}");
    // A token that cannot be sent is refused before any request, without echoing it.
    let out = brook(&["ls", "--url", url, "--token", "two words"], &[])?;
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains("--token"), "{err}");
    assert!(!err.contains("two words"), "{err}");

    // tail follows appends with the token from BROOK_TOKEN (catch-up, then long-polls) until
    // the stream is closed.
    let auth = ("authorization", "Bearer cli-token");
    let plain = [("content-type", "text/plain"), auth];
    assert_eq!(http(&addr, "PUT", "/cli/live", &plain, b"")?.status, 201);
    let mut tail = brook_cmd(
        &["tail", "--url", url, "cli/live", "--from", "-1"],
        &env_token,
    )
    .stdout(Stdio::piped())
    .spawn()?;
    let mut lines = std::io::BufReader::new(tail.stdout.take().ok_or("stdout")?).lines();
    assert_eq!(
        http(&addr, "POST", "/cli/live", &plain, b"one\n")?.status,
        204
    );
    assert_eq!(lines.next().ok_or("tail ended")??, "one");
    // The next append arrives while tail waits in a long-poll.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        http(&addr, "POST", "/cli/live", &plain, b"two\n")?.status,
        204
    );
    assert_eq!(lines.next().ok_or("tail ended")??, "two");
    let close = [
        ("content-type", "text/plain"),
        ("stream-closed", "true"),
        auth,
    ];
    assert_eq!(http(&addr, "POST", "/cli/live", &close, b"")?.status, 204);
    assert!(finish(&mut tail)?, "tail failed");
    assert!(lines.next().is_none());
    p.stop()?;
    Ok(())
}

/// `brook mirror` between two servers with access control, each knowing only its own token:
/// refused without tokens (naming `--source-token`), without the destination's (naming
/// `--token`) and with the two swapped; a copy with `--source-token` and `--token`, and
/// another with `BROOK_SOURCE_TOKEN` and `BROOK_TOKEN`, read back through the destination.
#[test]
fn mirror_sends_each_server_its_own_token() -> R {
    let tmp = tempfile::tempdir()?;
    let (src, source) = secured(tmp.path(), "source", true, &[("src", "read,admin /")])?;
    let (dst, dest) = secured(tmp.path(), "dest", false, &[("dst", "read,write,admin /")])?;
    let (source, dest) = (source.as_str(), dest.as_str());
    let state = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let mirror = |dest: &str, state: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec![
            "mirror",
            source,
            dest,
            "--prefix",
            "cli/",
            "--state-dir",
            state,
        ];
        args.extend(extra);
        brook(&args, env)
    };

    // No token: the source's listing is refused first.
    let out = mirror(dest, &state("s1"), &[], &[])?;
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("the source server answered 401 UNAUTHORIZED"),
        "{err}"
    );
    assert!(
        err.contains("--source-token TOKEN or the BROOK_SOURCE_TOKEN environment variable"),
        "{err}"
    );
    assert!(!err.contains("Authorization: Bearer"), "{err}");

    // The source's token only: the destination refuses.
    let out = mirror(dest, &state("s2"), &["--source-token", "src-token"], &[])?;
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    // (Its first request is a HEAD, whose 401 has no body to carry the code.)
    assert!(err.contains("the destination server answered 401"), "{err}");
    assert!(
        err.contains("--token TOKEN or the BROOK_TOKEN environment variable"),
        "{err}"
    );

    // Swapped: each server is sent the other's token, which it does not know.
    let swapped = ["--source-token", "dst-token", "--token", "src-token"];
    let out = mirror(dest, &state("s3"), &swapped, &[])?;
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("the source server answered 401 INVALID_TOKEN"),
        "{err}"
    );

    // Both tokens, as flags: the streams are copied.
    let both = ["--source-token", "src-token", "--token", "dst-token"];
    let out = mirror(dest, &state("s4"), &both, &[])?;
    assert!(out.status.success(), "{out:?}");
    // And as variables, to a second place on the destination.
    let dest2 = format!("{dest}/copy");
    let vars = [
        ("BROOK_SOURCE_TOKEN", "src-token"),
        ("BROOK_TOKEN", "dst-token"),
    ];
    let out = mirror(&dest2, &state("s5"), &[], &vars)?;
    assert!(out.status.success(), "{out:?}");

    // What the destination holds, read with its own token: the source's streams, with the
    // same tails.
    let read = |args: &[&str]| brook(args, &[("BROOK_URL", dest), ("BROOK_TOKEN", "dst-token")]);
    let listed = brook(
        &["ls", "--long", "--url", source, "cli/"],
        &[("BROOK_TOKEN", "src-token")],
    )?;
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(stdout(&listed).lines().count(), 2, "{listed:?}");
    printed(&read(&["ls", "--long", "cli/"])?, &stdout(&listed));
    for at in ["", "copy/"] {
        printed(
            &read(&["cat", &format!("{at}cli/json")])?,
            "{\"a\":1}\n{\"b\":2}\n",
        );
        printed(&read(&["cat", &format!("{at}cli/bytes")])?, "hello ");
        let out = read(&["head", &format!("{at}cli/bytes")])?;
        assert!(stdout(&out).contains("closed: true\n"), "{out:?}");
    }
    src.stop()?;
    dst.stop()?;
    Ok(())
}

/// The client's bearer token: refused when it cannot be sent (without echoing it), and never
/// in `Debug` output, nor is a mirror's.
#[test]
fn tokens_are_checked_and_not_printed() -> R {
    use brook::client::Client;
    let base = "http://127.0.0.1:9";
    for bad in ["", "a b", "a\nb"] {
        let e = Client::new(base)?
            .with_bearer_token(bad)
            .err()
            .ok_or("a bad token was taken")?;
        assert!(
            matches!(e, brook::client::Error::InvalidArgument(_)),
            "{e:?}"
        );
    }
    let client = Client::new(base)?.with_bearer_token("secret-token-1")?;
    assert!(!format!("{client:?}").contains("secret-token-1"));
    assert!(!format!("{:?}", client.stream("a")).contains("secret-token-1"));
    let opts = brook::mirror::MirrorOptions {
        source: base.into(),
        dest: base.into(),
        source_token: Some("secret-token-2".into()),
        dest_token: Some("secret-token-3".into()),
        prefix: None,
        streams_file: None,
        follow: false,
        names: brook::mirror::NameMap::Same,
        state_dir: "state".into(),
        poll: Duration::from_secs(1),
        jobs: 1,
    };
    let text = format!("{opts:?}");
    assert!(!text.contains("secret-token"), "{text}");
    assert!(text.contains("dest_token: Some(\"<hidden>\")"), "{text}");
    Ok(())
}
