//! The daemon's TCP listeners: a bound on open connections, a deadline for a connection's
//! first bytes, and one for every write.
//!
//! [`LimitedIncoming`] accepts connections from a stream of accepted sockets and lets each one
//! through only with a permit of a semaphore (`limits.connections_max` of them per listener),
//! held by the [`LimitedStream`] for the connection's whole life. A connection accepted when no
//! permit is free is closed at once: the client sees its connection closed right away instead
//! of waiting in the kernel's backlog for a slot, and every connection that is served costs a
//! bounded amount of memory and file descriptors. Requests in flight have their own, smaller
//! bounds (`limits.http_in_flight_max`); this one covers idle and slow connections, which hold
//! no request permit.
//!
//! A client that sends requests and never reads the answers (a slow reader) would hold its slot
//! forever: the server's writes wait for room in a socket buffer that never drains, and nothing
//! else times out a write. So a connection may also get a write deadline ([`LimitedIncoming::
//! write_timeout`]): a write the socket does not take whole within it fails, and the server closes
//! the connection. It runs from the moment a write is blocked or only partly taken, and stops
//! only once a write is taken whole: a reader that drains a byte at a time makes progress but
//! still stalls every write, and is cut off.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt as _};
use tracing::{debug, warn};

/// How long a write may wait for the client to take it (see the module documentation), for
/// both servers: an answer is a few hundred bytes to a few kilobytes, which a client that reads
/// takes at once.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the listener pauses after a failed `accept` (file descriptors exhausted): accepting
/// again at once would spin a core while nothing can be accepted.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The most connections refused in one poll before the listener yields to other tasks: a flood
/// of connections while the bound is reached must not keep one worker thread busy forever.
const REFUSALS_PER_POLL_MAX: usize = 64;

/// A deadline for a connection's first bytes: the connection must send `bytes` bytes within
/// `timeout` of being accepted, or reading from it fails (and the server closes it).
///
/// The gRPC server uses it for the HTTP/2 connection preface, which it waits for without a
/// timeout of its own: a client that opens connections and sends nothing would otherwise hold
/// every connection slot forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstBytes {
    /// How many bytes.
    pub bytes: usize,
    /// Within how long.
    pub timeout: Duration,
}

/// Connections from `incoming` (accepted sockets), each with one of `permits`; see the module
/// documentation. A stream of `io::Result<LimitedStream>` that never ends by itself.
pub struct LimitedIncoming<S> {
    incoming: S,
    permits: Arc<Semaphore>,
    server: &'static str,
    refused: Counter,
    first_bytes: Option<FirstBytes>,
    write_timeout: Option<Duration>,
    /// Set after an accept error: nothing is accepted until it fires.
    pause: Option<Pin<Box<Sleep>>>,
}

impl<S> std::fmt::Debug for LimitedIncoming<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedIncoming")
            .field("server", &self.server)
            .field("permits_free", &self.permits.available_permits())
            .field("first_bytes", &self.first_bytes)
            .field("write_timeout", &self.write_timeout)
            .finish()
    }
}

impl<S> LimitedIncoming<S>
where
    S: Stream<Item = io::Result<TcpStream>> + Unpin,
{
    /// Connections accepted by `incoming`, at most as many open at once as `permits` has;
    /// `server` (`http` or `grpc`) names the listener in logs, and `refused` counts the
    /// connections closed for lack of a permit.
    pub fn new(incoming: S, permits: Arc<Semaphore>, server: &'static str, refused: Counter) -> Self {
        LimitedIncoming {
            incoming,
            permits,
            server,
            refused,
            first_bytes: None,
            write_timeout: None,
            pause: None,
        }
    }

    /// Every connection must send its first bytes within a deadline ([`FirstBytes`]).
    pub fn first_bytes(self, first_bytes: FirstBytes) -> Self {
        LimitedIncoming { first_bytes: Some(first_bytes), ..self }
    }

    /// Every write of every connection must be taken whole by the socket within `timeout` (see
    /// the module documentation).
    pub fn write_timeout(self, timeout: Duration) -> Self {
        LimitedIncoming { write_timeout: Some(timeout), ..self }
    }
}

