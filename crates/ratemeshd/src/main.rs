//! The `ratemeshd` command line.
//!
//! ```text
//! ratemeshd [serve] [--config FILE]      run a node (the default command)
//! ratemeshd check                        ask a running node from the shell
//! ratemeshd cluster                      print members, owners, ring balance
//! ratemeshd certs --out DIR --nodes 1,2,3
//! ratemeshd validate --config FILE
//! ```
//!
//! `serve`, `check` and `cluster` need the network servers, which are not wired yet: they exit
//! with status 2 after saying so (`serve` validates its configuration first).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use ratemesh::NodeId;
use ratemesh::security::{CERT_FILES_NODES_MAX, ClusterCa, write_cert_files};
use ratemeshd::Config;

/// Exit status of a command that is not wired to the network yet.
const EXIT_NOT_WIRED: u8 = 2;

/// The ratemesh daemon: one global rate limit per key across a cluster, over HTTP and the Envoy
/// Rate Limit Service.
#[derive(Debug, Parser)]
#[command(name = "ratemeshd", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Options of `serve`, the command run when none is given.
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node (the default).
    Serve(ServeArgs),
    /// Ask a running node for a decision (not wired yet).
    Check,
    /// Print the cluster's members, key owners and ring balance (not wired yet).
    Cluster,
    /// Create a cluster CA and a certificate per node, for `ca_cert_path`/`cert_path`/`key_path`.
    Certs(CertsArgs),
    /// Check a configuration file (and the RATEMESH_ environment overrides) and exit.
    Validate(ValidateArgs),
}

#[derive(Debug, Default, Args)]
struct ServeArgs {
    /// The configuration file; without it, the embedded default (a single node on loopback).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CertsArgs {
    /// The directory to write into (created if missing; existing files are never overwritten).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The node ids to issue certificates for, comma separated.
    #[arg(long, value_name = "IDS", value_delimiter = ',', required = true)]
    nodes: Vec<u64>,
}

#[derive(Debug, Args)]
struct ValidateArgs {
    /// The configuration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => serve(&cli.serve),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Check) => Ok(not_wired("check")),
        Some(Command::Cluster) => Ok(not_wired("cluster")),
        Some(Command::Certs(args)) => certs(&args),
        Some(Command::Validate(args)) => Ok(validate(&args.config)),
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::FAILURE
    })
}

/// The configuration `serve` would run on: the file (or the embedded default) with the process's
/// `RATEMESH_` overrides.
fn load_config(path: Option<&Path>) -> Result<Config, ratemeshd::ConfigError> {
    match path {
        Some(path) => Config::load_with_env(path, std::env::vars_os()),
        None => Config::parse_with_env("", "<embedded default>", std::env::vars_os()),
    }
}

/// PLACEHOLDER until the servers are wired: validates the configuration, then exits with
/// [`EXIT_NOT_WIRED`].
fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    eprintln!(
        "ratemeshd: configuration ok (node {}, {} policies, HTTP {}), but serving is not wired yet",
        config.node.id.0,
        config.policies.len(),
        config.listen.http,
    );
    Ok(ExitCode::from(EXIT_NOT_WIRED))
}

/// PLACEHOLDER for the commands that talk to a running node.
fn not_wired(command: &str) -> ExitCode {
    eprintln!("ratemeshd {command}: not wired yet (needs the HTTP API of a running node)");
    ExitCode::from(EXIT_NOT_WIRED)
}

fn validate(path: &Path) -> ExitCode {
    match load_config(Some(path)) {
        Ok(config) => {
            println!("ok: {} ({} policies)", path.display(), config.policies.len());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn certs(args: &CertsArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        args.nodes.len() <= CERT_FILES_NODES_MAX,
        "{} nodes requested, at most {CERT_FILES_NODES_MAX}",
        args.nodes.len()
    );
    let mut nodes: Vec<NodeId> = args.nodes.iter().copied().map(NodeId).collect();
    nodes.sort_unstable();
    nodes.dedup();
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let ca = ClusterCa::generate().context("generating the cluster CA")?;
    let files = write_cert_files(&args.out, &ca, &nodes).context("writing certificates")?;
    println!("CA certificate: {}", files.ca_cert.display());
    println!(
        "CA key:         {} (keep it offline: it can issue certificates for any node)",
        files.ca_key.display()
    );
    for node in &files.nodes {
        println!("node {}: {} {}", node.node.0, node.cert.display(), node.key.display());
    }
    println!("\nIn each node's configuration file:\n");
    println!("[cluster]\nca_cert_path = {:?}", files.ca_cert.display().to_string());
    println!("cert_path = \"{}\"", args.out.join("node-<id>.pem").display());
    println!("key_path = \"{}\"", args.out.join("node-<id>.key").display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_command_means_serve() {
        let cli = Cli::try_parse_from(["ratemeshd"]).expect("parses");
        assert!(cli.command.is_none() && cli.serve.config.is_none());
        let cli = Cli::try_parse_from(["ratemeshd", "--config", "a.toml"]).expect("parses");
        assert_eq!(cli.serve.config.as_deref(), Some(Path::new("a.toml")));
        assert!(
            Cli::try_parse_from(["ratemeshd", "--config", "a.toml", "validate", "--config", "b"]).is_err()
        );
    }

    #[test]
    fn certs_takes_a_comma_separated_node_list() {
        let cli =
            Cli::try_parse_from(["ratemeshd", "certs", "--out", "d", "--nodes", "1,2,3"]).expect("parses");
        let Some(Command::Certs(args)) = cli.command else { panic!("certs expected") };
        assert_eq!(args.nodes, [1, 2, 3]);
        assert!(Cli::try_parse_from(["ratemeshd", "certs", "--out", "d"]).is_err());
        assert!(Cli::try_parse_from(["ratemeshd", "certs", "--out", "d", "--nodes", "1,x"]).is_err());
    }
}
