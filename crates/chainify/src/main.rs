//! The `chainify` command.
//!
//! Subcommands available now: `init` (keys and configs for a local network) and `analyze` (the
//! read/write sets and conflicts of a block of SQL transactions, as JSON). The node, demo, bench
//! and client subcommands arrive with the services milestones.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod analyze;
mod init;

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
    /// Write keys and configuration files for a local network of N organizations.
    Init(init::InitArgs),
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
        Command::Init(args) => init::run(&args),
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
