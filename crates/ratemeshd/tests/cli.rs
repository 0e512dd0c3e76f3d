//! The `ratemeshd` binary's exit codes and messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ratemeshd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
        .args(args)
        // Overrides of the machine running the tests must not leak in.
        .env_clear()
        .output()
        .expect("ratemeshd runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ratemeshd-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ratemesh.example.toml").display().to_string()
}

#[test]
fn validate_accepts_the_example() {
    let out = ratemeshd(&["validate", "--config", &example()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
}

/// An answer that cannot be written (standard output on a full device, or a pipe closed early)
/// is an error exit with the reason, not a panic.
#[test]
fn an_unwritable_standard_output_is_exit_2_not_a_panic() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
        .args(["validate", "--config", &example()])
        .env_clear()
        .stdout(full)
        .output()
        .expect("ratemeshd runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: writing the answer to standard output: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn validate_names_line_and_field_and_exits_1() {
    let dir = scratch("validate");
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[[policies]]\nname = \"a\"\nalgorithm = \"token_bucket\"\nlimit = 0\nperiod_ms = 1\n",
    )
    .expect("write");
    let out = ratemeshd(&["validate", "--config", &path.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.toml:4:9: policies[0].limit: limit must be at least 1"), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn check_and_cluster_exit_2_when_no_node_answers() {
    // A port nothing listens on: bound, then closed.
    let addr =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").to_string();
    for args in [
        &["check", "--addr", &addr, "--policy", "p", "--key", "k", "--timeout-ms", "2000"][..],
        &["cluster", "--addr", &addr, "--timeout-ms", "2000"],
    ] {
        let out = ratemeshd(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&addr), "{args:?} names the address");
    }
}

/// The next line from `lines`, or `None` once `deadline` passed (or the sender is gone). One
/// deadline bounds a whole loop of calls: a log that keeps producing lines cannot extend it.
fn next_line(lines: &std::sync::mpsc::Receiver<String>, deadline: std::time::Instant) -> Option<String> {
    let left = deadline.checked_duration_since(std::time::Instant::now())?;
    lines.recv_timeout(left).ok()
}

/// Kills the child on drop, so that a failing test leaves nothing running.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_answers_check_and_cluster_then_stops_gracefully_on_sigterm() {
    use std::io::BufRead as _;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let dir = scratch("serve");
    let path = dir.join("ratemesh.toml");
    std::fs::write(
        &path,
        "[listen]\nhttp = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\ngossip = \"127.0.0.1:0\"\nquic = \"127.0.0.1:0\"\n\n\
         [[policies]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod_ms = 3600000\n\
         tiers = [{ name = \"pro\", limit = 3 }]\n",
    )
    .expect("write");
    let child = Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
        .args(["serve", "--config", &path.display().to_string()])
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ratemeshd starts");
    let mut serving = Serving(child);
    // The bound HTTP address is in the "serving" log line; the log is read on a thread so that
    // waiting for it is bounded.
    let stderr = serving.0.stderr.take().expect("stderr");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait = Duration::from_secs(60);
    let mut log = Vec::new();
    let deadline = Instant::now() + wait;
    // Bounded by the deadline.
    let addr = loop {
        let line = next_line(&lines, deadline).unwrap_or_else(|| panic!("no serving line: {log:#?}"));
        if let Some(rest) = line.split(" serving http=").nth(1) {
            break rest.split_whitespace().next().expect("an address").to_owned();
        }
        log.push(line);
    };
    let check = ["check", "--addr", &addr, "--policy", "api", "--key", "k"];
    let first = ratemeshd(&check);
    assert_eq!(first.status.code(), Some(0), "allowed: {}", String::from_utf8_lossy(&first.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&first.stdout).expect("JSON on stdout");
    assert_eq!(answer["allowed"], serde_json::json!(true));
    assert_eq!(ratemeshd(&check).status.code(), Some(1), "refused");
    // A negative cost is a refund: the hit comes back, and the next check passes.
    let refund = ratemeshd(&[&check[..], &["--cost", "-1"]].concat());
    assert_eq!(refund.status.code(), Some(0), "refunded: {}", String::from_utf8_lossy(&refund.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&refund.stdout).expect("JSON on stdout");
    assert_eq!(
        (answer["allowed"].as_bool(), answer["remaining"].as_u64()),
        (Some(true), Some(1)),
        "{answer}"
    );
    assert_eq!(ratemeshd(&check).status.code(), Some(0), "the refunded hit passes");
    assert_eq!(ratemeshd(&check).status.code(), Some(1), "and only it");
    // A tier is the check's `tier`: its own limit, and an unknown one is the node's 400.
    let pro = ratemeshd(&[&check[..], &["--tier", "pro"]].concat());
    assert_eq!(pro.status.code(), Some(0), "{}", String::from_utf8_lossy(&pro.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&pro.stdout).expect("JSON on stdout");
    assert_eq!((answer["limit"].as_u64(), answer["remaining"].as_u64()), (Some(3), Some(2)), "{answer}");
    let gold = ratemeshd(&[&check[..], &["--tier", "gold"]].concat());
    assert_eq!(gold.status.code(), Some(2), "an unknown tier is an error");
    assert!(
        String::from_utf8_lossy(&gold.stderr).contains("400"),
        "{}",
        String::from_utf8_lossy(&gold.stderr)
    );
    let unknown = ratemeshd(&["check", "--addr", &addr, "--policy", "nope", "--key", "k"]);
    assert_eq!(unknown.status.code(), Some(2), "an unknown policy is an error");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("404"));
    let inline = ratemeshd(&[
        "check",
        "--addr",
        &addr,
        "--key",
        "k",
        "--algorithm",
        "gcra",
        "--limit",
        "5",
        "--period-ms",
        "1000",
    ]);
    assert_eq!(inline.status.code(), Some(0), "{}", String::from_utf8_lossy(&inline.stderr));
    let cluster = ratemeshd(&["cluster", "--addr", &addr]);
    assert!(cluster.status.success(), "{}", String::from_utf8_lossy(&cluster.stderr));
    let table = String::from_utf8_lossy(&cluster.stdout);
    assert!(table.contains("node 1 of cluster ratemesh: ready") && table.contains("100.0%"), "{table}");

    // SIGHUP (through the shell's kill builtin) reloads the file: a new policy is served. The
    // file watcher may see the change first; either way a "configuration reloaded" line says so.
    let pid = serving.0.id().to_string();
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, text.replace("name = \"api\"", "name = \"later\"")).expect("write");
    let hup = Command::new("sh").args(["-c", &format!("kill -HUP {pid}")]).status().expect("sh runs");
    assert!(hup.success());
    let deadline = Instant::now() + wait;
    // Bounded by the deadline.
    loop {
        let line = next_line(&lines, deadline).unwrap_or_else(|| panic!("no reload line: {log:#?}"));
        let reloaded = line.contains("configuration reloaded");
        log.push(line);
        if reloaded {
            break;
        }
    }
    let later = ratemeshd(&["check", "--addr", &addr, "--policy", "later", "--key", "k"]);
    assert_eq!(later.status.code(), Some(0), "{}", String::from_utf8_lossy(&later.stderr));

    // SIGTERM: a graceful stop, exit status 0.
    let kill = Command::new("sh").args(["-c", &format!("kill -TERM {pid}")]).status().expect("sh runs");
    assert!(kill.success());
    // The process exits once the node left the cluster; its stderr then closes, which ends the
    // reader thread and disconnects the channel.
    let mut tail = Vec::new();
    let deadline = Instant::now() + wait;
    // Ends when the process closes its stderr, or at the deadline.
    while let Some(line) = next_line(&lines, deadline) {
        tail.push(line);
    }
    let tail = tail.join("\n");
    assert!(tail.contains("signal=\"SIGTERM\"") && tail.contains("node left the cluster"), "{tail}");
    let exit = serving.0.wait().expect("exited");
    assert!(exit.success(), "{exit:?}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn certs_writes_a_ca_and_node_certificates_once() {
    let dir = scratch("certs");
    let out_dir = dir.join("out");
    let out = ratemeshd(&["certs", "--out", &out_dir.display().to_string(), "--nodes", "1,2,3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for file in ["ca.pem", "ca.key", "node-1.pem", "node-1.key", "node-3.pem", "node-3.key"] {
        assert!(out_dir.join(file).is_file(), "{file}");
    }
    // A second run refuses to overwrite anything.
    let again = ratemeshd(&["certs", "--out", &out_dir.display().to_string(), "--nodes", "4"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Issue 41, point 2: `validate` checks the cluster certificates as a start loads them, and names
/// the file and the reason: missing files, a file of the wrong kind, a key of another
/// certificate, a certificate of another CA, a certificate of another node. Certificates that
/// fit validate, and a start refuses what validate refuses.
#[test]
fn validate_checks_the_cluster_certificates_a_start_would_load() {
    let dir = scratch("validate-certs");
    let (ours, theirs) = (dir.join("ours"), dir.join("theirs"));
    for (out, nodes) in [(&ours, "1,2"), (&theirs, "1")] {
        let made = ratemeshd(&["certs", "--out", &out.display().to_string(), "--nodes", nodes]);
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    }
    let path = |dir: &Path, file: &str| dir.join(file).display().to_string();
    let config = dir.join("node.toml");
    let validate = |id: u64, ca: &str, cert: &str, key: &str| {
        let text = format!(
            "[node]\nid = {id}\n[cluster]\nsecret = \"the gossip secret, 16+ bytes\"\n\
             ca_cert_path = {ca:?}\ncert_path = {cert:?}\nkey_path = {key:?}\n"
        );
        std::fs::write(&config, text).expect("write");
        let out = ratemeshd(&["validate", "--config", &config.display().to_string()]);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ca, cert, key) = (path(&ours, "ca.pem"), path(&ours, "node-1.pem"), path(&ours, "node-1.key"));
    assert_eq!(validate(1, &ca, &cert, &key), (Some(0), String::new()));
    let missing = path(&dir, "missing/ca.pem");
    let cases = [
        (1, missing.clone(), cert.clone(), key.clone(), missing.clone(), "No such file"),
        (1, ca.clone(), missing.clone(), key.clone(), missing.clone(), "No such file"),
        (1, ca.clone(), cert.clone(), missing.clone(), missing.clone(), "No such file"),
        (1, ca.clone(), key.clone(), key.clone(), key.clone(), "no valid node certificate"),
        (1, ca.clone(), cert.clone(), cert.clone(), cert.clone(), "no valid private key"),
        (1, ca.clone(), cert.clone(), path(&ours, "node-2.key"), path(&ours, "node-2.key"), "does not match"),
        (
            1,
            path(&theirs, "ca.pem"),
            cert.clone(),
            key.clone(),
            cert.clone(),
            "not accepted by the cluster CA",
        ),
        (2, ca.clone(), cert.clone(), key.clone(), cert.clone(), "expected NodeId(2)"),
    ];
    for (id, ca, cert, key, named, reason) in cases {
        let (code, stderr) = validate(id, &ca, &cert, &key);
        assert_eq!(code, Some(1), "{ca} {cert} {key}: {stderr}");
        assert!(stderr.contains(&format!("{named}: ")) && stderr.contains(reason), "{reason}: {stderr}");
    }
    // The start checks the same: the last configuration (node 2, node 1's certificate) fails.
    let out = ratemeshd(&["serve", "--config", &config.display().to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NodeId(2)"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
