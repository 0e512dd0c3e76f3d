//! The Redis protocol (RESP2 and RESP3) listener, `[listen] resp`: redis-cell's `CL.THROTTLE` over the
//! cluster, for clients of redis-cell and Dragonfly that switch by changing an address, and the
//! commands clients probe with ([`command`]).
//!
//! # Bounds
//!
//! Nothing a client sends grows without bound or panics ([`protocol`] bounds arguments, their
//! length and the length of lines before waiting for them). Per connection:
//!
//! - the input buffer holds at most one incomplete command, [`protocol::COMMAND_BYTES_MAX`]
//!   bytes, plus one read (into the buffer's spare capacity, reserved [`READ_BYTES`] at a time:
//!   the buffer stays under twice their sum);
//! - at most [`COMMANDS_PER_ROUND_MAX`] pipelined commands are answered before the replies are
//!   sent and the task yields, and replies are sent whenever [`OUTPUT_FLUSH_BYTES`] are pending;
//! - the first bytes must arrive within [`Timeouts::first_bytes`], a started command must be
//!   complete within [`Timeouts::command`], an idle connection is closed after
//!   [`Timeouts::idle`], and every write must be taken within [`Timeouts::write`]
//!   ([`crate::listener`], which also holds the connection bound `limits.connections_max`).
//!
//! A malformed frame is answered `-ERR Protocol error: …` and the connection closes, as Redis
//! does: the write side first, then, once what the client was still sending is drained (at most
//! [`crate::listener::DRAIN_BYTES_MAX`] bytes in [`crate::listener::DRAIN_TIMEOUT`]), the socket, so that the client reads the error
//! rather than a reset.
//!
//! # Protocols
//!
//! RESP2, and RESP3 after `HELLO 3` (redis-py 8 sends it on connect): the replies are the same in
//! both but for `HELLO`'s, `CONFIG GET`'s and `COMMAND DOCS`'s, which are maps in RESP3, and
//! nulls.
//!
//! # Pipelining
//!
//! Each round parses every complete command the buffer holds (at most
//! [`COMMANDS_PER_ROUND_MAX`]), answers them in order into one output buffer, and writes it
//! once. The buffers are the connection's, reused from round to round.

pub mod command;
/// RESP2 framing, in its own crate (`ratemeshd-wire`) so that the fuzz targets build it alone.
pub use ratemeshd_wire::resp as protocol;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_stream::wrappers::TcpListenerStream;
use tracing::debug;

use self::command::{Command, Flow, Session};
use self::protocol::ProtocolError;
use crate::daemon::Daemon;
use crate::listener::{FirstBytes, LimitedIncoming, LimitedStream, close_after_error, serve_connections};

/// How long a connection may take to send its first byte.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may take to complete a command it started.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may stay idle between commands (pooled client connections are idle
/// between requests; a minute of quiet is not a fault, an hour is a leak).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Bytes asked of the socket per read.
pub const READ_BYTES: usize = 16 * 1024;

/// Commands answered per round before the replies are sent and other connections run.
pub const COMMANDS_PER_ROUND_MAX: usize = 1024;

/// Pending reply bytes that are sent at once, mid-round (a pipeline of large `ECHO`s).
pub const OUTPUT_FLUSH_BYTES: usize = 64 * 1024;

/// The time bounds of the RESP listener. The defaults are the constants of this module; tests
/// shorten them to see them work without waiting seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// [`FIRST_BYTES_TIMEOUT`].
    pub first_bytes: Duration,
    /// [`COMMAND_TIMEOUT`].
    pub command: Duration,
    /// [`IDLE_TIMEOUT`].
    pub idle: Duration,
    /// [`crate::listener::WRITE_TIMEOUT`].
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            first_bytes: FIRST_BYTES_TIMEOUT,
            command: COMMAND_TIMEOUT,
            idle: IDLE_TIMEOUT,
            write: crate::listener::WRITE_TIMEOUT,
        }
    }
}

/// Serves RESP on `listener` until `shutdown` completes, then stops accepting, lets every
/// connection finish the round in progress, and returns once they all closed.
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: TcpListener,
    connections: Arc<Semaphore>,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) {
    let refused = daemon.metrics().connections_refused("resp");
    let incoming = LimitedIncoming::new(TcpListenerStream::new(listener), connections, "resp", refused)
        .first_bytes(FirstBytes { bytes: 1, timeout: timeouts.first_bytes })
        .write_timeout(timeouts.write);
    let next_id = AtomicU64::new(1);
    serve_connections(incoming, "RESP", shutdown, |stream, closing| {
        let session = Session::new(Arc::clone(&daemon), next_id.fetch_add(1, Ordering::Relaxed));
        serve_connection(session, stream, timeouts, closing)
    })
    .await;
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no complete command within {0:?}")]
    Timeout(Duration),
}

