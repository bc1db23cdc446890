//! A server whose store is still opening (recovery): every connection is answered at once and
//! closed, `/__brook/live` 200 and everything else 503 `STARTING`, so orchestrators and clients
//! see a live process that is not ready yet.

use std::future::Future;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::tls::{ALPN_H2, Tls};
use crate::http::reply::{common_headers, json, problem};

/// Answers on `listener` (and `admin`, when given) while `opening` runs, and returns its output
/// once it completes: `/__brook/live` is 200, every other request 503 `STARTING` with
/// `Retry-After: 1`. Each such response closes its connection, so a client's next request finds
/// the real server. Meant for [`serve`](crate::http::serve)'s listener while the store recovers. With
/// `tls` (the certificate [`ServerConfig::tls`](crate::http::ServerConfig::tls) will serve), the
/// main listener's connections complete a TLS handshake first and are answered over HTTP/2 or
/// HTTP/1.1 as ALPN chose, as the real server will; the admin listener stays plain HTTP.
pub async fn serve_starting<T>(
    listener: &tokio::net::TcpListener,
    admin: Option<&tokio::net::TcpListener>,
    tls: Option<&Tls>,
    opening: impl Future<Output = T>,
) -> T {
    let acceptor = tls.map(Tls::acceptor);
    let mut opening = std::pin::pin!(opening);
    loop {
        let (accepted, on_admin) = tokio::select! {
            biased;
            out = &mut opening => return out,
            a = listener.accept() => (a, false),
            a = super::accept_on(admin) => (a, true),
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let acceptor = acceptor.clone().filter(|_| !on_admin);
        tokio::spawn(answer_starting(stream, acceptor));
    }
}

/// Serves one connection of a starting server (see [`serve_starting`]), after a TLS handshake
/// when `acceptor` is given; a handshake that does not finish in 10 s ends the connection.
async fn answer_starting(tcp: tokio::net::TcpStream, acceptor: Option<tokio_rustls::TlsAcceptor>) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let service = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| {
        std::future::ready(Ok::<_, std::convert::Infallible>(starting(
            req.uri().path(),
        )))
    });
    let mut h1 = hyper::server::conn::http1::Builder::new();
    h1.keep_alive(false);
    let Some(acceptor) = acceptor else {
        let _ = h1.serve_connection(TokioIo::new(tcp), service).await;
        return;
    };
    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
    else {
        return;
    };
    if stream.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
        let h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        let _ = h2.serve_connection(TokioIo::new(stream), service).await;
    } else {
        let _ = h1.serve_connection(TokioIo::new(stream), service).await;
    }
}

/// The answer to a request on a server whose store is still opening.
fn starting(path: &str) -> Response {
    let mut res = if path == "/__brook/live" {
        json(StatusCode::OK, r#"{"status":"live"}"#)
    } else {
        let mut headers = HeaderMap::new();
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "STARTING",
            "the server is starting: the store is being opened (recovery); retry shortly",
            headers,
            serde_json::Map::new(),
        )
    };
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    common_headers(res.headers_mut(), true);
    res
}
