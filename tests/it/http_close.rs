//! How the server ends connections: a refusal decided before the request body was read tells
//! the client not to reuse the connection, so its next request never meets a closing one.

use brook::Options;

use crate::http_support::{R, Server, config};

/// A snapshot body over the limit (declared, or found while streaming) is refused with 413
/// before it is read; the response says `Connection: close`, and the client's next requests
/// (on a new connection) all succeed. A refusal after the body was read keeps the connection.
/// (The limit is above what brook's own HTTP/1.1 loop reads before the handler runs, 256 KiB:
/// a smaller body is read whole first, and its refusal keeps the connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_body_close_the_connection() -> R {
    let limit = 512 << 10;
    let s = Server::start_with(Options::default().with_max_snapshot_bytes(limit), config()).await?;
    let p = "/close/limit";
    s.create(p, "text/plain").await?;
    s.post(p, &[("content-type", "text/plain")], "abc").await?;
    let tail = s.tail(p).await?;
    let url = format!("{p}/snapshot/{tail}");
    for round in 0..40 {
        let r = s
            .send("PUT", &url, &[], vec![b'x'; (limit as usize) + 1])
            .await?;
        r.refused(413, "PAYLOAD_TOO_LARGE");
        assert_eq!(r.h("connection"), Some("close"), "round {round}");
        // On a pooled connection that the server is closing, this would fail now and then.
        let r = s.get(&format!("{p}?offset=-1"), &[]).await?;
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
    }
    // A conflict found after the body was read: the connection stays open.
    let r = s
        .post(p, &[("content-type", "application/json")], "[1]")
        .await?;
    r.refused(409, "CONTENT_TYPE_MISMATCH");
    assert_eq!(r.h("connection"), None);
    Ok(())
}
