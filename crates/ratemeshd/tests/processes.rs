//! Long (one file of real-process tests): every test shares the cluster harness, and starting
//! processes is costly enough that the tests are few and each checks much.
//!
//! Three `ratemeshd serve` processes on loopback form one cluster with one shared secret (nodes 2
//! and 3 seeded by node 1), and hold the protocol's bounds while requests are spread over their
//! three HTTP endpoints:
//!
//! - exact mode: 300 checks of one key admit exactly the limit (100);
//! - approximate mode: within the limit plus the followers' local shares (see [`approx_bound`]);
//! - node 3 killed (SIGKILL): nodes 1 and 2 see it dead, and a fresh key admits at most the
//!   reachable fraction of the limit, 2/3 (ARCHITECTURE.md, "The cluster protocol": an owner
//!   enforces `limit × reachable / (live + dead)`): never a reset to a full bucket;
//! - node 3 restarted with the same id and addresses: it rejoins, three live members, and the
//!   cluster admits exactly the limit again.
//!
//! A second test, run by `.ci/run` with its output shown (it is `#[ignore]`d in the plain
//! `cargo test`), measures and prints a graceful shutdown: node 3 of three gets SIGTERM, answers
//! `/readyz` 503 at once and keeps answering while it leaves and hands its keys over, then exits
//! 0; the keys it owned keep their counts on their new owners.
//! And with data directories (durable quotas): 100-per-day keys in exact and approximate mode
//! spent to 40 remaining keep at most 40 across a graceful stop of all three processes, and lose
//! at most the hits after the last snapshot when all three are SIGKILLed (see
//! [`three_processes_keep_daily_quotas_across_a_full_restart_and_a_kill_of_all`]).
//! And top keys: three abusive keys among 10 000 normal ones, checked in batches through all three
//! nodes, come first in `GET /v1/top` (by refused hits and by demand) on every node, every count
//! within the reported bound; bad queries are 400 naming the field; the near-limit counters add
//! up; `ratemeshd top` prints the same ranking; a killed member is left out of the answer
//! ([`three_processes_list_three_abusive_keys_among_ten_thousand_first_on_every_node`]).
//!
//! And concurrency leases: taken through all three nodes and released through another node each,
//! round after round in both modes, and after a crash of a node they were taken through and of
//! the key's owner, all come back
//! ([`concurrency_leases_released_through_any_node_come_back_every_round_and_after_a_crash`]).
//! And the audit (issue 46): a key at 1.5 × its limit through all three nodes, counted from the
//! outside; without a fault the audit reports no over-admission, and with node 3 cut off by the
//! WAN harness's UDP relay (tests/wan/relay.py, its partitions the fault hook) it reports the
//! excess, counting what the outside counted
//! ([`the_audit_reports_what_the_cluster_admitted_and_the_over_admission_of_a_cut`]).
//! The SIGTERM test runs the default 200 ms gossip and bounds the stop (under a second).
//!
//! Real processes, real sockets, the daemon's own HTTP API spoken by a tiny HTTP/1.1 client over
//! `std::net::TcpStream`. Every wait polls a condition (`/readyz`, the member view of
//! `/v1/cluster`), bounded by [`WAIT`]. The [`Cluster`] guard kills every child process when
//! dropped, so a failing test leaves nothing running; it prints the nodes' logs when the test
//! failed.
//!
//! Long: starting real processes is slow, so the cluster scenarios share one harness and file.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The cluster's shared secret.
const SECRET: &str = "ratemeshd processes test: a cluster secret";
/// The limit of both test policies: 100 per day, so that nothing refills during a test and
/// counts are exact.
const LIMIT: u64 = 100;
/// The bound of every wait (cluster formation, failure detection, a rejoin). Debug builds on a
/// loaded two-core machine are slow to start; detection itself takes about a second.
const WAIT: Duration = Duration::from_secs(60);
/// The snapshot interval of the durable-quota test: short, so that the test waits little, and
/// long enough that a trickle of hits spans more than one.
const SNAPSHOT_INTERVAL: Duration = Duration::from_millis(1000);
/// The admin API's token of every node.
const ADMIN_TOKEN: &str = "processes test: the admin token";
/// The charge test's policies (`exact_fast`, `approx_fast`): 5 per 2 s, one hit every 400 ms, so
/// that a debt is paid back within seconds.
const FAST_LIMIT: u64 = 5;
const FAST_PERIOD_MS: u64 = 2000;
/// The limit per second of the skewed-demand test's policies (`skew-approx`, `skew-exact`).
const SKEW_LIMIT: u64 = 250;
/// The gossip interval of the test clusters (the default is 200 ms): failures and leaves are
/// seen sooner.
const GOSSIP_INTERVAL_MS: u64 = 100;
/// The lease limit of the concurrency test's policies (`conc-exact`, `conc-approx`; a day's
/// lease lifetime: no lease expires during a test).
const CONC_LIMIT: u64 = 30;
/// The limit per second of the audit test's policies (`audit-control`, `audit-cut`: fail open, so
/// that a node cut off from a key's owner admits everything it is sent).
const AUDIT_LIMIT: u64 = 100;
/// The tests of this file start three daemons each: one cluster at a time on two cores.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// Connect, read and write timeout of one HTTP request.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest HTTP response accepted (the API's answers are small).
const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// The approximate-mode bound for a cold key with every owner reachable: admissions from
/// allowances never exceed the limit (they are held against the owner's bucket), but a follower's
/// first checks, before its first grant arrives, are decided by the fallback from its local share
/// of the limit (`limit / 3`), which the owner debits only afterwards. Two followers: the limit
/// plus two local shares at worst.
fn approx_bound() -> u64 {
    LIMIT + 2 * (LIMIT / 3)
}

/// The addresses one node listens on.
#[derive(Clone, Copy, Debug)]
struct Addrs {
    http: SocketAddr,
    grpc: SocketAddr,
    gossip: SocketAddr,
    quic: SocketAddr,
}

/// Picks free loopback ports for `count` nodes: every port number distinct (the configuration
/// refuses two listeners on one address, whatever the protocol), all sockets held until every
/// port is chosen, then released for the daemons to bind.
fn free_addrs(count: usize) -> Vec<Addrs> {
    let mut ports = BTreeSet::new();
    let mut held_tcp = Vec::new();
    let mut held_udp = Vec::new();
    let mut pick = |udp: bool| -> SocketAddr {
        loop {
            let addr = if udp {
                let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP port");
                let addr = socket.local_addr().expect("local address");
                held_udp.push(socket);
                addr
            } else {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port");
                let addr = listener.local_addr().expect("local address");
                held_tcp.push(listener);
                addr
            };
            if ports.insert(addr.port()) {
                return addr;
            }
        }
    };
    (0..count)
        .map(|_| Addrs { http: pick(false), grpc: pick(false), gossip: pick(true), quic: pick(true) })
        .collect()
}

/// One `ratemeshd serve` process (node `id`), which can be killed and started again.
struct Daemon {
    id: u64,
    addrs: Addrs,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    /// Starts (or restarts) the process, its output appended to its log file.
    fn start(&mut self) {
        assert!(self.child.is_none(), "node {} is running", self.id);
        let log = OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
            .args(["serve", "--config"])
            .arg(&self.config)
            // RATEMESH_ overrides of the machine running the tests must not leak in.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("ratemeshd starts");
        self.child = Some(child);
    }

    /// Kills the process with SIGKILL (no graceful leave, no handoff) and reaps it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Fails only if it already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM (a graceful stop: drain, leave, hand over, final snapshot).
    fn terminate(&mut self) {
        let child = self.child.as_ref().expect("running");
        let status =
            Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -TERM node {}", self.id);
    }

    /// Waits (bounded by [`WAIT`]) until the process exited, and requires a clean exit.
    fn wait_exit(&mut self) {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                assert!(status.success(), "node {} exited with {status}", self.id);
                return;
            }
            assert!(Instant::now() < deadline, "node {} did not stop within {WAIT:?}", self.id);
            // The interval of a bounded poll, not a synchronization.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Fails the test if the process exited on its own.
    fn assert_running(&mut self) {
        if let Some(child) = &mut self.child
            && let Some(status) = child.try_wait().expect("try_wait")
        {
            panic!("node {} exited with {status}", self.id);
        }
    }
}

/// The three processes and their files; kills them all when dropped.
struct Cluster {
    dir: PathBuf,
    nodes: Vec<Daemon>,
}

impl Cluster {
    /// Writes a configuration per node (node 1 the seed of the others) and starts the processes.
    /// `durable`: every node keeps snapshots in a data directory of its own.
    fn start(name: &str, len: u64, durable: bool) -> Cluster {
        Cluster::start_with_gossip(name, len, durable, GOSSIP_INTERVAL_MS)
    }

