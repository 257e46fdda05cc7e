//! The `chainify` command: `demo` (the whole system in one process), `bench` (measured runs of a
//! network), `init` (keys and configs), `node` and `orderer` (the services), `devnet` (a network
//! of processes on loopback), the client commands on the SDK (`submit`, `query`, `tx-status`,
//! `status`), `verify-ledger` (offline) and `analyze` (read/write sets and conflicts of a block,
//! as JSON).
//!
//! Where it sits: the top of the workspace. It depends on every library crate and nothing
//! depends on it; it only parses options and wires the libraries together.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod analyze;
mod client;
mod demo;
mod devnet;
mod init;
mod serve;

#[derive(Debug, Parser)]
#[command(
    name = "chainify",
    version,
    about = "A permissioned blockchain layer over ordinary SQL databases"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The whole system in one process with nothing to set up: organizations on SQLite, the
    /// in-process orderer, Smallbank load, one organization tampered with and repaired, and a
    /// summary. Exit code 0 when every organization agrees at the end.
    Demo(demo::DemoArgs),
    /// A measured run of an in-process network (SQLite, PostgreSQL or MariaDB organizations)
    /// under closed-loop clients: result.json and result.svg. Exit code 0 when every
    /// organization agrees at the end.
    Bench(chainify_bench::run::BenchArgs),
    /// Write keys and configuration files for a local network of N organizations.
    Init(init::InitArgs),
    /// Issue one TLS certificate from the network's CA, for an organization or the solo
    /// orderer: a network whose certificates predate organization names, a new host.
    IssueCert(init::IssueCertArgs),
    /// Run one organization's components (ChainifyServer, ExecutionServer, CommitServer) with
    /// its gRPC services, until SIGINT or SIGTERM.
    Node(serve::NodeArgs),
    /// Run the solo orderer of a network (for networks of processes without Kafka).
    Orderer(serve::OrdererArgs),
    /// A development network of processes on loopback: up, down, status, start, stop.
    Devnet {
        #[command(subcommand)]
        command: devnet::DevnetCommand,
    },
    /// Submit a transaction as a client; prints its id (or, with --wait, its outcome) as JSON.
    Submit(client::SubmitArgs),
    /// Run a read-only SELECT at an organization's newest agreed block; prints JSON rows.
    Query(client::QueryArgs),
    /// What an organization knows of a transaction.
    TxStatus(client::TxStatusArgs),
    /// Heights, lag and recovery state of organizations' components.
    Status(client::StatusArgs),
    /// Verify a ledger offline against the network file: numbering, hash chain, certificates
    /// and signatures. Exit code 0 when it verifies, 1 when not (naming the first bad block),
    /// 2 when it cannot be read.
    VerifyLedger(client::VerifyArgs),
    /// Print the read/write sets of a block of transactions and every conflicting pair, as JSON.
    Analyze {
        /// File with the shared tables' CREATE TABLE statements.
        #[arg(long)]
        schema: PathBuf,
        /// JSON array of transactions; each is an array of {"sql": "...", "params": [...]}.
        block: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => {
            return match demo::run(&args) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("chainify demo: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Bench(args) => {
            return match chainify_bench::run::run(&args) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("chainify bench: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Init(args) => init::run(&args),
        Command::IssueCert(args) => init::issue_cert(&args),
        Command::Node(args) => serve::node(&args),
        Command::Orderer(args) => serve::orderer(&args),
        Command::Devnet { command } => devnet::run(&command),
        Command::Submit(args) => client::submit(&args),
        Command::Query(args) => client::query(&args),
        Command::TxStatus(args) => client::tx_status(&args),
        Command::Status(args) => client::status(&args),
        Command::VerifyLedger(args) => {
            return match client::verify(&args) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("chainify: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Analyze { schema, block } => analyze::run(&schema, &block),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chainify: {e:#}");
            ExitCode::FAILURE
        }
    }
}