impl<S> Stream for LimitedIncoming<S>
where
    S: Stream<Item = io::Result<TcpStream>> + Unpin,
{
    type Item = io::Result<LimitedStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(pause) = &mut this.pause {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.pause = None;
        }
        for _ in 0..REFUSALS_PER_POLL_MAX {
            let stream = match Pin::new(&mut this.incoming).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(error))) => {
                    warn!(server = this.server, %error, "accept failed");
                    this.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_ERROR_PAUSE)));
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(Some(Ok(stream))) => stream,
            };
            match Arc::clone(&this.permits).try_acquire_owned() {
                Ok(permit) => {
                    let first_bytes = this.first_bytes.map(|first| FirstBytesDeadline {
                        remaining: first.bytes,
                        timeout: first.timeout,
                        deadline: Box::pin(tokio::time::sleep(first.timeout)),
                    });
                    let write = this.write_timeout.map(|timeout| WriteDeadline { timeout, stalled: None });
                    return Poll::Ready(Some(Ok(LimitedStream {
                        stream,
                        _permit: permit,
                        first_bytes,
                        write,
                    })));
                }
                Err(_) => {
                    // Dropping the socket closes it: the client sees its connection end at once.
                    this.refused.inc();
                    debug!(server = this.server, peer = ?stream.peer_addr().ok(), "connection refused: limits.connections_max reached");
                }
            }
        }
        // Refused a burst of connections: let other tasks run, and come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The first-bytes deadline of one connection, until its bytes arrived.
struct FirstBytesDeadline {
    remaining: usize,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

/// The write deadline of one connection: running while a write is stalled.
struct WriteDeadline {
    timeout: Duration,
    /// Since a write was blocked or only partly taken, until one is taken whole.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteDeadline {
    /// Passes on the outcome of a write or flush (`taken`: whether the socket took it whole),
    /// starting, stopping or enforcing the deadline.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
        taken: impl Fn(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        match &polled {
            Poll::Ready(Ok(value)) if taken(value) => {
                self.stalled = None;
                return polled;
            }
            Poll::Ready(Err(_)) => return polled,
            Poll::Ready(Ok(_)) | Poll::Pending => {}
        }
        let timeout = self.timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            let message = format!("a write was not taken by the client within {timeout:?} (a slow reader)");
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)));
        }
        polled
    }
}

/// An accepted connection holding its connection permit until it is dropped.
pub struct LimitedStream {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    first_bytes: Option<FirstBytesDeadline>,
    write: Option<WriteDeadline>,
}

impl std::fmt::Debug for LimitedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedStream").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl LimitedStream {
    /// The socket.
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(first) = &mut this.first_bytes else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                // 0 is the end of the stream: nothing more to wait for.
                if read == 0 || read >= first.remaining {
                    this.first_bytes = None;
                } else {
                    first.remaining -= read;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if first.deadline.as_mut().poll(cx).is_ready() {
                    let message =
                        format!("the connection's first bytes did not arrive within {:?}", first.timeout);
                    this.first_bytes = None;
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)));
                }
                Poll::Pending
            }
            error => error,
        }
    }
}

