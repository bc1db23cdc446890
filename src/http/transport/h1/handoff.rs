//! Handing a connection to hyper: the bytes read so far put back in front of the socket.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::{Fallback, Io};
use crate::http::budget::Lease;
use crate::http::service::Handler;
use crate::http::transport::Open;

/// Hands the connection to hyper: `read` (bytes read but not served: the request that is not
/// served here and whatever followed it) is read again before the socket.
pub(super) async fn handoff<S: Io, H: Handler>(
    handler: H,
    socket: S,
    read: BytesMut,
    fallback: Fallback,
    open: (Open, Lease),
    alive: watch::Receiver<()>,
) {
    let peer = socket.peer();
    let io = hyper_util::rt::TokioIo::new(Rewind {
        read: read.freeze(),
        socket: Some(socket),
        shut: false,
    });
    let conn = fallback.builder.serve_connection(
        io,
        crate::http::transport::http1_service(handler, false, peer),
    );
    // A connection's error (reset, malformed request) concerns that connection only.
    let _ = fallback.watcher.watch(conn).await;
    drop((open, alive));
}

/// A socket with bytes already read from it put back in front.
struct Rewind<S: Io> {
    /// Bytes to be read before the socket's.
    read: Bytes,
    /// The connection (`None` only once dropped).
    socket: Option<S>,
    /// hyper shut the write side: it is closing the connection, perhaps with a request body
    /// left unread (a refusal before the body).
    shut: bool,
}

impl<S: Io> Rewind<S> {
    /// The connection.
    fn socket(&mut self) -> Pin<&mut S> {
        Pin::new(self.socket.as_mut().expect("present until dropped"))
    }
}

impl<S: Io> Drop for Rewind<S> {
    /// A connection hyper closes is drained as [`close_gently`] does, on a task of its own:
    /// closing it with the peer's unread bytes would send a reset, which can destroy the
    /// response before the peer read it (a client still sending a refused body).
    fn drop(&mut self) {
        if let (true, Some(mut socket)) = (self.shut, self.socket.take())
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { super::drain(&mut socket).await });
        }
    }
}

impl<S: Io> AsyncRead for Rewind<S> {
    /// The bytes put back first, then the socket's.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.is_empty() {
            return this.socket().poll_read(cx, buf);
        }
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read[..n]);
        this.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: Io> AsyncWrite for Rewind<S> {
    /// The socket's write.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().socket().poll_write(cx, buf)
    }

    /// The socket's vectored write (`sendfile` for large mapped slices).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().socket().poll_write_vectored(cx, bufs)
    }

    /// As the socket's (true for a plain socket, which then gets hyper's body pieces as they
    /// are, for `sendfile`).
    fn is_write_vectored(&self) -> bool {
        self.socket
            .as_ref()
            .is_some_and(AsyncWrite::is_write_vectored)
    }

    /// The socket's flush.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().socket().poll_flush(cx)
    }

    /// The socket's shutdown; the socket is drained when dropped (see `Drop`).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.shut = true;
        this.socket().poll_shutdown(cx)
    }
}
