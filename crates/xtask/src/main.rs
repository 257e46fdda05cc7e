//! `cargo xtask <task>`: project automation that needs nothing but cargo, so it works on a fresh
//! machine. It depends on no crate at all (not even the workspace's) and runs processes and
//! servers on the local machine; nothing depends on it.
//!
//! - `test`: format check, clippy with warnings denied, then the PostgreSQL, MariaDB and Kafka
//!   test servers (started if not running), then every test of the workspace, then every
//!   Criterion benchmark once (`cargo bench --workspace -- --test`).
//! - `lint`: the format check and clippy only.
//! - `difftest [--cases N] [--seed S]`: the differential test of the portable SQL subset on
//!   PostgreSQL, MariaDB and SQLite with N cases (on seed S alone, or half on a fixed seed and
//!   half on a fresh one); prints cases run, refused by analysis, failed alike and differences.
//! - `services start|stop [postgres|mariadb|kafka|all]`, `services status`, `services env`:
//!   throw-away database and Kafka servers for the integration tests, on private ports of
//!   127.0.0.1 with their data under `target/services/` (see `services.rs`).

mod services;

use std::process::{Command, ExitCode};

fn cargo(args: &[&str]) -> bool {
    cargo_with_env(args, &[])
}

fn cargo_with_env(args: &[&str], env: &[(&str, String)]) -> bool {
    eprintln!("xtask: cargo {}", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    match command.status() {
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

/// `difftest [--cases N] [--seed S]`.
fn difftest(args: &[String]) -> bool {
    let mut cases: u64 = 10_000;
    let mut seed = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next();
        match (flag.as_str(), value.map(|v| v.parse::<u64>())) {
            ("--cases", Some(Ok(n))) if n > 0 => cases = n,
            ("--seed", Some(Ok(s))) => seed = Some(s),
            _ => {
                eprintln!(
                    "xtask: difftest takes --cases N (a positive number) and --seed S, not {flag} {}",
                    value.map_or("", String::as_str)
                );
                return false;
            }
        }
    }
    let Some(mut env) = services::start_for_tests() else {
        return false;
    };
    match seed {
        Some(s) => {
            env.push(("DIFFTEST_CASES", cases.to_string()));
            env.push(("DIFFTEST_SEED", s.to_string()));
        }
        None => env.push(("DIFFTEST_CASES", cases.div_ceil(2).to_string())),
    }
    cargo_with_env(
        &[
            "test",
            "--locked",
            "-p",
            "chainify-storage",
            "--test",
            "difftest",
            "--",
            "--nocapture",
        ],
        &env,
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map_or("", String::as_str);
    let ok = match task {
        // The storage and orderer tests run against real PostgreSQL, MariaDB and Kafka servers,
        // started here (installed first on a fresh machine) and left running for the next run.
        // Then every Criterion benchmark runs once, so that none stops compiling or running.
        "test" => {
            lint()
                && services::start_for_tests()
                    .is_some_and(|env| cargo_with_env(&["test", "--workspace", "--locked"], &env))
                && cargo(&["bench", "--workspace", "--locked", "--", "--test"])
        }
        "lint" => lint(),
        "difftest" => difftest(&args[1..]),
        "services" => services::main(&args[1..]),
        other => {
            eprintln!("xtask: unknown task {other:?}; tasks: test, lint, difftest, services");
            false
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
