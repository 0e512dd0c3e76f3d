//! The Redis protocol listener of an in-process daemon on an ephemeral loopback port, spoken over
//! raw RESP2: redis-cell's `CL.THROTTLE` answers (the numbers redis-cell gives for the same
//! sequence), pipelining, the probing commands, malformed and hostile frames, a started command's
//! deadline, and metrics.
//!
//! Every wait is bounded by [`TIMEOUT`]; nothing sleeps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ratemeshd::client;
use ratemeshd::daemon::{ConfigSource, Daemon};
use ratemeshd::serve::{self, Options, Servers};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

/// The bound of every wait.
const TIMEOUT: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
[listen]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"
resp = "127.0.0.1:0"
gossip = "127.0.0.1:0"
quic = "127.0.0.1:0"
"#;

/// A reply, as a client reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
    /// RESP3's map: its keys and values alternating.
    Map(Vec<Reply>),
    /// RESP3's null.
    Null,
}

/// A daemon with a RESP listener, its configuration in a scratch file.
struct Harness {
    servers: Option<Servers>,
    dir: PathBuf,
}

impl Harness {
    async fn start(name: &str, options: Options) -> Harness {
        let dir = std::env::temp_dir().join(format!("ratemeshd-resp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let path = dir.join("ratemesh.toml");
        std::fs::write(&path, CONFIG).expect("write config");
        let mut source = ConfigSource::new(path, std::iter::empty());
        let config = source.load().expect("valid config");
        let daemon = Daemon::start_with_source(config, Some(source)).await.expect("daemon starts");
        let servers = serve::start_with(Arc::clone(&daemon), options).await.expect("servers start");
        assert!(daemon.is_ready(), "{:?}", daemon.not_ready_reason());
        Harness { servers: Some(servers), dir }
    }

    fn servers(&self) -> &Servers {
        self.servers.as_ref().expect("serving")
    }

    async fn connect(&self) -> Client {
        let addr = self.servers().resp_addr().expect("RESP listener bound");
        assert_ne!(addr.port(), 0);
        let stream = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("bounded")
            .expect("connects");
        Client { stream: BufReader::new(stream) }
    }

    async fn metrics(&self) -> String {
        let addr = self.servers().http_addr().to_string();
        let response = client::request(&addr, "GET", "/metrics", &[], &[], TIMEOUT).await.expect("an answer");
        String::from_utf8(response.body).expect("text")
    }

    async fn stop(mut self) {
        if let Some(servers) = self.servers.take() {
            servers.shutdown().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Client {
    stream: BufReader<TcpStream>,
}

impl Client {
    async fn send(&mut self, bytes: &[u8]) {
        self.stream.get_mut().write_all(bytes).await.expect("sends");
    }

    async fn call(&mut self, args: &[&str]) -> Reply {
        self.send(&encode(args)).await;
        self.reply().await
    }

    async fn reply(&mut self) -> Reply {
        tokio::time::timeout(TIMEOUT, read_reply(&mut self.stream)).await.expect("bounded").expect("a reply")
    }

    /// Whether the server closed the connection (after any bytes still to read).
    async fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        match tokio::time::timeout(TIMEOUT, self.stream.read_to_end(&mut rest)).await.expect("bounded") {
            Ok(_) => rest.is_empty(),
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    /// `CL.THROTTLE`'s five integers.
    async fn throttle(&mut self, args: &[&str]) -> [i64; 5] {
        let mut command = vec!["CL.THROTTLE"];
        command.extend_from_slice(args);
        integers(self.call(&command).await)
    }
}

fn integers(reply: Reply) -> [i64; 5] {
    let Reply::Array(Some(items)) = reply else { panic!("not an array: {reply:?}") };
    let values: Vec<i64> = items
        .iter()
        .map(|item| match item {
            Reply::Integer(value) => *value,
            other => panic!("not an integer: {other:?}"),
        })
        .collect();
    values.try_into().expect("five integers")
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

fn read_reply(
    stream: &mut BufReader<TcpStream>,
) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Reply>> + Send + '_>> {
    Box::pin(async move {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1);
        let number = || rest.parse::<i64>().expect("a number");
        Ok(match kind {
            "+" => Reply::Simple(rest.to_owned()),
            "-" => Reply::Error(rest.to_owned()),
            ":" => Reply::Integer(number()),
            "$" if number() < 0 => Reply::Bulk(None),
            "$" => {
                let mut bytes = vec![0; usize::try_from(number()).expect("length") + 2];
                stream.read_exact(&mut bytes).await?;
                bytes.truncate(bytes.len() - 2);
                Reply::Bulk(Some(bytes))
            }
            "*" if number() < 0 => Reply::Array(None),
            "*" => {
                let mut items = Vec::new();
                for _ in 0..number() {
                    items.push(read_reply(stream).await?);
                }
                Reply::Array(Some(items))
            }
            "%" => {
                let mut items = Vec::new();
                for _ in 0..2 * number() {
                    items.push(read_reply(stream).await?);
                }
                Reply::Map(items)
            }
            "_" => Reply::Null,
            other => panic!("unknown reply type {other:?} in {line:?}"),
        })
    })
}

fn simple(text: &str) -> Reply {
    Reply::Simple(text.to_owned())
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_owned())
}

/// redis-cell's numbers for one key, worked out from its GCRA: `max_burst` 4, 5 per 60 s, so
/// the emission interval T = 12 s, the tolerance τ = 5 × T = 60 s and the limit 5. Each hit
/// moves the theoretical arrival time (TAT) 12 s later; a hit passes while TAT − now ≤ 60 s after
/// it. Commands follow each other within milliseconds, and redis-cell rounds a time up to the
/// next second when its fraction has a millisecond, so 11.999 s is 12.
#[tokio::test]
async fn cl_throttle_answers_as_redis_cell() {
    let h = Harness::start("throttle", Options::default()).await;
    let mut c = h.connect().await;
    let limit = ["user:1", "4", "5", "60"];
    // Hits 1 to 5 pass: remaining 4..0, the bucket full again 12, 24, … 60 s later.
    for hit in 1..=5 {
        let expected = [0, 5, 5 - hit, -1, 12 * hit];
        assert_eq!(c.throttle(&limit).await, expected, "hit {hit}");
    }
    // The 6th is refused: it passes once one interval drained (12 s); TAT is 60 s ahead.
    assert_eq!(c.throttle(&limit).await, [1, 5, 0, 12, 60]);
    // Quantity 0 peeks: never limited, nothing counted.
    assert_eq!(c.throttle(&["user:1", "4", "5", "60", "0"]).await, [0, 5, 0, -1, 60]);
    // More than the burst can ever hold: limited, no retry time (-1), nothing counted.
    assert_eq!(c.throttle(&["user:1", "4", "5", "60", "6"]).await, [1, 5, 0, -1, 60]);
    assert_eq!(c.throttle(&["fresh", "4", "5", "60", "6"]).await, [1, 5, 5, -1, 0]);
    // A whole burst at once on a fresh key.
    assert_eq!(c.throttle(&["burst", "4", "5", "60", "5"]).await, [0, 5, 0, -1, 60]);
    // Other parameters are another bucket: 5 per 61 s (T = 12.2 s, reset rounded up to 13).
    assert_eq!(c.throttle(&["user:1", "4", "5", "61"]).await, [0, 5, 4, -1, 13]);
    // max_burst 0: one at a time.
    assert_eq!(c.throttle(&["single", "0", "1", "10"]).await, [0, 1, 0, -1, 10]);
    assert_eq!(c.throttle(&["single", "0", "1", "10"]).await, [1, 1, 0, 10, 10]);

    // Decisions are counted like the HTTP API's inline checks.
    let metrics = h.metrics().await;
    let allowed = r#"ratemesh_requests_total{policy="inline",decision="allowed"} 8"#;
    let refused = r#"ratemesh_requests_total{policy="inline",decision="refused"} 5"#;
    assert!(metrics.contains(allowed) && metrics.contains(refused), "{metrics}");
    h.stop().await;
}

#[tokio::test]
async fn cl_throttle_refuses_bad_arguments_with_redis_cells_errors() {
    let h = Harness::start("arguments", Options::default()).await;
    let mut c = h.connect().await;
    let usage = "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";
    assert_eq!(c.call(&["CL.THROTTLE", "k", "1", "2"]).await, error(usage));
    assert_eq!(
        c.call(&["cl.throttle", "k", "x", "2", "3"]).await,
        error("Cell error: Couldn't parse as integer: x")
    );
    assert_eq!(
        c.call(&["CL.THROTTLE", "k", "1", "0", "3"]).await,
        error("Cell error: Zero rates are not supported")
    );
    assert_eq!(
        c.call(&["CL.THROTTLE", "k", "1", "2", "3", "-1"]).await,
        error("Cell error: Negative values are not supported: -1")
    );
    // Limits the daemon cannot hold are worded in the command's terms: max_burst (the capacity
    // less one) and a period in seconds.
    assert_eq!(
        c.call(&["CL.THROTTLE", "k", "1", "1", "3153600000"]).await,
        error("Cell error: max_burst is too large for this rate (at most 0)")
    );
    assert_eq!(
        c.call(&["CL.THROTTLE", "k", "1", "1", "9999999999"]).await,
        error("Cell error: period is too large (at most 3153600000 s, 100 years)")
    );
    // The connection goes on.
    assert_eq!(c.call(&["PING"]).await, simple("PONG"));
    h.stop().await;
}

#[tokio::test]
async fn a_pipeline_is_answered_in_order() {
    let h = Harness::start("pipeline", Options::default()).await;
    let mut c = h.connect().await;
    let mut batch = Vec::new();
    for _ in 0..20 {
        batch.extend(encode(&["CL.THROTTLE", "piped", "9", "10", "60"]));
    }
    batch.extend(encode(&["ECHO", "done"]));
    // Sent in fragments that cut commands anywhere.
    for chunk in batch.chunks(7) {
        c.send(chunk).await;
    }
    for hit in 1..=20 {
        let [limited, limit, remaining, _, _] = integers(c.reply().await);
        let expected = if hit <= 10 { (0, 10 - hit) } else { (1, 0) };
        assert_eq!((limited, limit, remaining), (expected.0, 10, expected.1), "hit {hit}");
    }
    assert_eq!(c.reply().await, Reply::Bulk(Some(b"done".to_vec())));
    h.stop().await;
}

#[tokio::test]
async fn the_commands_clients_probe_with_are_answered() {
    let h = Harness::start("probes", Options::default()).await;
    let mut c = h.connect().await;
    assert_eq!(c.call(&["ping"]).await, simple("PONG"));
    assert_eq!(c.call(&["PING", "hi"]).await, Reply::Bulk(Some(b"hi".to_vec())));
    assert_eq!(c.call(&["ECHO", "x y"]).await, Reply::Bulk(Some(b"x y".to_vec())));
    assert_eq!(c.call(&["SELECT", "0"]).await, simple("OK"));
    assert_eq!(c.call(&["SELECT", "1"]).await, error("ERR DB index is out of range"));
    assert_eq!(c.call(&["CLIENT", "SETNAME", "me"]).await, simple("OK"));
    assert_eq!(c.call(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]).await, simple("OK"));
    assert_eq!(c.call(&["COMMAND", "DOCS"]).await, Reply::Array(Some(Vec::new())));
    assert_eq!(c.call(&["COMMAND", "COUNT"]).await, Reply::Integer(10));
    let persistence = c.call(&["CONFIG", "GET", "save", "appendonly", "maxmemory"]).await;
    let bulks = ["save", "", "appendonly", "no"].map(|text| Reply::Bulk(Some(text.as_bytes().to_vec())));
    assert_eq!(persistence, Reply::Array(Some(bulks.to_vec())));
    assert_eq!(c.call(&["HELLO", "4"]).await, error("NOPROTO unsupported protocol version"));
    assert_eq!(
        c.call(&["HELLO", "x"]).await,
        error("ERR Protocol version is not an integer or out of range")
    );
    let no_auth = error(
        "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
    );
    assert_eq!(c.call(&["AUTH", "secret"]).await, no_auth);
    // The default user has no password, so it takes any, as Redis's does; another user is not.
    assert_eq!(c.call(&["AUTH", "default", "secret"]).await, simple("OK"));
    let wrong = error("WRONGPASS invalid username-password pair or user is disabled.");
    assert_eq!(c.call(&["AUTH", "alice", "secret"]).await, wrong);
    assert_eq!(c.call(&["HELLO", "3", "AUTH", "alice", "secret"]).await, wrong);
    // RESP3 (redis-py 8 asks for it on connect): maps and nulls take their RESP3 forms.
    let hello = c.call(&["HELLO", "3", "AUTH", "default", "secret", "SETNAME", "me"]).await;
    let Reply::Map(hello) = hello else { panic!("HELLO 3 answers a RESP3 map") };
    assert_eq!(hello[4..6], [Reply::Bulk(Some(b"proto".to_vec())), Reply::Integer(3)]);
    assert_eq!(c.call(&["CONFIG", "GET", "appendonly"]).await, Reply::Map(bulks[2..].to_vec()));
    assert_eq!(c.call(&["COMMAND", "INFO", "get"]).await, Reply::Array(Some(vec![Reply::Null])));
    assert_eq!(c.call(&["COMMAND", "DOCS"]).await, Reply::Map(Vec::new()));
    let throttled = c.call(&["CL.THROTTLE", "resp3", "4", "5", "60"]).await;
    assert_eq!(throttled, Reply::Array(Some([0, 5, 4, -1, 12].map(Reply::Integer).to_vec())));
    let Reply::Array(Some(hello)) = c.call(&["HELLO", "2"]).await else { panic!("HELLO 2 answers a map") };
    assert_eq!(
        hello[0..2],
        [Reply::Bulk(Some(b"server".to_vec())), Reply::Bulk(Some(b"ratemeshd".to_vec()))]
    );
    assert_eq!(hello[4..6], [Reply::Bulk(Some(b"proto".to_vec())), Reply::Integer(2)]);
    assert_eq!(
        c.call(&["GET", "k"]).await,
        error("ERR unknown command 'GET', with args beginning with: 'k' ")
    );
    // Inline, as telnet sends it.
    c.send(b"PING\r\n").await;
    assert_eq!(c.reply().await, simple("PONG"));
    assert_eq!(c.call(&["QUIT"]).await, simple("OK"));
    assert!(c.closed().await, "QUIT closes");
    h.stop().await;
}

#[tokio::test]
async fn malformed_and_hostile_frames_close_the_connection_with_a_protocol_error() {
    let h = Harness::start("hostile", Options::default()).await;
    let cases: [(&[u8], &str); 4] = [
        (b"*1\r\n$x\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*1\r\n$999999999999\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*100000\r\n", "ERR Protocol error: 100000 arguments, at most 16 are accepted"),
        (b"*1\r\n:1\r\n", "ERR Protocol error: expected '$', got ':'"),
    ];
    for (frame, expected) in cases {
        let mut c = h.connect().await;
        // A command answered before the bad frame keeps its answer, in order.
        let mut bytes = encode(&["PING"]);
        bytes.extend_from_slice(frame);
        c.send(&bytes).await;
        assert_eq!(c.reply().await, simple("PONG"));
        assert_eq!(c.reply().await, error(expected));
        assert!(c.closed().await, "closed after {expected}");
    }
    // An argument beyond the bound while the client is still sending it (more than the socket
    // buffers hold, so the send completes only if the server reads): the send completes and
    // the error arrives (the server drains what follows before closing), not a reset.
    let mut c = h.connect().await;
    let mut bytes = b"*2\r\n$4\r\nECHO\r\n$12582912\r\n".to_vec();
    bytes.resize(bytes.len() + 12 * 1024 * 1024, b'x');
    c.send(&bytes).await;
    assert_eq!(c.reply().await, error("ERR Protocol error: invalid bulk length"));
    assert!(c.closed().await);
    // A length line that never ends.
    let mut c = h.connect().await;
    c.send(&[b'*'; 64]).await;
    assert_eq!(c.reply().await, error("ERR Protocol error: too big mbulk count string"));
    assert!(c.closed().await);
    // The server is still serving.
    assert_eq!(h.connect().await.call(&["PING"]).await, simple("PONG"));
    h.stop().await;
}

/// An HTTP request sent to the RESP port (what a browser's page can do) runs none of the
/// commands in its body: its `POST` line, or the `Host:` header after another method's line,
/// closes the connection, as Redis does.
#[tokio::test]
async fn an_http_request_to_the_port_runs_nothing() {
    let h = Harness::start("http", Options::default()).await;
    let body = "CL.THROTTLE victim 0 1 86400\r\n";
    for line in ["POST / HTTP/1.1", "GET / HTTP/1.1", "PUT /x HTTP/1.1"] {
        let request = format!(
            "{line}\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut c = h.connect().await;
        c.send(request.as_bytes()).await;
        if !line.starts_with("POST") {
            // The request line is an unknown command; its Host header closes.
            assert!(matches!(c.reply().await, Reply::Error(_)), "{line}");
        }
        assert!(c.closed().await, "{line}: closed");
    }
    // The victim's bucket was never touched: a fresh one (limit 1, 1 remaining before this hit).
    let mut c = h.connect().await;
    assert_eq!(c.throttle(&["victim", "0", "1", "86400", "0"]).await, [0, 1, 1, -1, 0]);
    h.stop().await;
}

#[tokio::test]
async fn a_started_command_must_be_completed_in_time() {
    let mut options = Options::default();
    options.resp.command = Duration::from_millis(100);
    let h = Harness::start("deadline", options).await;
    let mut c = h.connect().await;
    assert_eq!(c.call(&["PING"]).await, simple("PONG"));
    // Half a command, then silence: the server closes the connection at its deadline.
    c.send(b"*2\r\n$4\r\nECHO\r\n").await;
    assert!(c.closed().await, "closed at the command deadline");

    // A command trickled a byte at a time (the pace is the slow client under test, not a wait
    // for the server): the deadline runs from its first byte, later bytes do not move it.
    let mut c = h.connect().await;
    c.send(b"*2\r\n$4\r\nECHO\r\n$1000\r\n").await;
    let mut sent = 0;
    // Bounded: 60 bytes, 20 ms apart, 1.2 s in all: far beyond the 100 ms deadline.
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if c.stream.get_mut().write_all(b"x").await.is_err() {
            break;
        }
        sent += 1;
    }
    assert!(sent < 60, "the connection took every trickled byte: the deadline moved with them");
    assert!(c.closed().await, "closed at the command deadline although bytes kept coming ({sent} sent)");
    h.stop().await;
}

#[tokio::test]
async fn the_listener_is_off_unless_configured() {
    let dir = std::env::temp_dir().join(format!("ratemeshd-resp-off-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("ratemesh.toml");
    std::fs::write(&path, CONFIG.replace("resp = \"127.0.0.1:0\"\n", "")).expect("write config");
    let mut source = ConfigSource::new(path, std::iter::empty());
    let daemon =
        Daemon::start_with_source(source.load().expect("valid"), Some(source)).await.expect("starts");
    let servers = serve::start(daemon).await.expect("servers start");
    assert_eq!(servers.resp_addr(), None);
    servers.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