    /// [`Cluster::start`] with gossip rounds `gossip_ms` apart.
    fn start_with_gossip(name: &str, len: u64, durable: bool, gossip_ms: u64) -> Cluster {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(cluster_id(name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let addrs = free_addrs(len as usize);
        let seed = addrs[0].gossip;
        let mut cluster = Cluster { dir: dir.clone(), nodes: Vec::new() };
        for (i, addrs) in addrs.into_iter().enumerate() {
            let id = i as u64 + 1;
            let seeds = if id == 1 { String::new() } else { format!("\"{seed}\"") };
            let config = dir.join(format!("node-{id}.toml"));
            let node_extra = if durable {
                let data_dir = dir.join(format!("node-{id}-data"));
                format!(
                    "data_dir = {:?}\nsnapshot_interval_ms = {}\n",
                    data_dir.display().to_string(),
                    SNAPSHOT_INTERVAL.as_millis()
                )
            } else {
                String::new()
            };
            let text = node_config(&cluster_id(name), id, &addrs, &seeds, &node_extra).replace(
                &format!("gossip_interval_ms = {GOSSIP_INTERVAL_MS}\n"),
                &format!("gossip_interval_ms = {gossip_ms}\n"),
            );
            std::fs::write(&config, text).expect("write the configuration");
            let log = dir.join(format!("node-{id}.log"));
            cluster.nodes.push(Daemon { id, addrs, config, log, child: None });
        }
        for node in &mut cluster.nodes {
            node.start();
        }
        cluster
    }

    fn node(&mut self, id: u64) -> &mut Daemon {
        &mut self.nodes[(id - 1) as usize]
    }

    fn http(&self, id: u64) -> SocketAddr {
        self.nodes[(id - 1) as usize].addrs.http
    }

    /// Waits until every node of `ids` answers `/readyz` with 200.
    fn wait_ready(&mut self, ids: &[u64]) {
        for &id in ids {
            let addr = self.http(id);
            self.wait_for(&format!("node {id} ready"), || {
                request(addr, "GET", "/readyz", None).is_ok_and(|r| r.status == 200)
            });
        }
    }

    /// Waits until every node of `observers` sees exactly `live` as live members, and every id of
    /// `dead` as dead.
    fn wait_view(&mut self, observers: &[u64], live: &[u64], dead: &[u64]) {
        for &id in observers {
            let addr = self.http(id);
            let what = format!("node {id} sees live {live:?}, dead ⊇ {dead:?}");
            self.wait_for(&what, || {
                view(addr).is_some_and(|v| v.live == live && dead.iter().all(|d| v.dead.contains(d)))
            });
        }
    }

    /// Waits until every node of `observers` counts `members` members' shares in the limits it
    /// enforces as an owner (`members_counted`): a member back from the dead counts a little after
    /// it is seen live, and until then owners enforce the reachable members' part of a limit.
    fn wait_counted(&mut self, observers: &[u64], members: usize) {
        for &id in observers {
            let addr = self.http(id);
            let what = format!("node {id} counts {members} members' shares");
            self.wait_for(&what, || view(addr).is_some_and(|v| v.counted == members));
        }
    }

    /// Polls `condition` until it holds, at most [`WAIT`]; fails early if a process died.
    fn wait_for(&mut self, what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            if condition() {
                eprintln!("ok: {what}");
                return;
            }
            for node in &mut self.nodes {
                node.assert_running();
            }
            let views: Vec<String> =
                self.nodes.iter().map(|n| format!("node {}: {:?}", n.id, view(n.addrs.http))).collect();
            assert!(Instant::now() < deadline, "not within {WAIT:?}: {what}; views: {views:?}");
            // The interval of a bounded poll, not a synchronization.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `per_node` checks of cost 1 for `key` under `policy` to each node of `ids`, all
    /// nodes at once (a thread per node, its checks in sequence); returns how many were allowed.
    /// Every check must be answered 200.
    fn admitted(&self, policy: &str, key: &str, per_node: usize, ids: &[u64]) -> u64 {
        let body = serde_json::json!({ "key": key, "policy": policy }).to_string();
        std::thread::scope(|scope| {
            let workers: Vec<_> = ids
                .iter()
                .map(|&id| {
                    let (addr, body) = (self.http(id), body.as_str());
                    scope.spawn(move || {
                        let mut allowed = 0;
                        for i in 0..per_node {
                            let response = request(addr, "POST", "/v1/check", Some(body))
                                .unwrap_or_else(|e| panic!("node {id}, check {i} of {key}: {e}"));
                            assert_eq!(response.status, 200, "node {id}: {}", response.text());
                            let answer: Value = serde_json::from_slice(&response.body).expect("JSON answer");
                            let verdict = answer["allowed"].as_bool();
                            allowed += u64::from(verdict.expect("an \"allowed\" boolean"));
                        }
                        allowed
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("worker")).sum()
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        if std::thread::panicking() {
            for node in &self.nodes {
                let log = std::fs::read_to_string(&node.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- node {} log (last {} lines) ---", node.id, tail.len());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
            eprintln!("(files kept in {})", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The name of the test cluster `name` of this process. Tests run at once and reuse ephemeral
/// ports: a node of one cluster gossiping to an address that another test's node took over must
/// not merge the two, and gossip is sealed under keys derived from the name.
fn cluster_id(name: &str) -> String {
    format!("processes-{name}-{}", std::process::id())
}

/// Node `id`'s configuration file in the cluster named `cluster_id`; `node_extra` goes into its
/// `[node]` section.
fn node_config(cluster_id: &str, id: u64, addrs: &Addrs, seeds: &str, node_extra: &str) -> String {
    format!(
        r#"[node]
id = {id}
{node_extra}

[cluster]
cluster_id = "{cluster_id}"
seeds = [{seeds}]
secret = "{SECRET}"
gossip_interval_ms = {GOSSIP_INTERVAL_MS}

[listen]
http = "{http}"
grpc = "{grpc}"
gossip = "{gossip}"
quic = "{quic}"

[log]
level = "info"

[auth]
admin_token = "{ADMIN_TOKEN}"

[[policies]]
name = "exact"
algorithm = "token_bucket"
limit = {LIMIT}
period_ms = 86400000
mode = "exact"

[[policies]]
name = "approx"
algorithm = "token_bucket"
limit = {LIMIT}
period_ms = 86400000
mode = "approximate"

[[policies]]
name = "exact_fast"
algorithm = "token_bucket"
limit = {FAST_LIMIT}
period_ms = {FAST_PERIOD_MS}
mode = "exact"

[[policies]]
name = "approx_fast"
algorithm = "token_bucket"
limit = {FAST_LIMIT}
period_ms = {FAST_PERIOD_MS}
mode = "approximate"

[[policies]]
name = "skew-approx"
algorithm = "token_bucket"
limit = {SKEW_LIMIT}
period_ms = 1000
mode = "approximate"

[[policies]]
name = "conc-exact"
algorithm = "concurrency"
limit = {CONC_LIMIT}
period_ms = 86400000
mode = "exact"

[[policies]]
name = "conc-approx"
algorithm = "concurrency"
limit = {CONC_LIMIT}
period_ms = 86400000
mode = "approximate"

[[policies]]
name = "skew-exact"
algorithm = "token_bucket"
limit = {SKEW_LIMIT}
period_ms = 1000
mode = "exact"

[[policies]]
name = "audit-control"
algorithm = "token_bucket"
limit = {AUDIT_LIMIT}
period_ms = 1000
mode = "approximate"
fallback = "fail_open"

[[policies]]
name = "audit-cut"
algorithm = "token_bucket"
limit = {AUDIT_LIMIT}
period_ms = 1000
mode = "approximate"
fallback = "fail_open"
"#,
        http = addrs.http,
        grpc = addrs.grpc,
        gossip = addrs.gossip,
        quic = addrs.quic,
    )
}

/// A member view from `GET /v1/cluster`: member ids by status, sorted.
#[derive(Debug)]
struct View {
    live: Vec<u64>,
    dead: Vec<u64>,
    /// `members_counted`: the members whose shares the node's owned keys count.
    counted: usize,
}

/// Node at `addr`'s member view, if it answers one.
fn view(addr: SocketAddr) -> Option<View> {
    let response = request(addr, "GET", "/v1/cluster", None).ok()?;
    if response.status != 200 {
        return None;
    }
    let answer: Value = serde_json::from_slice(&response.body).ok()?;
    let (mut live, mut dead) = (Vec::new(), Vec::new());
    for member in answer.get("members")?.as_array()? {
        let id = member.get("id")?.as_u64()?;
        match member.get("status")?.as_str()? {
            "live" => live.push(id),
            "dead" => dead.push(id),
            _ => {}
        }
    }
    live.sort_unstable();
    dead.sort_unstable();
    let counted = usize::try_from(answer.get("members_counted")?.as_u64()?).ok()?;
    Some(View { live, dead, counted })
}

/// An HTTP response.
struct Response {
    status: u16,
    body: Vec<u8>,
}

impl Response {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request on a new connection. The response body is read by its `Content-Length`
/// (or chunked encoding), then the client closes first, so that no server port is left in
/// TIME_WAIT (a restarted node binds the same ports).
fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> std::io::Result<Response> {
    request_with(addr, method, path, "", body)
}

/// [`request`] with `headers` (each line ending in CRLF) added to the head.
fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<&str>,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("status line {line:?}")))?;
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(bad("end of stream in the headers".to_owned()));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().map_err(|_| bad(format!("content-length {value:?}")))?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad(format!("chunk size {line:?}")))?;
            if size == 0 || body.len() + size > RESPONSE_BYTES_MAX {
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..])?;
            line.clear();
            reader.read_line(&mut line)?; // the chunk's CRLF
        }
    } else if let Some(length) = length {
        if length > RESPONSE_BYTES_MAX {
            return Err(bad(format!("response of {length} bytes")));
        }
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.take(RESPONSE_BYTES_MAX as u64).read_to_end(&mut body)?;
    }
    Ok(Response { status, body })
}

#[test]
fn three_processes_hold_the_limit_survive_a_kill_and_rejoin() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("kill", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);

    // Exact mode: every check decided by the key's owner.
    let exact = cluster.admitted("exact", "tenant-exact", 100, &all);
    eprintln!("exact mode, 300 checks over 3 nodes: {exact} admitted");
    assert_eq!(exact, LIMIT);

    // Approximate mode: local decisions from allowances.
    let approx = cluster.admitted("approx", "tenant-approx", 100, &all);
    eprintln!("approximate mode, 300 checks over 3 nodes: {approx} admitted (bound {})", approx_bound());
    assert!(approx <= approx_bound(), "{approx}");
    assert!(approx >= LIMIT / 2, "approximate mode must not starve the key: {approx}");

    // The checks above went between the nodes: node 1 measured round trips to its peers.
    let metrics = request(cluster.http(1), "GET", "/metrics", None).expect("metrics").text();
    assert!(metrics.contains("ratemesh_sync_lag_seconds "), "{metrics}");
    assert!(metrics.contains("ratemesh_peer_rtt_seconds{peer=\"2\"}"), "{metrics}");

    // Node 3 crashes. The dead member still counts in the cluster's size: owners enforce 2/3.
    cluster.node(3).kill();
    cluster.wait_view(&[1, 2], &[1, 2], &[3]);
    let after_kill = cluster.admitted("exact", "tenant-after-kill", 150, &[1, 2]);
    eprintln!("node 3 dead, 300 checks over nodes 1 and 2: {after_kill} admitted");
    // Shares are apportioned by rank so that they sum to the limit: two of three are at most
    // ceil(2L/3) (67 of 100).
    assert!(after_kill <= (2 * LIMIT).div_ceil(3), "{after_kill}");
    assert!(after_kill >= 1, "the survivors keep serving");

    // Node 3 comes back with the same id and addresses and rejoins.
    cluster.node(3).start();
    cluster.wait_ready(&[3]);
    cluster.wait_view(&all, &all, &[]);
    // Owners count node 3's share again two retransmission timeouts after they hear it (until
    // then a key begun enforces the reachable 2/3).
    cluster.wait_counted(&all, 3);
    let rejoined = cluster.admitted("exact", "tenant-rejoined", 100, &all);
    eprintln!("node 3 rejoined, 300 checks over 3 nodes: {rejoined} admitted");
    assert_eq!(rejoined, LIMIT);

    for node in &mut cluster.nodes {
        node.assert_running();
    }
}

/// How the node under SIGTERM answered `/readyz` until it exited.
#[derive(Debug, Default)]
struct Leaving {
    /// From SIGTERM to the first 503 "shutting down".
    not_ready_after: Option<Duration>,
    /// Answers 503 "shutting down" (the listener kept answering while the node left).
    not_ready_answers: u32,
    /// From SIGTERM to the process's exit.
    exited_after: Duration,
}

/// Polls node `id`'s `/readyz` from its SIGTERM until its process exits (bounded by [`WAIT`]).
fn watch_leaving(cluster: &mut Cluster, id: u64, signalled: Instant) -> Leaving {
    let addr = cluster.http(id);
    let node = cluster.node(id);
    let mut leaving = Leaving::default();
    // Bounded by WAIT.
    loop {
        let child = node.child.as_mut().expect("running");
        if let Some(status) = child.try_wait().expect("try_wait") {
            leaving.exited_after = signalled.elapsed();
            assert!(status.success(), "node {id} exited with {status} after SIGTERM");
            node.child = None;
            return leaving;
        }
        assert!(signalled.elapsed() < WAIT, "node {id} still running {WAIT:?} after SIGTERM");
        if let Ok(response) = request(addr, "GET", "/readyz", None)
            && response.status == 503
            && response.text().contains("shutting down")
        {
            leaving.not_ready_after.get_or_insert_with(|| signalled.elapsed());
            leaving.not_ready_answers += 1;
        }
        // The interval of a bounded poll, not a synchronization.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `remaining` of `key` under `policy` on node `id`, asked with a query (cost 0).
fn remaining(cluster: &Cluster, id: u64, policy: &str, key: &str) -> u64 {
    remaining_at(cluster.http(id), policy, key)
}

/// The `remaining` of `key` under `policy` at the node at `addr`, asked with a query (cost 0).
fn remaining_at(addr: SocketAddr, policy: &str, key: &str) -> u64 {
    let body = serde_json::json!({ "key": key, "policy": policy, "cost": 0 }).to_string();
    let response = request(addr, "POST", "/v1/check", Some(&body)).expect("an answer");
    assert_eq!(response.status, 200, "{}", response.text());
    let answer: Value = serde_json::from_slice(&response.body).expect("JSON answer");
    answer["remaining"].as_u64().expect("a \"remaining\" number")
}

/// SIGTERM to exit of one of three members at the default 200 ms gossip, nothing else leaving:
/// the gossip rounds until every member showed that it knows of the leave (one or two), the
/// handoff and its acknowledgement, the transport's close. Measured 0.2-0.4 s on a loaded debug
/// build; 1.6 s before (a fixed 5 gossip rounds, then a linger of half of that).
const STOP_BOUND: Duration = Duration::from_millis(1000);

#[test]
#[ignore = "run by .ci/run with --nocapture, to print the measured shutdown time"]
fn sigterm_leaves_gracefully_answering_until_the_keys_are_handed_over() {
    const KEYS: usize = 24;
    const HITS: u64 = 10;
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // The default gossip interval, as a user runs it (issue 41: 1.6 s to stop).
    let mut cluster = Cluster::start_with_gossip("sigterm", 3, false, 200);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    // Exact mode: every key's owner holds its count; node 3 owns about a third of them.
    let keys: Vec<String> = (0..KEYS).map(|i| format!("handed-over-{i}")).collect();
    for key in &keys {
        assert_eq!(cluster.admitted("exact", key, HITS as usize, &[1]), HITS, "{key}");
    }

    let signalled = Instant::now();
    cluster.node(3).terminate();
    let leaving = watch_leaving(&mut cluster, 3, signalled);
    let not_ready_ms = leaving.not_ready_after.map(|after| after.as_millis());
    println!(
        "graceful shutdown of node 3 of 3 (SIGTERM -> exit): {} ms; /readyz 503 after {not_ready_ms:?} ms, \
         {} answers 503 while leaving",
        leaving.exited_after.as_millis(),
        leaving.not_ready_answers,
    );
    assert!(leaving.not_ready_after.is_some(), "never answered 503 while leaving: {leaving:?}");
    assert!(leaving.exited_after < STOP_BOUND, "SIGTERM to exit {leaving:?}, bound {STOP_BOUND:?}");

    // The others saw a leave, not a crash: node 3 is in neither list. Its keys kept their counts.
    cluster.wait_view(&[1, 2], &[1, 2], &[]);
    for key in &keys {
        for id in [1, 2] {
            assert_eq!(remaining(&cluster, id, "exact", key), LIMIT - HITS, "{key} on node {id}");
        }
    }
    for node in &mut cluster.nodes[..2] {
        node.assert_running();
    }
}

/// One check of `cost` hits of `key` under `policy` at `addr`: `(allowed, remaining)`.
fn check(addr: SocketAddr, policy: &str, key: &str, cost: u64) -> (bool, u64) {
    let body = serde_json::json!({ "key": key, "policy": policy, "cost": cost }).to_string();
    let response = request(addr, "POST", "/v1/check", Some(&body)).expect("check answered");
    assert_eq!(response.status, 200, "{}", response.text());
    let answer: Value = serde_json::from_slice(&response.body).expect("JSON answer");
    (answer["allowed"].as_bool().expect("allowed"), answer["remaining"].as_u64().expect("remaining"))
}

/// The owner of `key` under the policy `policy` in a ring of members 1, 2 and 3: placement is
/// fixed by the code (golden vectors pin it), so the test computes it as every node does.
fn owner(policy: &str, key: &str) -> u64 {
    use ratemesh_core::{Namespace, NodeId, RING_VNODES_DEFAULT, Ring};
    let ring = Ring::new(&[NodeId(1), NodeId(2), NodeId(3)], RING_VNODES_DEFAULT);
    let hash = Namespace::new(policy.as_bytes()).key(key.as_bytes());
    ring.owner(hash).expect("a ring of three has owners").0
}

/// When node at `addr` last wrote a snapshot, in seconds since the Unix epoch (from
/// `ratemesh_snapshot_age_seconds`).
fn last_snapshot_unix_s(addr: SocketAddr) -> f64 {
    let metrics = request(addr, "GET", "/metrics", None).expect("metrics").text();
    let age = metrics
        .lines()
        .find_map(|line| line.strip_prefix("ratemesh_snapshot_age_seconds "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no snapshot written yet: {metrics}"));
    unix_s() - age
}

fn unix_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

#[test]
fn three_processes_keep_daily_quotas_across_a_full_restart_and_a_kill_of_all() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("durable", 3, true);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let keys: Vec<(&str, String)> = ["exact", "approx"]
        .into_iter()
        .flat_map(|policy| (0..4).map(move |i| (policy, format!("tenant-{policy}-{i}"))))
        .collect();
    // The remaining hits of every key, asked at its owner (cost 0): right after a start nobody
    // holds an allowance, so in approximate mode too this is all the cluster can still admit.
    let remaining = |cluster: &Cluster| -> Vec<u64> {
        keys.iter().map(|(policy, key)| check(cluster.http(owner(policy, key)), policy, key, 0).1).collect()
    };

    // 1. Each key spent to 40 remaining: exactly 60 admitted (a 100-per-day bucket refills one hit
    //    every 864 s, nothing during the test), the checks spread over the three nodes — in
    //    approximate mode too: a key whose share per node is a few hits is decided by its owner,
    //    and allowances are granted from what the bucket holds, not from its (tiny) refill rate.
    //    (The owner's cost-0 answer is not the cluster's remaining while followers hold
    //    allowances: it is, right after a start, when nobody holds any.)
    //    (A check refused for a forward that timed out on a loaded host is a false reject, not a
    //    hit spent: the checks go on until 60 are admitted, and the owners' counts say the rest.)
    for (policy, key) in &keys {
        let (mut admitted, mut checks) = (0, 0);
        while admitted < 60 && checks < 70 {
            admitted += u64::from(check(cluster.http(checks % 3 + 1), policy, key, 1).0);
            checks += 1;
        }
        assert_eq!(admitted, 60, "{key}: 60 of a 100-per-day limit in {checks} checks spread over the nodes");
    }
    let spent = remaining(&cluster);
    eprintln!("spent 60 of 100 per key, remaining at the owners: {spent:?}");

    // 2. All three stopped gracefully at once (like `docker-compose down`), then started.
    for node in &mut cluster.nodes {
        node.terminate();
    }
    for node in &mut cluster.nodes {
        node.wait_exit();
    }
    for node in &mut cluster.nodes {
        node.start();
    }
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let restarted = remaining(&cluster);
    eprintln!("after a graceful stop and start of all three: remaining {restarted:?}");
    for (((policy, key), left), before) in keys.iter().zip(&restarted).zip(&spent) {
        assert!(*left <= 40, "{policy} {key}: {left} remaining after a full restart (at most 40)");
        if *policy == "exact" {
            // What the owner had: 40, or less when a forwarded check timed out under load and
            // its hit was counted twice (the fallback reports it too: conservative).
            assert_eq!(left, before, "{key}: exact mode keeps exactly what was left");
        }
    }

    // 3. A trickle of hits over more than one snapshot interval, then all three SIGKILLed at
    //    once. Hits decided before a node's last snapshot are in it; only those answered after
    //    the earliest of the three last snapshots can be lost.
    let mut answered: Vec<(usize, f64)> = Vec::new();
    let rounds = 25;
    for round in 0..rounds {
        for (k, (policy, key)) in keys.iter().enumerate() {
            if check(cluster.http(round % 3 + 1), policy, key, 1).0 {
                answered.push((k, unix_s()));
            }
        }
        // The pace of a load generator (100 ms a round), not a synchronization.
        std::thread::sleep(SNAPSHOT_INTERVAL / 10);
    }
    let last_snapshot = all.iter().map(|&id| last_snapshot_unix_s(cluster.http(id))).fold(f64::MAX, f64::min);
    for node in &mut cluster.nodes {
        node.kill();
    }
    let killed_at = unix_s();
    for node in &mut cluster.nodes {
        node.start();
    }
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let after_kill = remaining(&cluster);
    eprintln!("after SIGKILL of all three: remaining {after_kill:?}");
    let interval_s = SNAPSHOT_INTERVAL.as_secs_f64();
    let (mut lost_total, mut late_total, mut last_interval_total) = (0i64, 0u64, 0u64);
    for (k, (policy, key)) in keys.iter().enumerate() {
        let admitted = answered.iter().filter(|(i, _)| *i == k).count() as u64;
        let late = answered.iter().filter(|(i, at)| *i == k && *at >= last_snapshot).count() as u64;
        let last_interval =
            answered.iter().filter(|(i, at)| *i == k && *at >= killed_at - interval_s).count();
        let expected = restarted[k] - admitted;
        let lost = after_kill[k] as i64 - expected as i64;
        eprintln!(
            "{policy} {key}: {admitted} admitted in the trickle, {} remaining after the kill, expected {expected}: \
             {lost} lost (bound: {late} answered after the last snapshot; {last_interval} in the last interval)",
            after_kill[k]
        );
        assert!(
            after_kill[k] <= expected + late,
            "{policy} {key}: more than the hits after the last snapshot lost"
        );
        assert!(after_kill[k] <= 40, "{policy} {key}: never back above what was left");
        lost_total += lost.max(0);
        late_total += late;
        last_interval_total += last_interval as u64;
    }
    eprintln!(
        "SIGKILL of all: {lost_total} hits lost of {} admitted in the trickle ({late_total} answered after the \
         last snapshot, {last_interval_total} in the last snapshot interval of {interval_s} s)",
        answered.len()
    );

    // 4. What the cluster admits afterwards, checks spread over the three nodes.
    for ((policy, key), left) in keys.iter().zip(&after_kill) {
        let admitted = (0..60).filter(|i| check(cluster.http(i % 3 + 1), policy, key, 1).0).count() as u64;
        eprintln!("{policy} {key}: {admitted} admitted of 60 more checks ({left} were remaining)");
        if *policy == "exact" {
            // What was admitted and what is still there is what was remaining: never more
            // admitted, no hit lost (a false reject of a timed-out forward leaves its hit).
            let still = check(cluster.http(owner(policy, key)), policy, key, 0).1;
            assert_eq!(admitted + still, *left, "{key}: exact mode admits what was remaining, no more");
        }
    }
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}

/// One check's answer: `(allowed, limit, remaining)`.
fn check_answer(addr: SocketAddr, policy: &str, key: &str, cost: u64) -> (bool, u64, u64) {
    let body = serde_json::json!({ "key": key, "policy": policy, "cost": cost }).to_string();
    let response = request(addr, "POST", "/v1/check", Some(&body)).expect("check answered");
    assert_eq!(response.status, 200, "{}", response.text());
    let answer: Value = serde_json::from_slice(&response.body).expect("JSON answer");
    let number = |field: &str| answer[field].as_u64().unwrap_or_else(|| panic!("no {field:?}: {answer}"));
    (answer["allowed"].as_bool().expect("allowed"), number("limit"), number("remaining"))
}

/// Cold start, and a key whose share per node is a few hits: right after every node answers
/// `/readyz` 200 (no wait for the member view), every answer carries the whole limit, an exact
/// key admits exactly the limit, and a 100-per-day approximate key admits its whole limit from
/// back-to-back checks spread over the three nodes (the owner decides such a key: its share per
/// node and sync interval is far below a hit).
#[test]
fn right_after_readiness_every_answer_carries_the_whole_limit_and_small_keys_admit_it_all() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("cold", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    for policy in ["exact", "approx"] {
        for id in all {
            let key = format!("cold-query-{policy}-{id}");
            let (allowed, limit, remaining) = check_answer(cluster.http(id), policy, &key, 0);
            assert!(
                allowed && limit == LIMIT && remaining == LIMIT,
                "{policy} on node {id}: {limit} {remaining}"
            );
        }
    }
    // Each run below then trickles checks until the key is spent: a check refused because its
    // forward timed out on a loaded host is a false reject, and its hit is still there.
    let exact = cluster.admitted("exact", "cold-exact", 50, &all);
    eprintln!("right after readiness, exact mode, 150 checks over 3 nodes: {exact} admitted");
    assert_eq!(trickle_until_spent(&cluster, ("exact", "cold-exact"), exact), LIMIT);
    let spread = (0..150).filter(|i| check(cluster.http(i % 3 + 1), "approx", "cold-approx", 1).0).count();
    eprintln!(
        "100 per day, approximate mode, 150 back-to-back checks spread over 3 nodes: {spread} admitted"
    );
    let spread = trickle_until_spent(&cluster, ("approx", "cold-approx"), spread as u64);
    assert_eq!(spread, LIMIT, "back-to-back checks spread over the nodes admit the whole limit");
    // Concurrent checks: before a follower's first grant arrives, its checks may be decided by
    // the fallback from its local share (the owner debits them afterwards): [`approx_bound`].
    let concurrent = cluster.admitted("approx", "cold-approx-concurrent", 50, &all);
    eprintln!("100 per day, approximate mode, 150 concurrent checks over 3 nodes: {concurrent} admitted");
    let concurrent = trickle_until_spent(&cluster, ("approx", "cold-approx-concurrent"), concurrent);
    assert!((LIMIT..=approx_bound()).contains(&concurrent), "{concurrent} admitted");
}

/// After a run of checks admitted `admitted` hits of a 100-per-day `key` under `policy`: a trickle
/// of checks at every node (for at most 10 s, or until the key is spent) admits the rest.
/// Allowances left at a node whose checks ended come back (a holder gives back what its decaying
/// demand no longer needs), so the whole limit is admitted in the end. Returns the total.
fn trickle_until_spent(cluster: &Cluster, (policy, key): (&str, &str), mut admitted: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    while admitted < LIMIT && Instant::now() < deadline {
        // The pace of a trickle of checks, not a synchronization.
        std::thread::sleep(Duration::from_millis(100));
        admitted += [1, 2, 3].iter().filter(|&&id| check(cluster.http(id), policy, key, 1).0).count() as u64;
    }
    eprintln!("{key}: {admitted} admitted with a trickle of checks afterwards");
    admitted
}

/// A node that crashed, came back and is then stopped gracefully leaves the others at the whole
/// limit: its peers see its leave (the newest generation), not the crashed one again.
#[test]
fn a_node_that_crashed_and_came_back_then_leaves_gracefully_leaves_the_whole_limit() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("crash-leave", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    cluster.node(3).kill();
    cluster.wait_view(&[1, 2], &[1, 2], &[3]);
    cluster.node(3).start();
    cluster.wait_ready(&[3]);
    cluster.wait_view(&all, &all, &[]);
    cluster.node(3).terminate();
    cluster.node(3).wait_exit();
    for id in [1, 2] {
        let addr = cluster.http(id);
        cluster.wait_for(&format!("node {id} sees live [1, 2] and nothing dead"), || {
            view(addr).is_some_and(|v| v.live == [1, 2] && v.dead.is_empty())
        });
    }
    cluster.wait_counted(&[1, 2], 2);
    let admitted = cluster.admitted("exact", "after-crash-and-leave", 100, &[1, 2]);
    eprintln!("node 3 crashed, came back and left: 200 checks over nodes 1 and 2: {admitted} admitted");
    assert_eq!(admitted, LIMIT);
    for node in &mut cluster.nodes[..2] {
        node.assert_running();
    }
}

/// What one node was sent and admitted in [`paced_load`], counted inside the measured span.
#[derive(Clone, Copy, Debug, Default)]
struct Offered {
    sent: u64,
    allowed: u64,
}

/// Sends checks of `key` under `policy` to each `(node, rate per second)` of `loads` for `run`
/// (paced threads of at most 100 checks/s each; a thread behind its schedule sends at once), and
/// counts per node those actually sent inside `span` (from the start). Returns the counts and
/// the time the load took.
fn paced_load(
    cluster: &Cluster,
    (policy, key): (&str, &str),
    loads: &[(u64, u64)],
    run: Duration,
    span: std::ops::Range<Duration>,
) -> (Vec<Offered>, Duration) {
    const RATE_PER_THREAD: u64 = 100;
    let body = serde_json::json!({ "key": key, "policy": policy }).to_string();
    let start = Instant::now();
    let per_node = std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for (slot, &(id, rate)) in loads.iter().enumerate() {
            let threads = rate.div_ceil(RATE_PER_THREAD);
            let interval = Duration::from_secs_f64(threads as f64 / rate as f64);
            for t in 0..threads {
                let (addr, body, span) = (cluster.http(id), body.as_str(), span.clone());
                let offset = interval.mul_f64(t as f64 / threads as f64);
                let worker = scope.spawn(move || {
                    let mut offered = Offered::default();
                    // Bounded by `run`: one request per interval of the schedule.
                    for i in 0.. {
                        let at = offset + interval * i;
                        if at >= run {
                            break;
                        }
                        if let Some(ahead) = (start + at).checked_duration_since(Instant::now()) {
                            // The pace of a load generator, not a synchronization.
                            std::thread::sleep(ahead);
                        }
                        let sent_at = start.elapsed();
                        let response =
                            request(addr, "POST", "/v1/check", Some(body)).expect("check answered");
                        assert_eq!(response.status, 200, "node {id}: {}", response.text());
                        let answer: Value = serde_json::from_slice(&response.body).expect("JSON answer");
                        if span.contains(&sent_at) {
                            offered.sent += 1;
                            offered.allowed += u64::from(answer["allowed"].as_bool().expect("allowed"));
                        }
                    }
                    offered
                });
                workers.push((slot, worker));
            }
        }
        let mut per_node = vec![Offered::default(); loads.len()];
        for (slot, worker) in workers {
            let offered = worker.join().expect("load thread");
            per_node[slot].sent += offered.sent;
            per_node[slot].allowed += offered.allowed;
        }
        per_node
    });
    (per_node, start.elapsed())
}

/// Skewed demand on one key at twice its limit (the issue's 1 500 / 300 / 200 requests/s on a
/// 1 000/s key, at a quarter of the rates so that debug builds on two loaded cores keep the
/// pace): in both modes the total holds and every node is admitted close to its share of the
/// demand (what one ideal limiter splits: 187 / 38 / 25 per second), not the owner first. Measured after a warm-up that
/// spends the initial burst, so that the bucket is empty and the ideal admits the limit.
#[test]
fn skewed_demand_is_admitted_in_proportion_to_each_nodes_demand() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("skew", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let (run, span) = (Duration::from_secs(7), Duration::from_secs(2)..Duration::from_secs(6));
    let measured_s = (span.end - span.start).as_secs_f64();
    let loads = [(1, 375), (2, 75), (3, 50)];
    for policy in ["skew-approx", "skew-exact"] {
        let (offered, took) = paced_load(&cluster, (policy, "skewed"), &loads, run, span.clone());
        let sent: u64 = offered.iter().map(|o| o.sent).sum();
        let allowed: u64 = offered.iter().map(|o| o.allowed).sum();
        eprintln!(
            "{policy}: sent {sent}, admitted {allowed} in {measured_s} s (load took {took:?}); {offered:?}"
        );
        let limit_in_span = SKEW_LIMIT as f64 * measured_s;
        assert!(
            sent as f64 >= 1.5 * limit_in_span,
            "{policy}: the load generator did not reach overload: {sent}"
        );
        // Sync lag and decisions in flight at the edges of the span: a tenth of a second.
        assert!(allowed as f64 <= SKEW_LIMIT as f64 * (measured_s + 0.1), "{policy}: {allowed} admitted");
        assert!(allowed as f64 >= 0.95 * limit_in_span, "{policy}: only {allowed} admitted");
        for ((id, _), o) in loads.iter().zip(&offered) {
            let ideal = allowed as f64 * o.sent as f64 / sent as f64;
            let off = (o.allowed as f64 - ideal).abs() / allowed as f64;
            eprintln!(
                "{policy}: node {id} admitted {} of {} (its demand share {ideal:.0}: off by {:.1} % of the admitted)",
                o.allowed,
                o.sent,
                off * 100.0
            );
            assert!(
                off <= 0.05,
                "{policy}: node {id} admitted {} where its demand share is {ideal:.0}",
                o.allowed
            );
        }
    }
}

/// Sends `checks` (`(key, node id)`) of cost 1 under `policy` in batches of at most
/// `TOP_BATCH_LEN`, several batches in flight per node; returns the hits refused per key.
fn drive_batches(
    cluster: &Cluster,
    policy: &str,
    checks: &[(String, u64)],
) -> std::collections::HashMap<String, u64> {
    const TOP_BATCH_LEN: usize = 50;
    const WORKERS_PER_NODE: usize = 8;
    let mut per_node: std::collections::BTreeMap<u64, Vec<&str>> = std::collections::BTreeMap::new();
    for (key, id) in checks {
        per_node.entry(*id).or_default().push(key);
    }
    let batches: Vec<(u64, Vec<&str>)> = per_node
        .iter()
        .flat_map(|(id, keys)| keys.chunks(TOP_BATCH_LEN).map(|chunk| (*id, chunk.to_vec())))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let refused = std::sync::Mutex::new(std::collections::HashMap::<String, u64>::new());
    std::thread::scope(|scope| {
        for _ in 0..per_node.len() * WORKERS_PER_NODE {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((id, keys)) = batches.get(at) else { return };
                    let body: Vec<Value> =
                        keys.iter().map(|key| serde_json::json!({ "key": key, "policy": policy })).collect();
                    let body = Value::Array(body).to_string();
                    let response = request(cluster.http(*id), "POST", "/v1/check/batch", Some(&body))
                        .unwrap_or_else(|e| panic!("node {id}: {e}"));
                    assert_eq!(response.status, 200, "node {id}: {}", response.text());
                    let answers: Vec<Value> = serde_json::from_slice(&response.body).expect("JSON answers");
                    let mut refused = refused.lock().expect("not poisoned");
                    for (key, answer) in keys.iter().zip(&answers) {
                        let allowed = answer["allowed"].as_bool().expect("an \"allowed\" boolean");
                        *refused.entry((*key).to_owned()).or_default() += u64::from(!allowed);
                    }
                }
            });
        }
    });
    refused.into_inner().expect("not poisoned")
}

/// `GET path` from node `id`, as JSON, requiring `status`.
fn get_json(cluster: &Cluster, id: u64, path: &str, status: u16) -> Value {
    let response = request(cluster.http(id), "GET", path, None).expect("answered");
    assert_eq!(response.status, status, "{path} on node {id}: {}", response.text());
    serde_json::from_slice(&response.body).expect("JSON answer")
}

#[test]
fn three_processes_list_three_abusive_keys_among_ten_thousand_first_on_every_node() {
    const NORMAL_KEYS: u64 = 10_000;
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("top", 3, false);
    cluster.wait_ready(&[1, 2, 3]);
    cluster.wait_view(&[1, 2, 3], &[1, 2, 3], &[]);
    let started = Instant::now();
    // Normal keys: two checks each, on two nodes; abusive keys: 400 each over all three.
    let abusive = ["abuser-a", "abuser-b", "abuser-c"];
    let mut checks = Vec::new();
    for i in 0..NORMAL_KEYS {
        checks.push((format!("user-{i}"), i % 3 + 1));
        checks.push((format!("user-{i}"), (i + 1) % 3 + 1));
        if i % 25 == 0 {
            for (a, key) in abusive.iter().enumerate() {
                checks.push(((*key).to_owned(), (i + a as u64) % 3 + 1));
            }
        }
    }
    let mut demand = std::collections::HashMap::<String, u64>::new();
    for (key, _) in &checks {
        *demand.entry(key.clone()).or_default() += 1;
    }
    let refused = drive_batches(&cluster, "approx", &checks);
    eprintln!("{} checks through three processes in {:?}", checks.len(), started.elapsed());
    for key in abusive {
        assert!(refused[key] >= 400 - approx_bound(), "{key}: refused {}", refused[key]);
    }
    for (by, truth) in [("refused", &refused), ("demand", &demand)] {
        for id in 1..=3 {
            let top = get_json(&cluster, id, &format!("/v1/top?policy=approx&n=20&by={by}"), 200);
            assert_eq!(top["members"], serde_json::json!([1, 2, 3]), "{top}");
            assert_eq!(top["missing"], serde_json::json!([]), "{top}");
            let keys = top["keys"].as_array().expect("keys");
            let mut first: Vec<&str> =
                keys.iter().take(3).map(|k| k["key"].as_str().expect("a key")).collect();
            first.sort_unstable();
            assert_eq!(first, abusive, "by {by} on node {id}: {top}");
            let bound = top["error_bound"].as_u64().expect("a bound");
            for key in keys {
                let (name, count) =
                    (key["key"].as_str().expect("a key"), key["count"].as_u64().expect("a count"));
                let true_count = truth.get(name).copied().unwrap_or(0);
                assert!(
                    count >= true_count && count - true_count <= bound,
                    "{name}: {count} vs {true_count} ± {bound}"
                );
            }
            assert_eq!(top["total"].as_u64(), Some(truth.values().sum::<u64>()), "by {by}: every hit once");
            if id == 1 {
                eprintln!("by {by}: bound {bound} of {} hits, first {}", top["total"], keys[0]);
            }
        }
    }
    // Bad input: 400 naming the field, nothing else.
    for (path, field) in [
        ("/v1/top", "policy"),
        ("/v1/top?policy=nope", "policy"),
        ("/v1/top?policy=approx&n=0", "n"),
        ("/v1/top?policy=approx&n=101", "n"),
        ("/v1/top?policy=approx&n=x", "n"),
        ("/v1/top?policy=approx&by=allowed", "by"),
        ("/v1/top?policy=approx&by=refused&by=demand", "by"),
        ("/v1/top?policy=approx&key=x", "key"),
    ] {
        let error = get_json(&cluster, 2, path, 400);
        assert_eq!(error["field"], field, "{path}: {error}");
    }
    // The near-limit signal: the abusive keys' decisions were near (or over) the limit.
    let metrics = request(cluster.http(1), "GET", "/metrics", None).expect("metrics").text();
    let sample = |name: &str, labels: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(name) && line.contains(labels))
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} {labels} in {metrics}"))
    };
    let approx = "policy=\"approx\"";
    let near = sample("ratemesh_near_limit_decisions_total", approx);
    let total = sample("ratemesh_limited_decisions_total", approx);
    let refused_here = sample("ratemesh_requests_total", "policy=\"approx\",decision=\"refused\"");
    let allowed_here = sample("ratemesh_requests_total", "policy=\"approx\",decision=\"allowed\"");
    assert_eq!(total, refused_here + allowed_here, "every decision is counted once");
    // Refusals are near the limit, and so are the last admissions of the abusive keys; the
    // normal keys' admissions (two hits of a hundred) are not.
    assert!(
        near > refused_here && near < refused_here + 3.0 * 100.0,
        "near {near}, refused {refused_here} of {total}"
    );
    assert!(!metrics.contains("abuser-"), "keys are never metric labels");
    // The CLI prints the same ranking.
    let output = Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
        .args(["top", "--policy", "approx", "--n", "5", "--addr"])
        .arg(cluster.http(3).to_string())
        .output()
        .expect("ratemeshd top runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text} {}", String::from_utf8_lossy(&output.stderr));
    let ranked: Vec<&str> =
        text.lines().skip(2).take(3).filter_map(|line| line.split_whitespace().nth(3)).collect();
    let mut ranked_sorted = ranked.clone();
    ranked_sorted.sort_unstable();
    assert_eq!(ranked_sorted, abusive, "{text}");
    // The dashboard page is served, self-contained.
    let page = request(cluster.http(2), "GET", "/", None).expect("dashboard");
    assert_eq!(page.status, 200);
    let html = page.text();
    assert!(html.contains("<title>ratemesh dashboard</title>"));
    // No external resource (the browser test, tests/dashboard.sh, watches the requests too).
    for external in ["src=", "href=\"http", "url(", "@import", "//cdn"] {
        assert!(!html.contains(external), "{external} in the page");
    }

    // A member gone: the others answer, the missing one is reported (or already out of the view).
    cluster.node(3).kill();
    let top = get_json(&cluster, 1, "/v1/top?policy=approx", 200);
    assert!(!top["members"].as_array().expect("members").contains(&serde_json::json!(3)), "{top}");
}

/// A node's checks that did not go the owner's way: forwards that timed out, fallback decisions.
#[derive(Debug, Default, PartialEq, Eq)]
struct Detours {
    timeouts: u64,
    fallbacks: u64,
}

impl Detours {
    fn of(addr: SocketAddr) -> Detours {
        let metrics = request(addr, "GET", "/metrics", None).expect("metrics").text();
        let counter = |name: &str| {
            let line = metrics.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' '));
            line.and_then(|value| value.trim().parse::<f64>().ok()).map_or(0, |value| value as u64)
        };
        Detours {
            timeouts: counter("ratemesh_forward_timeouts_total"),
            fallbacks: counter("ratemesh_fallback_decisions_total"),
        }
    }

