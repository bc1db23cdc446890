//! The server's end of a connection: a TCP stream whose writes send large slices of mapped files
//! with `sendfile(2)`.
//!
//! A catch-up read's body is a list of `Bytes` views of read-only maps (segment logs, snapshot
//! blobs). hyper keeps them queued as they are (its write strategy for vectored IO) and hands
//! them to [`Socket::poll_write_vectored`] behind the response head. A `writev` of them would
//! copy every byte from the mapped pages into the socket; instead, a slice of at least
//! [`SENDFILE_MIN`] bytes that lies in a map is sent from the mapped file itself, at the same
//! offset, and the kernel passes its page-cache pages to TCP. The file bytes are the mapped
//! bytes: a mapped file never changes under its map (see `segment/mmap.rs`). Everything else
//! (headers, small or heap slices) is written by `writev`, one call for the run of slices
//! before the next large mapped one. Each call writes from one source only and returns what it
//! wrote; hyper calls again for the rest.
//!
//! A peer that stops reading is cut off: once writes have made no progress for the stall limit
//! (the socket's buffers full all along), the next write fails with `TimedOut` and hyper closes
//! the connection. Without it, a reader that never reads would hold its connection, and the
//! frames queued for it, for as long as it likes.
//!
//! Each accepted socket's kernel send buffer is sized by [`SendBuffers::fit`] (see
//! [`SendBuffer`](crate::http::SendBuffer)): a fixed bandwidth-delay product for near peers.
//!
//! An SSE connection parked at its stream's writer (`service/seat.rs`) is written by that writer's
//! task through a second descriptor of the same socket ([`Socket::share`]), with non-blocking
//! writes, while the connection has no task of its own (`h1/park.rs`); the seat's lock decides
//! which of the two may write.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::FileRange;
use crate::http::SendBuffer;

/// Mapped slices shorter than this are written (copied) with the slices around them: for a few
/// kilobytes a copy costs less than a second system call.
const SENDFILE_MIN: usize = 16 << 10;

/// Bytes a connection can take per microsecond of round trip under [`SendBuffer::Auto`]:
/// 10 Gbit/s.
const AUTO_BYTES_PER_MICRO: u64 = 1_250;

/// The send-buffer rule of a listener: the policy, and the largest buffer the kernel would
/// grow one to, read once.
pub(crate) struct SendBuffers {
    /// The configured policy.
    policy: SendBuffer,
    /// See [`crate::fs::send_buffer_ceiling`].
    ceiling: Option<usize>,
}

impl SendBuffers {
    /// The rule for `policy` on this machine.
    pub(crate) fn new(policy: SendBuffer) -> SendBuffers {
        let ceiling = match policy {
            SendBuffer::Auto => crate::fs::send_buffer_ceiling(),
            SendBuffer::Os | SendBuffer::Bytes(_) => None,
        };
        SendBuffers { policy, ceiling }
    }

    /// Sizes an accepted socket's send buffer (nothing for [`SendBuffer::Os`], nor for a far
    /// or unmeasured peer under [`SendBuffer::Auto`]); the size set, if any. A failure leaves
    /// the kernel's sizing, which serves the connection as well, only less fairly.
    pub(crate) fn fit(&self, tcp: &TcpStream) -> Option<usize> {
        let bytes = match self.policy {
            SendBuffer::Os => return None,
            SendBuffer::Bytes(bytes) => bytes.max(SendBuffer::MIN),
            SendBuffer::Auto => auto_size(crate::fs::tcp_rtt(tcp.as_fd()), self.ceiling)?,
        };
        crate::fs::set_send_buffer(tcp.as_fd(), bytes).ok()?;
        Some(bytes)
    }
}

