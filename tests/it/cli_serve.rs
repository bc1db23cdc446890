//! `brook serve` as an operator starts it: what it prints and what it leaves behind.

use std::process::{Command, Stdio};

use crate::http_support::R;

/// `brook serve` on 127.0.0.1:`port` storing in `data`.
fn serve(port: &str, data: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", port, "--data-dir"])
        .arg(data);
    cmd
}

/// A port that is already taken fails at once with a message naming it, and touches nothing:
/// the data directory is not created.
#[test]
fn a_taken_port_fails_before_the_data_directory_is_created() -> R {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port().to_string();
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let out = serve(&port, &data).stdin(Stdio::null()).output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already in use"), "{stderr}");
    assert!(!data.exists(), "the data directory was created");
    Ok(())
}

/// The log written to a pipe (a file, a collector) carries no terminal colour codes.
#[test]
fn the_log_to_a_pipe_has_no_colour_codes() -> R {
    let dir = tempfile::tempdir()?;
    let mut child = serve("0", &dir.path().join("data"))
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut seen = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line?;
        let done = line.contains("listening on");
        seen.push(line);
        if done {
            break;
        }
    }
    child.kill()?;
    child.wait()?;
    assert!(seen.iter().any(|l| l.contains("listening on")), "{seen:?}");
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in {seen:?}"
    );
    Ok(())
}

/// `--send-buffer` takes `auto`, `os` or at least 64 KiB; anything else fails at once with a
/// message naming the reason, before the data directory is created.
#[test]
fn a_bad_send_buffer_fails_before_the_data_directory_is_created() -> R {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    for (value, says) in [
        ("32768", "delayed acknowledgement"),
        ("big", "is not auto, os or a size in bytes"),
    ] {
        let out = serve("0", &data)
            .args(["--send-buffer", value])
            .stdin(Stdio::null())
            .output()?;
        assert!(!out.status.success(), "--send-buffer {value} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{value}: {stderr}");
        assert!(!data.exists(), "the data directory was created");
    }
    Ok(())
}