/// Serves one connection until the client closes it, `QUIT`, a protocol error, a deadline, or
/// `closing` turns true.
async fn serve_connection(
    mut session: Session,
    mut stream: LimitedStream,
    timeouts: Timeouts,
    mut closing: watch::Receiver<bool>,
) {
    let mut connection = Connection { input: Vec::new(), output: Vec::new(), args: Vec::new() };
    match connection.run(&mut session, &mut stream, timeouts, &mut closing).await {
        Ok(()) => {}
        Err(ConnectionError::Protocol(error)) => {
            connection.output.clear();
            protocol::error(&mut connection.output, &format!("ERR Protocol error: {error}"));
            close_after_error(&mut stream, &connection.output, &mut connection.input, &mut closing).await;
            debug!(%error, "RESP connection closed");
        }
        Err(error) => debug!(%error, "RESP connection closed"),
    }
}

/// A connection's reusable buffers.
struct Connection {
    /// Bytes read and not yet parsed.
    input: Vec<u8>,
    /// Replies not yet written.
    output: Vec<u8>,
    /// The arguments of the command being executed, as ranges of `input`.
    args: Vec<Range<usize>>,
}

impl Connection {
    async fn run(
        &mut self,
        session: &mut Session,
        stream: &mut LimitedStream,
        timeouts: Timeouts,
        closing: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnectionError> {
        let deadline = tokio::time::sleep(timeouts.idle);
        tokio::pin!(deadline);
        // Whether the deadline is a command's (set when its first bytes were buffered, and not
        // moved by later reads: a client trickling bytes cannot hold a command open) or idle.
        let mut command_started = false;
        // Each round answers what the buffer holds, then reads; ends on close, QUIT or an error.
        loop {
            let (flow, full_round, consumed) = self.answer_buffered(session, stream).await?;
            if flow == Flow::Close {
                return Ok(());
            }
            if full_round {
                // More commands may be buffered: answer them after other tasks had their turn.
                tokio::task::yield_now().await;
                continue;
            }
            // Here the buffer holds at most one incomplete command, within the parser's bound.
            let timeout = if self.input.is_empty() { timeouts.idle } else { timeouts.command };
            if self.input.is_empty() {
                command_started = false;
                deadline.as_mut().reset(tokio::time::Instant::now() + timeout);
            } else if !command_started || consumed > 0 {
                // A new command began (the first bytes after idling, or after complete ones).
                command_started = true;
                deadline.as_mut().reset(tokio::time::Instant::now() + timeout);
            }
            self.input.reserve(READ_BYTES);
            let read = tokio::select! {
                read = stream.read_buf(&mut self.input) => read?,
                () = &mut deadline => return Err(ConnectionError::Timeout(timeout)),
                // A closed sender is a server gone: closing too.
                _ = closing.wait_for(|closing| *closing) => return Ok(()),
            };
            if read == 0 {
                return Ok(());
            }
        }
    }

    /// Answers the complete commands of the input buffer, at most [`COMMANDS_PER_ROUND_MAX`], and
    /// writes the replies. Returns whether to close, whether the round was full, and how many
    /// bytes of input it consumed.
    async fn answer_buffered(
        &mut self,
        session: &mut Session,
        stream: &mut LimitedStream,
    ) -> Result<(Flow, bool, usize), ConnectionError> {
        let mut consumed = 0;
        let mut answered = 0;
        let mut flow = Flow::Continue;
        session.refresh();
        while answered < COMMANDS_PER_ROUND_MAX && flow == Flow::Continue {
            let input = &self.input[consumed..];
            let parsed = match protocol::parse(input, &mut self.args) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(error) => {
                    // What was answered goes out before the protocol error.
                    stream.write_all(&self.output).await?;
                    return Err(error.into());
                }
            };
            if !self.args.is_empty() {
                flow = session.execute(Command { input, args: &self.args }, &mut self.output).await;
                answered += 1;
            }
            consumed += parsed;
            if self.output.len() >= OUTPUT_FLUSH_BYTES {
                stream.write_all(&self.output).await?;
                self.output.clear();
            }
        }
        self.input.drain(..consumed);
        if !self.output.is_empty() {
            stream.write_all(&self.output).await?;
            self.output.clear();
        }
        Ok((flow, answered == COMMANDS_PER_ROUND_MAX, consumed))
    }
}