/// tonic's server (the RLQS listener) serves a [`LimitedIncoming`]: the peer's address as its
/// connection info, as for a plain `TcpStream`.
impl tonic::transport::server::Connected for LimitedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        match &mut this.write {
            Some(deadline) => deadline.check(cx, polled, |&written| written == buf.len()),
            None => polled,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len: usize = bufs.iter().map(|buf| buf.len()).sum();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        match &mut this.write {
            Some(deadline) => deadline.check(cx, polled, |&written| written == len),
            None => polled,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        match &mut this.write {
            Some(deadline) => deadline.check(cx, polled, |()| true),
            None => polled,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The most bytes read and dropped after a protocol error, before the connection closes
/// (`close_after_error`).
pub const DRAIN_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The longest the client's input is drained after a protocol error (`close_after_error`).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Closes a connection after a protocol error: writes `reply` (the error, in the protocol's
/// terms), shuts the write side, and reads and drops what the client still sends for a moment
/// (at most [`DRAIN_BYTES_MAX`] bytes within [`DRAIN_TIMEOUT`], into `buffer`): a socket
/// closed with unread input answers it with a reset, and a client that was still sending would
/// get the reset instead of the error. The connection closes either way, at once when the
/// server is closing. The RESP and gRPC listeners both close this way.
pub(crate) async fn close_after_error(
    stream: &mut LimitedStream,
    reply: &[u8],
    buffer: &mut Vec<u8>,
    closing: &mut watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if stream.write_all(reply).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut drained = 0;
        while drained < DRAIN_BYTES_MAX {
            buffer.clear();
            buffer.reserve(16 * 1024);
            match stream.read_buf(buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => drained += read,
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(DRAIN_TIMEOUT, drain) => {}
        // A closed sender is a server gone: closing too.
        _ = closing.wait_for(|closing| *closing) => {}
    }
}

/// Serves every connection of `incoming` with `serve` until `shutdown` completes, then stops
/// accepting, tells every connection to close (`closing` turns true: each finishes what it is
/// doing first) and returns once they all did. The HTTP, gRPC and RESP listeners run on it. The
/// connections are tasks of this future: dropping it (the drain timeout) drops them. Every
/// connection gets TCP_NODELAY: requests and answers are small pairs, and Nagle's algorithm would
/// hold each answer back waiting for the client's delayed ACK.
pub(crate) async fn serve_connections<F>(
    mut incoming: LimitedIncoming<TcpListenerStream>,
    server: &'static str,
    shutdown: impl std::future::Future<Output = ()>,
    mut serve: impl FnMut(LimitedStream, watch::Receiver<bool>) -> F,
) where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (closing_tx, closing) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    // Runs until shutdown; the listener's stream never ends by itself.
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            // Reaps finished connections, so that the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = incoming.next() => accepted,
        };
        let stream = match accepted {
            Some(Ok(stream)) => stream,
            // Logged, and paused after, by the listener.
            Some(Err(_)) => continue,
            None => break,
        };
        if let Err(error) = stream.get_ref().set_nodelay(true) {
            debug!(%error, server, "cannot set TCP_NODELAY");
        }
        connections.spawn(serve(stream, closing.clone()));
    }
    drop(incoming);
    closing_tx.send_replace(true);
    // Bounded by the connections open at shutdown (no more are accepted), each of which closes
    // after what it is doing; the drain timeout bounds the whole.
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use tokio_stream::StreamExt as _;
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;

    const BOUND: Duration = Duration::from_secs(20);

    /// A listener whose accepted connections arrive on a channel, with `permits` permits.
    async fn serve(
        permits: usize,
        first_bytes: Option<FirstBytes>,
    ) -> (std::net::SocketAddr, mpsc::UnboundedReceiver<LimitedStream>, Counter) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("bound");
        let refused = Counter::default();
        let mut incoming = LimitedIncoming::new(
            TcpListenerStream::new(listener),
            Arc::new(Semaphore::new(permits)),
            "test",
            refused.clone(),
        );
        if let Some(first_bytes) = first_bytes {
            incoming = incoming.first_bytes(first_bytes);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Ends when the test drops the receiver.
            while let Some(Ok(stream)) = incoming.next().await {
                if tx.send(stream).is_err() {
                    break;
                }
            }
        });
        (addr, rx, refused)
    }

    #[tokio::test]
    async fn a_connection_beyond_the_bound_is_closed_at_once() {
        let (addr, mut accepted, refused) = serve(1, None).await;
        let _first = TcpStream::connect(addr).await.expect("connects");
        let held = tokio::time::timeout(BOUND, accepted.recv()).await.expect("accepted").expect("open");
        let mut second = TcpStream::connect(addr).await.expect("connects");
        let mut buffer = Vec::new();
        let read = tokio::time::timeout(BOUND, second.read_to_end(&mut buffer)).await.expect("closed");
        // Closed or reset, with nothing sent.
        if let Err(error) = read {
            assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
        }
        assert!(buffer.is_empty(), "{buffer:?}");
        assert_eq!(refused.get(), 1);
        // The permit comes back with the connection.
        drop(held);
        let _third = TcpStream::connect(addr).await.expect("connects");
        tokio::time::timeout(BOUND, accepted.recv()).await.expect("accepted").expect("open");
        assert_eq!(refused.get(), 1);
    }

    #[tokio::test]
    async fn the_first_bytes_must_arrive_in_time() {
        let timeout = Duration::from_millis(50);
        let (addr, mut accepted, _) = serve(2, Some(FirstBytes { bytes: 4, timeout })).await;

        // Two bytes of four, then silence: reading fails with the deadline's error.
        let mut slow = TcpStream::connect(addr).await.expect("connects");
        slow.write_all(b"ab").await.expect("sends");
        let mut server = tokio::time::timeout(BOUND, accepted.recv()).await.expect("accepted").expect("open");
        let mut buffer = [0_u8; 8];
        let mut read = 0;
        // Bounded: every round reads a byte or more of the two sent, or ends.
        let error = loop {
            match tokio::time::timeout(BOUND, server.read(&mut buffer[read..])).await.expect("bounded") {
                Ok(n) => {
                    assert!(n > 0 && read + n <= 2, "{n}");
                    read += n;
                }
                Err(error) => break error,
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");

        // Four bytes in time: the deadline is gone, a silent connection is just idle.
        let mut prompt = TcpStream::connect(addr).await.expect("connects");
        prompt.write_all(b"abcd").await.expect("sends");
        let mut server = tokio::time::timeout(BOUND, accepted.recv()).await.expect("accepted").expect("open");
        let mut buffer = [0_u8; 4];
        tokio::time::timeout(BOUND, server.read_exact(&mut buffer)).await.expect("bounded").expect("reads");
        let idle = tokio::time::timeout(timeout * 4, server.read(&mut buffer)).await;
        assert!(idle.is_err(), "still open, no error: {idle:?}");
    }
}