    fn since(&self, before: &Detours) -> Detours {
        Detours { timeouts: self.timeouts - before.timeouts, fallbacks: self.fallbacks - before.fallbacks }
    }
}

/// One `POST` of `body` to `path` at `addr`, answered 200: the JSON answer.
fn post(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let response = request(addr, "POST", path, Some(&body.to_string())).expect("answered");
    assert_eq!(response.status, 200, "{path} {body}: {}", response.text());
    serde_json::from_slice(&response.body).expect("JSON answer")
}

/// Checks at `addr` one at a time until they have been refused for a second (20 sync intervals:
/// in approximate mode a node refuses locally until its next grant), at most 2 000 checks: the
/// hits that passed. Nothing refills during it under the daily policies.
fn drain(addr: SocketAddr, policy: &str, key: &str) -> u64 {
    let mut passed = 0;
    let mut refused_since = None;
    for _ in 0..2_000 {
        match check(addr, policy, key, 1).0 {
            true => (passed, refused_since) = (passed + 1, None),
            false => {
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(1) {
                    return passed;
                }
                // The interval of a bounded poll, not a synchronization.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    panic!("{key} under {policy} was never refused for a second ({passed} passed)");
}

#[test]
fn three_processes_refund_charge_and_check_all_or_nothing() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("usage", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);

    // Refunds, through a node that does not own the key, in both modes: a key charged down to
    // nothing gets exactly the refunded hits back, and never more than its capacity.
    for policy in ["exact", "approx"] {
        let key = format!("refund-{policy}");
        let follower = (1..=3).find(|&id| id != owner(policy, &key)).expect("a follower");
        let addr = cluster.http(follower);
        let before = Detours::of(addr);
        let spent =
            post(addr, "/v1/charge", &serde_json::json!({"key": key, "policy": policy, "cost": LIMIT}));
        let left = drain(addr, policy, &key);
        // Exact unless a forward timed out on this loaded machine (see below).
        if Detours::of(addr) == before {
            assert_eq!(
                (spent["allowed"].as_bool(), spent["remaining"].as_u64()),
                (Some(false), Some(0)),
                "{spent}"
            );
            assert_eq!(left, 0, "{policy}: nothing left after the charge");
        }
        for (refund, expected) in [(10, 10), (1000, LIMIT)] {
            let before = Detours::of(addr);
            let body = serde_json::json!({"key": key, "policy": policy, "cost": -(refund as i64)});
            let refunded = post(addr, "/v1/check", &body);
            assert_eq!(refunded["allowed"].as_bool(), Some(true), "{refunded}");
            let passed = drain(addr, policy, &key);
            let detours = Detours::of(addr).since(&before);
            eprintln!(
                "{policy}: a refund of {refund} through node {follower} let {passed} pass ({detours:?})"
            );
            // Exactly, unless a forward timed out on this loaded machine: the owner counted a
            // hit the client was told was refused, or the fallback decided (the core's
            // documented behaviour, not the refund's).
            let low = expected.saturating_sub(detours.timeouts);
            assert!(
                (low..=expected + detours.fallbacks).contains(&passed),
                "{policy}: refund {refund}: {passed}"
            );
            if detours == Detours::default() {
                assert_eq!(passed, expected, "{policy}: exactly the refund, never above the capacity");
            }
        }
    }

    // A charge of 3 × L on a fresh key (5 per 2 s, 400 ms a hit): 15 - 5 = 10 hits of debt, and
    // the next hit itself: refused for 11 × 400 ms = 4.4 s, on every node, in both modes.
    for policy in ["exact_fast", "approx_fast"] {
        let key = format!("charged-{policy}");
        // Exact unless a forward timed out on this loaded machine and a fallback decided (its
        // local share may admit: the core's documented behaviour, not the charge's).
        let before: Vec<Detours> = all.iter().map(|&id| Detours::of(cluster.http(id))).collect();
        let charged_at = Instant::now();
        let body = serde_json::json!({"key": key, "policy": policy, "cost": 3 * FAST_LIMIT});
        let charged = post(cluster.http(1), "/v1/charge", &body);
        let retry_ms = charged["retry_after_ms"].as_u64().expect("a retry time");
        eprintln!("{policy}: a charge of 3 x {FAST_LIMIT}: {charged}");
        assert_eq!(charged["allowed"].as_bool(), Some(false), "{charged}");
        let mut refused_at_once = Vec::new();
        for id in all {
            refused_at_once.push(!check(cluster.http(id), policy, &key, 1).0);
        }
        // Every node refuses until the debt is paid (a lower bound from before the charge was
        // sent, less 100 ms for a follower's local refusal ending a round trip early), then
        // admits again (a bounded poll).
        let mut admitted_after = Vec::new();
        for id in all {
            let addr = cluster.http(id);
            let what = format!("{policy}: node {id} admits again");
            cluster.wait_for(&what, || check(addr, policy, &key, 1).0);
            admitted_after.push(charged_at.elapsed());
        }
        let detours: u64 = all
            .iter()
            .zip(&before)
            .map(|(&id, b)| Detours::of(cluster.http(id)).since(b))
            .map(|d| d.timeouts + d.fallbacks)
            .sum();
        eprintln!(
            "{policy}: refused at once {refused_at_once:?}, admitted again after {admitted_after:?} ({detours} detours)"
        );
        if detours == 0 {
            assert!((4_300..=4_400).contains(&retry_ms), "{policy}: retry after {retry_ms} ms");
            assert!(refused_at_once.iter().all(|&refused| refused), "{policy}: every node refuses at once");
            for (after, id) in admitted_after.iter().zip(all) {
                assert!(
                    *after >= Duration::from_millis(4_300),
                    "{policy}: node {id} admitted after {after:?}"
                );
            }
        }
    }

    // All or nothing, under concurrency: groups of (a, b, c) where c is spent refuse, and leave
    // a and b untouched; 3 nodes × 20 groups at once.
    let (a, b, c) = ("group-a", "group-b", "group-c");
    post(cluster.http(2), "/v1/charge", &serde_json::json!({"key": c, "policy": "exact", "cost": LIMIT}));
    let group = serde_json::json!([
        {"key": a, "policy": "exact"},
        {"key": b, "policy": "exact", "cost": 2},
        {"key": c, "policy": "exact"},
    ]);
    let detours_before: Vec<Detours> = all.iter().map(|&id| Detours::of(cluster.http(id))).collect();
    let refused = std::thread::scope(|scope| {
        let workers: Vec<_> = all
            .iter()
            .map(|&id| {
                let (addr, group) = (cluster.http(id), &group);
                scope.spawn(move || {
                    (0..20).filter(|_| post(addr, "/v1/check/all", group)["allowed"] == false).count()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).sum::<usize>()
    });
    assert_eq!(refused, 60, "every group refused");
    // A forward that timed out on this loaded machine may have been counted by its owner
    // without the group knowing (documented: all-or-nothing errs towards consuming then).
    let timeouts: u64 = all
        .iter()
        .zip(&detours_before)
        .map(|(&id, before)| Detours::of(cluster.http(id)).since(before).timeouts)
        .sum();
    eprintln!("all or nothing: 60 groups refused, {timeouts} forwards timed out meanwhile");
    for id in all {
        let (left_a, left_b) = (remaining(&cluster, id, "exact", a), remaining(&cluster, id, "exact", b));
        if timeouts == 0 {
            assert_eq!((left_a, left_b), (LIMIT, LIMIT), "{a} and {b} untouched on node {id}");
        }
        assert!(
            left_a >= LIMIT - timeouts && left_b >= LIMIT - 2 * timeouts,
            "node {id}: {left_a}, {left_b}"
        );
    }
    let answer = post(cluster.http(3), "/v1/check/all", &group);
    assert_eq!(answer["results"][2]["allowed"].as_bool(), Some(false), "{answer}");
    assert_eq!(answer["results"].as_array().map(Vec::len), Some(3), "{answer}");
    // Without the spent key the group passes and takes from both.
    let passing =
        serde_json::json!([{"key": a, "policy": "exact"}, {"key": b, "policy": "exact", "cost": 2}]);
    let (before_a, before_b) = (remaining(&cluster, 2, "exact", a), remaining(&cluster, 2, "exact", b));
    let detours_before = Detours::of(cluster.http(1));
    let passed = post(cluster.http(1), "/v1/check/all", &passing);
    if Detours::of(cluster.http(1)) == detours_before {
        assert_eq!(passed["allowed"].as_bool(), Some(true), "{passed}");
        assert_eq!(remaining(&cluster, 2, "exact", a), before_a - 1);
        assert_eq!(remaining(&cluster, 3, "exact", b), before_b - 2);
    }

    for node in &mut cluster.nodes {
        node.assert_running();
    }
}

/// How many of 20 checks of `key` under `policy` node `addr` admits (a fresh key each time).
fn admits(addr: SocketAddr, policy: &str, key: &str) -> u64 {
    (0..20).map(|_| u64::from(check(addr, policy, key, 1).0)).sum()
}

#[test]
fn a_live_override_set_on_one_node_governs_every_node_and_survives_a_restart() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("overrides", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let auth = format!("Authorization: Bearer {ADMIN_TOKEN}\r\n");
    let put = |addr: SocketAddr, key: &str, limit: u64| {
        let body = serde_json::json!({ "limit": limit }).to_string();
        let r = request_with(addr, "PUT", &format!("/v1/overrides/exact/{key}"), &auth, Some(&body))
            .expect("answered");
        assert_eq!(r.status, 200, "{}", r.text());
    };
    let limit_on = |addr: SocketAddr, key: &str| {
        let body = serde_json::json!({ "key": key, "policy": "exact", "cost": 0 }).to_string();
        let r = request(addr, "POST", "/v1/check", Some(&body)).expect("answered");
        let answer: Value = serde_json::from_slice(&r.body).expect("JSON");
        answer["limit"].as_u64()
    };
    // Without the token: refused, nothing set.
    let r = request(cluster.http(2), "PUT", "/v1/overrides/exact/tenant:acme", Some(r#"{"limit": 7}"#))
        .expect("answered");
    assert_eq!(r.status, 401, "{}", r.text());

    let set_at = Instant::now();
    put(cluster.http(1), "tenant:acme", 7);
    let mut delays = Vec::new();
    for id in all {
        let addr = cluster.http(id);
        cluster.wait_for(&format!("node {id} applies the override"), || {
            limit_on(addr, "tenant:acme") == Some(7)
        });
        delays.push(set_at.elapsed().as_millis());
    }
    eprintln!("override set on node 1 applied by nodes 1, 2, 3 after {delays:?} ms");
    // It governs checks on every node: the cluster admits 7 of the key, exactly (exact mode),
    // unless a forward timed out on this loaded machine (a fallback decided: see the refund test).
    let before: Vec<Detours> = all.iter().map(|&id| Detours::of(cluster.http(id))).collect();
    let admitted = cluster.admitted("exact", "tenant:acme", 10, &all);
    let other = admits(cluster.http(2), "exact", "tenant:other");
    let detours = all.iter().zip(&before).map(|(&id, b)| Detours::of(cluster.http(id)).since(b));
    let timeouts: u64 = detours.map(|d| d.timeouts + d.fallbacks).sum();
    eprintln!(
        "override: {admitted} of tenant:acme admitted, {other} of 20 of tenant:other ({timeouts} detours)"
    );
    assert!(
        admitted <= 7 + timeouts && admitted + timeouts >= 7,
        "the override's limit, cluster-wide: {admitted}"
    );
    assert!(other + timeouts >= 20 && other > 7, "other keys keep the policy's limit: {other}");
    if timeouts == 0 {
        assert_eq!((admitted, other), (7, 20));
    }

    // Node 3 restarts (no data directory): it learns the override from the others.
    cluster.node(3).kill();
    cluster.wait_view(&[1, 2], &[1, 2], &[3]);
    cluster.node(3).start();
    cluster.wait_ready(&[3]);
    cluster.wait_view(&all, &all, &[]);
    let restarted_at = Instant::now();
    let addr = cluster.http(3);
    cluster.wait_for("restarted node 3 applies the override", || limit_on(addr, "tenant:acme") == Some(7));
    eprintln!(
        "restarted node 3 applied the override {} ms after it was ready",
        restarted_at.elapsed().as_millis()
    );
    let listed = request(addr, "GET", "/v1/overrides/exact", None).expect("answered");
    let listed: Value = serde_json::from_slice(&listed.body).expect("JSON");
    assert_eq!(listed["overrides"][0]["key"], "tenant:acme", "{listed}");

    // A deletion on node 3 reaches the others too.
    let r = request_with(addr, "DELETE", "/v1/overrides/exact/tenant:acme", &auth, None).expect("answered");
    assert_eq!(r.status, 200, "{}", r.text());
    for id in all {
        let addr = cluster.http(id);
        cluster.wait_for(&format!("node {id} drops the override"), || {
            limit_on(addr, "tenant:acme") == Some(LIMIT)
        });
    }
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}

/// `per_node` acquisitions of `key`'s lease under `policy` through each node of `ids` in turn
/// (one at a time); returns the granted leases with the node each went through.
fn acquire(cluster: &Cluster, policy: &str, key: &str, per_node: usize, ids: &[u64]) -> Vec<(u64, String)> {
    let body = serde_json::json!({ "key": key, "policy": policy });
    let mut granted = Vec::new();
    for _ in 0..per_node {
        for &id in ids {
            let answer = post(cluster.http(id), "/v1/check", &body);
            if answer["allowed"].as_bool().expect("an \"allowed\" boolean") {
                let lease = answer["lease"].as_str().expect("a lease id string").to_owned();
                granted.push((id, lease));
            }
        }
    }
    granted
}

/// Issue 41, point 1: concurrency leases released through another node than the one that granted
/// them (a load balancer sends the release anywhere) are all given back, round after round, in
/// both modes (concurrency is decided at the owner either way); then the node that granted a third
/// of them is killed (SIGKILL) after they were taken: released through the others, they come back
/// too (leases live at the key's owner, not at the node a client went through; a lease nobody
/// releases expires a policy period after it was granted).
#[test]
fn concurrency_leases_released_through_any_node_come_back_every_round_and_after_a_crash() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::start("leases", 3, false);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let per_node = 2 * CONC_LIMIT as usize / 3;
    for policy in ["conc-exact", "conc-approx"] {
        // A key that node 1 does not own: node 1 is the one killed below.
        let key =
            (0..).map(|i| format!("leases-{policy}-{i}")).find(|k| owner(policy, k) != 1).expect("a key");
        for round in 0..3 {
            let granted = acquire(&cluster, policy, &key, per_node, &all);
            assert_eq!(granted.len() as u64, CONC_LIMIT, "{policy}, round {round}: {granted:?}");
            for (id, lease) in granted {
                let other = id % 3 + 1;
                let body = serde_json::json!({ "key": key, "policy": policy, "lease": lease });
                let answer = post(cluster.http(other), "/v1/release", &body);
                assert_ne!(answer["released"], Value::Bool(false), "{policy}, round {round}: {answer}");
            }
            // A release sent to the owner is applied when it arrives: poll for it.
            let addrs: Vec<SocketAddr> = all.iter().map(|&id| cluster.http(id)).collect();
            cluster.wait_for(&format!("{policy}: every lease back after round {round}"), || {
                addrs.iter().all(|&addr| remaining_at(addr, policy, &key) == CONC_LIMIT)
            });
        }
    }
    // Leases taken through node 1, then node 1 crashes: released through nodes 2 and 3.
    let policy = "conc-exact";
    let key = (0..).map(|i| format!("crash-{i}")).find(|k| owner(policy, k) != 1).expect("a key");
    let granted = acquire(&cluster, policy, &key, per_node, &all);
    assert_eq!(granted.len() as u64, CONC_LIMIT, "{granted:?}");
    cluster.node(1).kill();
    cluster.wait_view(&[2, 3], &[2, 3], &[1]);
    for (id, lease) in granted {
        let other = if id == 3 { 2 } else { 3 };
        let body = serde_json::json!({ "key": key, "policy": policy, "lease": lease });
        let answer = post(cluster.http(other), "/v1/release", &body);
        assert_ne!(answer["released"], Value::Bool(false), "{answer}");
    }
    // With one member dead, an owner enforces the reachable 2/3 of the limit: all of it free.
    let reachable = CONC_LIMIT * 2 / 3;
    let addrs = [cluster.http(2), cluster.http(3)];
    cluster.wait_for("every lease back after the crash", || {
        addrs.iter().all(|&addr| remaining_at(addr, policy, &key) == reachable)
    });
    let granted = acquire(&cluster, policy, &key, per_node, &[2, 3]);
    assert_eq!(granted.len() as u64, reachable, "after the crash: {granted:?}");

    // Node 1 back; then a key it owns: every lease released through the others, then the owner
    // crashes. Its successor, which held the key's replica, holds none of them: the releases
    // reached the replica too (before, it kept them until they expired, a day here).
    cluster.node(1).start();
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let key = (0..).map(|i| format!("owner-crash-{i}")).find(|k| owner(policy, k) == 1).expect("a key");
    let granted = acquire(&cluster, policy, &key, per_node, &all);
    assert_eq!(granted.len() as u64, CONC_LIMIT, "{granted:?}");
    for (id, lease) in granted {
        let body = serde_json::json!({ "key": key, "policy": policy, "lease": lease });
        let answer = post(cluster.http(id % 3 + 1), "/v1/release", &body);
        assert_ne!(answer["released"], Value::Bool(false), "{answer}");
    }
    let addrs: Vec<SocketAddr> = all.iter().map(|&id| cluster.http(id)).collect();
    cluster.wait_for("every lease back at the owner", || {
        addrs.iter().all(|&addr| remaining_at(addr, policy, &key) == CONC_LIMIT)
    });
    cluster.node(1).kill();
    cluster.wait_view(&[2, 3], &[2, 3], &[1]);
    for id in [2, 3] {
        assert_eq!(remaining(&cluster, id, policy, &key), reachable, "node {id} after the owner's crash");
    }
    let granted = acquire(&cluster, policy, &key, per_node, &[2, 3]);
    assert_eq!(granted.len() as u64, reachable, "after the owner's crash: {granted:?}");
}

/// tests/wan/relay.py, the UDP relay of the WAN harness, in front of every node's gossip and QUIC
/// port (each node advertises its relay ports, so every datagram between members crosses it),
/// with no delay and no loss: its partitions are this file's fault hook. Each node is a relay
/// "region" of its own (the daemons know nothing of regions); the partition cuts `cut_node` off
/// from the others from `cut.start` to `cut.end` after [`Relay::start_clock`]. Killed on drop.
struct Relay {
    child: Child,
}

impl Relay {
    /// Starts the relay of `nodes` (node `i + 1` behind `relay_ports[i]`: gossip, QUIC) and waits
    /// for its "relay ready" line (its sockets are bound).
    fn start(
        dir: &std::path::Path,
        nodes: &[Addrs],
        relay_ports: &[(u16, u16)],
        cut_node: u64,
        cut: std::ops::Range<f64>,
    ) -> Relay {
        let mut sources = serde_json::Map::new();
        let mut listeners = Vec::new();
        for (i, (node, relay)) in nodes.iter().zip(relay_ports).enumerate() {
            sources.insert(node.gossip.port().to_string(), serde_json::json!(i));
            sources.insert(node.quic.port().to_string(), serde_json::json!(i));
            listeners.push(serde_json::json!({ "port": relay.0, "target": node.gossip.port(), "region": i }));
            listeners.push(serde_json::json!({ "port": relay.1, "target": node.quic.port(), "region": i }));
        }
        let regions = nodes.len();
        let config = serde_json::json!({
            "rtt_ms": vec![vec![0; regions]; regions],
            "jitter_ms": 0,
            "loss": 0,
            "seed": 1,
            "partitions": [{ "region": cut_node - 1, "start_s": cut.start, "end_s": cut.end }],
            "sources": sources,
            "listeners": listeners,
        });
        let path = dir.join("relay.json");
        std::fs::write(&path, config.to_string()).expect("write the relay configuration");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/wan/relay.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs tests/wan/relay.py (the partition hook of the audit test)");
        let mut ready = String::new();
        // Bounded: the relay prints the line or exits (end of stream).
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut ready).expect("relay output");
        assert_eq!(ready.trim(), "relay ready", "tests/wan/relay.py did not start");
        Relay { child }
    }

    /// Marks the relay's time zero: the partition is timed from now.
    fn start_clock(&self) {
        let status =
            Command::new("kill").args(["-USR1", &self.child.id().to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -USR1 the relay");
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cluster {
    /// Three nodes like [`Cluster::start`], every datagram between them through a [`Relay`] that
    /// cuts node `cut_node` off from `cut.start` to `cut.end` seconds after its clock starts.
    fn start_relayed(
        name: &str,
        gossip_ms: u64,
        cut_node: u64,
        cut: std::ops::Range<f64>,
    ) -> (Cluster, Relay) {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(cluster_id(name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        // Six nodes' worth of distinct ports: three nodes, and the relay's ports (the UDP ports of
        // the other three).
        let mut addrs = free_addrs(6);
        let relay_ports: Vec<(u16, u16)> =
            addrs.split_off(3).iter().map(|a| (a.gossip.port(), a.quic.port())).collect();
        let relay = Relay::start(&dir, &addrs, &relay_ports, cut_node, cut);
        let seed = format!("\"127.0.0.1:{}\"", relay_ports[0].0);
        let mut cluster = Cluster { dir: dir.clone(), nodes: Vec::new() };
        for (i, addrs) in addrs.into_iter().enumerate() {
            let id = i as u64 + 1;
            let seeds = if id == 1 { String::new() } else { seed.clone() };
            let (gossip_port, quic_port) = relay_ports[i];
            let text = node_config(&cluster_id(name), id, &addrs, &seeds, "")
                .replace(
                    &format!("gossip_interval_ms = {GOSSIP_INTERVAL_MS}\n"),
                    &format!("gossip_interval_ms = {gossip_ms}\n"),
                )
                .replace(
                &format!("quic = \"{}\"\n", addrs.quic),
                &format!(
                    "quic = \"{}\"\nadvertise_gossip = \"127.0.0.1:{gossip_port}\"\nadvertise_quic = \"127.0.0.1:{quic_port}\"\n",
                    addrs.quic
                ),
            );
            let config = dir.join(format!("node-{id}.toml"));
            std::fs::write(&config, text).expect("write the configuration");
            let log = dir.join(format!("node-{id}.log"));
            cluster.nodes.push(Daemon { id, addrs, config, log, child: None });
        }
        for node in &mut cluster.nodes {
            node.start();
        }
        (cluster, relay)
    }
}

/// What [`audited_load`] counted from the outside: checks sent and admitted, admissions per Unix
/// second (by the check's answer), and when the load began and ended (Unix seconds).
#[derive(Debug, Default)]
struct OutsideCount {
    sent: u64,
    admitted: u64,
    per_second: std::collections::BTreeMap<u64, u64>,
    first_sent: f64,
    last_answered: f64,
}

/// Checks of `key` under `policy` at `rate` per second to each node of `ids` for `run` (one paced
/// thread per node; a thread behind its schedule sends at once), admissions counted per Unix
/// second of their answer.
fn audited_load(
    cluster: &Cluster,
    (policy, key): (&str, &str),
    ids: &[u64],
    rate: u64,
    run: Duration,
) -> OutsideCount {
    let body = serde_json::json!({ "key": key, "policy": policy }).to_string();
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let counts: Vec<OutsideCount> = std::thread::scope(|scope| {
        let workers: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (addr, body) = (cluster.http(id), body.as_str());
                scope.spawn(move || {
                    let mut count = OutsideCount { first_sent: unix_s(), ..OutsideCount::default() };
                    // Bounded by `run`: one request per interval of the schedule.
                    for i in 0.. {
                        let at = interval * i;
                        if at >= run {
                            break;
                        }
                        if let Some(ahead) = (start + at).checked_duration_since(Instant::now()) {
                            // The pace of a load generator, not a synchronization.
                            std::thread::sleep(ahead);
                        }
                        let response =
                            request(addr, "POST", "/v1/check", Some(body)).expect("check answered");
                        assert_eq!(response.status, 200, "node {id}: {}", response.text());
                        let answer: Value = serde_json::from_slice(&response.body).expect("JSON answer");
                        count.sent += 1;
                        count.last_answered = unix_s();
                        if answer["allowed"].as_bool().expect("allowed") {
                            count.admitted += 1;
                            *count.per_second.entry(count.last_answered as u64).or_default() += 1;
                        }
                    }
                    count
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("load thread")).collect()
    });
    let mut total = OutsideCount { first_sent: f64::MAX, ..OutsideCount::default() };
    for count in counts {
        total.sent += count.sent;
        total.admitted += count.admitted;
        total.first_sent = total.first_sent.min(count.first_sent);
        total.last_answered = total.last_answered.max(count.last_answered);
        for (second, admitted) in count.per_second {
            *total.per_second.entry(second).or_default() += admitted;
        }
    }
    total
}

/// One hit of `key` through its owner `owner` (the audit record starts then: its first window is
/// incomplete unless the owner trusts the key's birth — its view calm for the second its limit
/// takes to refill — and so is the next, within the ideal bucket's memory of it: a second at
/// 100/s with a burst of 100), then a wait for the Unix second after the next plus 100 ms, so that the
/// load that follows lands in complete windows only (the audit's windows are Unix seconds on
/// every node's clock).
fn start_audit_record(cluster: &Cluster, (policy, key): (&str, &str), owner: u64) {
    assert!(check(cluster.http(owner), policy, key, 1).0, "the first hit of {key} is admitted");
    let next_second = unix_s().floor() + 2.1;
    // Waits for a time of day (window alignment), not for an event.
    std::thread::sleep(Duration::from_secs_f64((next_second - unix_s()).max(0.0)));
}

/// Polls `GET /v1/audit?policy=` on node `id` until all three members answer and the policy's
/// complete windows number at least `windows` (the windows of the load: each closes a settle time after it ends, and after
/// a cut only once every member is heard again), and returns the policy's row and the answer.
fn audit_after(cluster: &mut Cluster, id: u64, policy: &str, windows: u64) -> (Value, Value) {
    let addr = cluster.http(id);
    let path = format!("/v1/audit?policy={policy}&n=5");
    let mut answer = Value::Null;
    cluster.wait_for(&format!("the audit of {policy} closed {windows} windows"), || {
        let Ok(response) = request(addr, "GET", &path, None) else { return false };
        answer = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        // Every member in the answer: after a heal, a member may be seen dead again for a few
        // gossip rounds (its silence still weighs on the failure detector).
        answer["nodes_answered"] == 3
            && answer["policies"]
                .as_array()
                .and_then(|rows| rows.first())
                .is_some_and(|row| row["key_windows"].as_u64().unwrap_or(0) >= windows)
    });
    (answer["policies"][0].clone(), answer)
}

/// The audit on real processes (issue 46): three daemons, one key at 1.5 × its limit (100 per
/// second, fail open) spread evenly over the three nodes, counted from the outside.
///
/// - Control, no fault: the audit reports `over_admission_ratio` ≤ 0.02 (the first checks of the
///   followers before their first grant are the only excess) and counts every admission the
///   outside counted.
/// - Node 3 cut off from the others for 3 s by the relay (tests/wan/relay.py; the key's owner is
///   node 1), well under failure detection at 2 s gossip (a member declared dead leaves the
///   ring and node 3 would own the key itself; the audit cannot see that side: see the report
///   of issue 46): node 3 admits everything it is sent (fail open) while the owner holds node
///   3's share for it, so the cluster over-admits by about a sixth. The windows stay open
///   through the cut and close once node 3 is heard again, with what it admitted meanwhile: the
///   audit reports `over_admission_ratio` > 0, every window complete, and its admitted count
///   within 2 % (plus 5 hits) of the outside count. Totals are compared, not seconds: the audit
///   places hits by the owner's clock.
#[test]
fn the_audit_reports_what_the_cluster_admitted_and_the_over_admission_of_a_cut() {
    const RATE_PER_NODE: u64 = AUDIT_LIMIT / 2;
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (cut_start, cut_end) = (4.0, 7.0);
    let (mut cluster, relay) = Cluster::start_relayed("audit", 2000, 3, cut_start..cut_end);
    let all = [1, 2, 3];
    cluster.wait_ready(&all);
    cluster.wait_view(&all, &all, &[]);
    let owned_by_1 = |policy: &str| {
        (0..1000)
            .map(|i| format!("audited-{i}"))
            .find(|key| owner(policy, key) == 1)
            .expect("a key of node 1")
    };

    // Control: no fault.
    let control = ("audit-control", owned_by_1("audit-control"));
    start_audit_record(&cluster, (control.0, &control.1), 1);
    let outside =
        audited_load(&cluster, (control.0, &control.1), &all, RATE_PER_NODE, Duration::from_secs(8));
    let windows = outside.last_answered.ceil() as u64 - outside.first_sent.floor() as u64;
    let (row, _) = audit_after(&mut cluster, 1, control.0, windows);
    eprintln!(
        "control: outside sent {}, admitted {} per second {:?}; audit {row}",
        outside.sent, outside.admitted, outside.per_second
    );
    let over = row["over_admission_ratio"].as_f64().expect("a ratio");
    assert!(over <= 0.02, "no fault, yet the audit reports an over-admission of {over}: {row}");
    let audited = row["admitted"].as_u64().expect("admitted");
    let tolerance = outside.admitted / 50 + 5;
    assert!(
        audited.abs_diff(outside.admitted) <= tolerance,
        "audit admitted {audited}, outside {}",
        outside.admitted
    );
    let incomplete = row["incomplete_key_windows"].as_u64();
    assert!(incomplete <= Some(1), "at most the first window, begun before the record: {row}");

    // Node 3 cut off for 3 s, then healed. The load ends just before the heal: once node 3 is
    // heard again, the owner applies what it admitted meanwhile and its bucket pays the excess
    // back (then the cluster admits less than the ideal: false refusals), which a load going on
    // would add to the minute the audit sums.
    let cut = ("audit-cut", owned_by_1("audit-cut"));
    start_audit_record(&cluster, (cut.0, &cut.1), 1);
    relay.start_clock();
    let run = Duration::from_secs_f64(cut_end - 0.2);
    let outside = audited_load(&cluster, (cut.0, &cut.1), &all, RATE_PER_NODE, run);
    cluster.wait_view(&all, &all, &[]);
    let windows = outside.last_answered.ceil() as u64 - outside.first_sent.floor() as u64;
    let (row, answer) = audit_after(&mut cluster, 2, cut.0, windows);
    let late = request(cluster.http(1), "GET", "/metrics", None).expect("metrics").text();
    let late = late.lines().find(|line| line.starts_with("ratemesh_audit_late_hits_total")).unwrap_or("-");
    eprintln!(
        "cut: outside sent {}, admitted {} per second {:?}; audit {row}; owner's {late}",
        outside.sent, outside.admitted, outside.per_second
    );
    let over = row["over_admission_ratio"].as_f64().expect("a ratio");
    assert!(over > 0.0, "node 3 admitted everything for 3 s, yet the audit reports no over-admission: {row}");
    let audited = row["admitted"].as_u64().expect("admitted");
    let tolerance = outside.admitted / 50 + 5;
    assert!(
        audited.abs_diff(outside.admitted) <= tolerance,
        "audit admitted {audited}, outside {}",
        outside.admitted
    );
    assert!(audited > row["ideal"].as_u64().expect("ideal"), "{row}");
    let incomplete = row["incomplete_key_windows"].as_u64();
    assert!(incomplete <= Some(1), "the cut did not make windows incomplete: {row}");
    assert!(row["admitted_over_limit_ratio"].as_f64().expect("a ratio") > 1.0, "{row}");
    // Cluster-wide, asked through node 2: node 1's key, named, first among the worst.
    assert_eq!(
        (answer["nodes_asked"].as_u64(), answer["nodes_answered"].as_u64()),
        (Some(3), Some(3)),
        "{answer}"
    );
    let worst = &answer["keys"][0];
    assert_eq!((worst["key"].as_str(), worst["owner"].as_u64()), (Some(cut.1.as_str()), Some(1)), "{answer}");
    assert!(worst["over_admitted"].as_u64().expect("over_admitted") > 0, "{answer}");
    // The same as a table from the CLI.
    let table = Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
        .args(["audit", "--policy", cut.0, "-n", "1", "--addr", &cluster.http(3).to_string()])
        .env_clear()
        .output()
        .expect("ratemeshd audit runs");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success() && text.contains(cut.1.as_str()) && text.contains("audit-cut"), "{text}");
    // Bad queries: an unknown policy is 404, a bad n 400.
    let unknown = request(cluster.http(1), "GET", "/v1/audit?policy=nope", None).expect("answered");
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    assert_eq!(get_json(&cluster, 1, "/v1/audit?n=0", 400)["field"], "n");
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}
