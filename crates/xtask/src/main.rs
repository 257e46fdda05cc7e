//! `cargo xtask <task>`: project automation that needs nothing but cargo, so it works on a fresh
//! machine.
//!
//! - `test`: format check, clippy with warnings denied, every test of the workspace.
//! - `lint`: the format check and clippy only.

use std::process::{Command, ExitCode};

fn cargo(args: &[&str]) -> bool {
    eprintln!("xtask: cargo {}", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    match Command::new(cargo).args(args).status() {
        Ok(status) => status.success(),
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            false
        }
    }
}

fn lint() -> bool {
    cargo(&["fmt", "--all", "--", "--check"])
        && cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ])
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let ok = match task.as_str() {
        "test" => lint() && cargo(&["test", "--workspace", "--locked"]),
        "lint" => lint(),
        other => {
            eprintln!("xtask: unknown task {other:?}; tasks: test, lint");
            false
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