/// The send buffer [`SendBuffer::Auto`] gives a peer `rtt` away when the kernel would grow one
/// to at most `ceiling`: the bandwidth-delay product at [`AUTO_BYTES_PER_MICRO`], at least
/// [`SendBuffer::AUTO_MIN`]; `None` (the kernel's sizing) when either is unknown or the product
/// is past the ceiling.
fn auto_size(rtt: Option<Duration>, ceiling: Option<usize>) -> Option<usize> {
    let micros = u64::try_from(rtt?.as_micros()).unwrap_or(u64::MAX);
    let product = micros.saturating_mul(AUTO_BYTES_PER_MICRO);
    let bytes = usize::try_from(product)
        .unwrap_or(usize::MAX)
        .max(SendBuffer::AUTO_MIN);
    (bytes <= ceiling?).then_some(bytes)
}

/// A served TCP connection (see the module doc).
pub(crate) struct Socket {
    /// The connection.
    tcp: TcpStream,
    /// Whether large mapped slices go by `sendfile`: only if SIGPIPE cannot end the process
    /// (sendfile has no `MSG_NOSIGNAL`), and not after a `sendfile` on this connection failed.
    sendfile: bool,
    /// How long writes may make no progress before the connection is given up.
    stall_limit: Duration,
    /// Armed at the first write that could not proceed since the last one that did; made on
    /// the first stall (most connections never have one).
    stall: Option<Pin<Box<Sleep>>>,
    /// A write is pending and `stall` runs for it.
    stalled: bool,
    /// Bytes this connection sent with `sendfile`.
    #[cfg(test)]
    file_bytes: u64,
}

impl Socket {
    /// Serves `tcp`, sending mapped slices with `sendfile` if `sendfile` is true, and giving up
    /// on a peer whose socket accepts nothing for `stall_limit`.
    pub(crate) fn new(tcp: TcpStream, sendfile: bool, stall_limit: Duration) -> Socket {
        Socket {
            tcp,
            sendfile,
            stall_limit,
            stall: None,
            stalled: false,
            #[cfg(test)]
            file_bytes: 0,
        }
    }

    /// A second descriptor of the connection's socket (`dup`), for an SSE connection's stream
    /// writer (`service/seat.rs`): non-blocking like this one (the flag belongs to the socket), and to
    /// be written only while the connection's seat says so and dropped when its response ends
    /// (the socket stays open while it lives).
    pub(crate) fn share(&self) -> io::Result<std::net::TcpStream> {
        Ok(std::net::TcpStream::from(
            self.tcp.as_fd().try_clone_to_owned()?,
        ))
    }

    /// The address of the peer.
    pub(crate) fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp.peer_addr()
    }

    /// Ready when a read may find bytes or the peer's end (see `h1::Io::poll_read_ready`).
    pub(crate) fn read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp.poll_read_ready(cx)
    }

    /// Passes a write's outcome on, timing how long writes stay pending: a write that is still
    /// pending `stall_limit` after the first one that could not proceed fails with `TimedOut`.
    fn guard<T>(&mut self, cx: &mut Context<'_>, res: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if res.is_ready() {
            self.stalled = false;
            return res;
        }
        let limit = self.stall_limit;
        let timer = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if !self.stalled {
            self.stalled = true;
            timer.as_mut().reset(Instant::now() + limit);
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer accepted no bytes within the write stall limit",
            )));
        }
        Poll::Pending
    }

    /// The file range behind `slice`, if it is to be sent with `sendfile`.
    fn file_range(&self, slice: &[u8]) -> Option<FileRange> {
        if self.sendfile && slice.len() >= SENDFILE_MIN {
            FileRange::of(slice)
        } else {
            None
        }
    }

    /// Sends `slice`, whose bytes are `at`, from the file. If `sendfile` fails for any reason
    /// but a full socket (an interrupted call is retried), the slice is written from the map
    /// instead, and so is every later one on this connection: a file the kernel cannot send
    /// from is served by plain writes, and a broken socket fails that write with its own error.
    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        slice: &[u8],
        at: &FileRange,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            let tcp = &self.tcp;
            // `try_io` clears the write readiness when the call fails with `WouldBlock`, so the
            // next `poll_write_ready` waits for the socket to drain.
            let sent = tcp.try_io(Interest::WRITABLE, || {
                crate::fs::send_file(tcp.as_fd(), at.file(), at.offset(), slice.len())
            });
            match sent {
                Ok(n) if n > 0 => {
                    #[cfg(test)]
                    {
                        self.file_bytes += n as u64;
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                other => {
                    // 0: the file is shorter than the map said (it never is; see segment/mmap.rs).
                    tracing::debug!(result = ?other, "sendfile failed; writing from the map on this connection");
                    self.sendfile = false;
                    return Pin::new(&mut self.tcp).poll_write(cx, slice);
                }
            }
        }
    }
}

