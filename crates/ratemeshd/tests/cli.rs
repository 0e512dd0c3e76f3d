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
fn unwired_commands_exit_2() {
    for args in [&[][..], &["serve"], &["check"], &["cluster"]] {
        let out = ratemeshd(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("not wired yet"), "{args:?}");
    }
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