impl AsyncRead for Socket {
    /// Reads from the TCP stream.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    /// One buffer: by `sendfile` if it is a large mapped slice, else written.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = match this.file_range(buf) {
            Some(at) => this.poll_send_file(cx, buf, &at),
            None => Pin::new(&mut this.tcp).poll_write(cx, buf),
        };
        this.guard(cx, res)
    }

    /// The first slice, if it is a large mapped one, by `sendfile`; otherwise one `writev` of the
    /// slices before the first large mapped one.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut plain = bufs.len();
        for (i, buf) in bufs.iter().enumerate() {
            if let Some(at) = this.file_range(buf) {
                if i == 0 {
                    let res = this.poll_send_file(cx, buf, &at);
                    return this.guard(cx, res);
                }
                plain = i;
                break;
            }
        }
        let res =
            Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs.get(..plain).unwrap_or(bufs));
        this.guard(cx, res)
    }

    /// True: hyper then queues the body's `Bytes` as they are (a flattening IO would have them
    /// copied into hyper's own buffer first, and nothing would be left to send from a file).
    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Nothing is buffered here: flushes the TCP stream.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.tcp).poll_flush(cx);
        this.guard(cx, res)
    }

    /// Shuts the TCP stream's write side down.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::sim::noise;
    use crate::name::Offset;
    use crate::segment::SegmentSet;
    use crate::state::Body;
    use bytes::Bytes;
    use tokio::io::AsyncReadExt;

    type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

    /// A connected pair: the server's `Socket` and the client's stream.
    async fn pair(sendfile: bool) -> R<(Socket, TcpStream)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let client = TcpStream::connect(listener.local_addr()?).await?;
        let (server, _) = listener.accept().await?;
        Ok((
            Socket::new(server, sendfile, Duration::from_mins(1)),
            client,
        ))
    }

    /// Writes all of `pieces` the way hyper flushes its queue (vectored writes, advancing past
    /// what each call wrote) while the other end reads everything. Returns what arrived and
    /// the bytes sent with `sendfile`.
    async fn send(
        mut socket: Socket,
        mut client: TcpStream,
        pieces: &[Bytes],
    ) -> R<(Vec<u8>, u64)> {
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.map(|_| got)
        });
        let mut slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        let mut left = &mut slices[..];
        while !left.is_empty() {
            let n = std::future::poll_fn(|cx| Pin::new(&mut socket).poll_write_vectored(cx, left))
                .await?;
            assert!(n > 0);
            IoSlice::advance_slices(&mut left, n);
        }
        let file_bytes = socket.file_bytes;
        drop(socket);
        Ok((reader.await??, file_bytes))
    }

    /// One message holding `data`.
    fn message(data: &[u8]) -> Body {
        Body::new(Bytes::copy_from_slice(data), vec![data.len() as u32])
    }

    /// Mapped views of a stream's segments (several, with a small `segment_bytes`), with heap
    /// and small pieces between them, reach the peer byte for byte, the large mapped ones (and
    /// only those) by `sendfile`; with `sendfile` off, the same bytes arrive by `writev`.
    #[tokio::test]
    async fn mapped_slices_go_by_sendfile_and_arrive_intact() -> R {
        let dir = tempfile::tempdir()?;
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 64 << 10)?;
        let data = noise(400 << 10, 7);
        for chunk in data.chunks(48 << 10) {
            set.append(set.end(), &message(chunk))?;
        }
        let heap = Bytes::from(noise(40 << 10, 9));
        for (sendfile, from, to) in [
            (true, 0, data.len()),
            (true, 1000, 300_001),
            (true, 70_000, 90_000),
            (false, 3, 390_000),
        ] {
            let views = set
                .read_local(from as u64, to as u64)?
                .ok_or("range not held")?;
            let mut pieces = vec![Bytes::from_static(b"HTTP/1.1 200 OK\r\n\r\n")];
            for v in views {
                // A view split so that a small mapped piece sits between large ones.
                let cut = v.len().min(100);
                pieces.push(v.slice(..cut));
                pieces.push(v.slice(cut..));
                pieces.push(heap.clone());
            }
            let expect: Vec<u8> = pieces.concat();
            let (socket, client) = pair(sendfile).await?;
            let (got, file_bytes) = send(socket, client, &pieces).await?;
            assert!(
                got == expect,
                "bytes differ (sendfile {sendfile}, {from}..{to})"
            );
            let mapped_large: u64 = pieces
                .iter()
                .filter(|p| p.len() >= SENDFILE_MIN && FileRange::of(p).is_some())
                .map(|p| p.len() as u64)
                .sum();
            assert!(mapped_large > 0);
            assert_eq!(
                file_bytes,
                if sendfile { mapped_large } else { 0 },
                "sendfile {sendfile}, {from}..{to}"
            );
        }
        Ok(())
    }

    /// Under `Auto` a peer gets its bandwidth-delay product at 10 Gbit/s, at least 128 KiB, up
    /// to what the kernel would grow the buffer to; unknown round trips and ceilings, and
    /// products past the ceiling, keep the kernel's sizing.
    #[test]
    fn auto_size_is_the_bandwidth_delay_product_under_the_ceiling() {
        let us = Duration::from_micros;
        let four_mib = Some(4 << 20);
        assert_eq!(auto_size(Some(us(18)), four_mib), Some(128 << 10));
        assert_eq!(auto_size(Some(us(1_000)), four_mib), Some(1_250_000));
        assert_eq!(auto_size(Some(us(3_000)), four_mib), Some(3_750_000));
        assert_eq!(auto_size(Some(us(4_000)), four_mib), None);
        assert_eq!(auto_size(None, four_mib), None);
        assert_eq!(auto_size(Some(us(18)), None), None);
        // Stock Linux: wmem_max 208 KiB.
        assert_eq!(auto_size(Some(us(100)), Some(212_992)), Some(128 << 10));
        assert_eq!(auto_size(Some(us(200)), Some(212_992)), None);
        assert_eq!(auto_size(Some(us(18)), Some(100 << 10)), None);
    }

    /// On loopback `Auto` fixes the send buffer (the kernel reports twice what was set), `Os`
    /// leaves it, and `Bytes` is raised to the 64 KiB floor.
    #[tokio::test]
    async fn near_peers_get_a_fixed_send_buffer() -> R {
        let ceiling = crate::fs::send_buffer_ceiling().ok_or("no send-buffer ceiling")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let mut accepted = Vec::new();
        for policy in [SendBuffer::Auto, SendBuffer::Os, SendBuffer::Bytes(1_000)] {
            let client = TcpStream::connect(listener.local_addr()?).await?;
            let (server, _) = listener.accept().await?;
            let before = crate::fs::send_buffer(server.as_fd())?;
            let set = SendBuffers::new(policy).fit(&server);
            let after = crate::fs::send_buffer(server.as_fd())?;
            match policy {
                SendBuffer::Auto if ceiling >= SendBuffer::AUTO_MIN => {
                    // A loopback handshake is microseconds: the floor applies.
                    assert_eq!(set, Some(SendBuffer::AUTO_MIN));
                    assert_eq!(after, 2 * SendBuffer::AUTO_MIN);
                }
                SendBuffer::Auto => assert_eq!((set, after), (None, before)),
                SendBuffer::Os => assert_eq!((set, after), (None, before)),
                SendBuffer::Bytes(_) => {
                    assert_eq!(set, Some(SendBuffer::MIN));
                    assert_eq!(after, 2 * SendBuffer::MIN);
                }
            }
            accepted.push((client, server));
        }
        Ok(())
    }

    /// Mapped bodies arrive intact by `sendfile` through the smallest send buffer `--send-buffer`
    /// allows and through `Auto`'s.
    #[tokio::test]
    async fn sendfile_through_small_send_buffers_arrives_intact() -> R {
        let dir = tempfile::tempdir()?;
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 8 << 20)?;
        let data = noise(3 << 20, 5);
        for chunk in data.chunks(256 << 10) {
            set.append(set.end(), &message(chunk))?;
        }
        let views = set
            .read_local(0, data.len() as u64)?
            .ok_or("range not held")?;
        let expect: Vec<u8> = views.concat();
        for policy in [SendBuffer::Bytes(SendBuffer::MIN), SendBuffer::Auto] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let client = TcpStream::connect(listener.local_addr()?).await?;
            let (server, _) = listener.accept().await?;
            SendBuffers::new(policy).fit(&server);
            let socket = Socket::new(server, true, Duration::from_mins(1));
            let (got, file_bytes) = send(socket, client, &views).await?;
            assert!(got == expect, "bytes differ ({policy:?})");
            // By `sendfile`, all but at most the last piece under `SENDFILE_MIN` of each view
            // (a call that sends part of a view leaves a rest that small to `writev`).
            let least = expect.len() - views.len() * SENDFILE_MIN;
            assert!(
                file_bytes >= least as u64,
                "{file_bytes} of {} bytes by sendfile ({policy:?})",
                expect.len()
            );
        }
        Ok(())
    }

    /// A view keeps its file open: bytes of a segment whose files were unlinked and whose
    /// segment set was dropped are still sent from the file.
    #[tokio::test]
    async fn a_view_outlives_its_unlinked_segment() -> R {
        let dir = tempfile::tempdir()?;
        let data = noise(200 << 10, 11);
        let views = {
            let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20)?;
            set.append(Offset::ZERO, &message(&data))?;
            set.read_local(123, data.len() as u64)?
                .ok_or("range not held")?
        };
        for entry in std::fs::read_dir(dir.path())? {
            std::fs::remove_file(entry?.path())?;
        }
        let (socket, client) = pair(true).await?;
        let (got, file_bytes) = send(socket, client, &views).await?;
        assert!(got == data[123..], "bytes differ");
        assert_eq!(file_bytes, data.len() as u64 - 123);
        Ok(())
    }

    /// A peer that reads nothing: writes fill the socket's buffers, then stay pending, and the
    /// write pending at the stall limit fails with `TimedOut`. A peer that reads again in time
    /// resets the clock.
    #[tokio::test]
    async fn a_peer_that_stops_reading_is_given_up_after_the_stall_limit() -> R {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let mut client = TcpStream::connect(listener.local_addr()?).await?;
        let (server, _) = listener.accept().await?;
        let limit = Duration::from_millis(300);
        let mut socket = Socket::new(server, false, limit);
        let chunk = vec![7u8; 64 << 10];
        let started = std::time::Instant::now();
        let mut written = 0usize;
        let err = loop {
            match std::future::poll_fn(|cx| Pin::new(&mut socket).poll_write(cx, &chunk)).await {
                Ok(n) => written += n,
                Err(e) => break e,
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "never timed out"
            );
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(written > 0);
        assert!(started.elapsed() >= limit);
        // The client still gets what was written before the stall.
        let mut got = vec![0u8; 1024];
        client.read_exact(&mut got).await?;
        assert!(got.iter().all(|&b| b == 7));
        Ok(())
    }

    /// The Rust runtime ignores SIGPIPE before `main`, so `serve` uses `sendfile`.
    #[test]
    fn sigpipe_is_ignored_in_rust_programs() {
        assert!(crate::fs::sigpipe_is_handled());
    }
}
