//! Running the `chainify` binary from the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::process::{Command, Output};

/// Runs `chainify` with `args` and waits for it.
pub fn chainify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chainify"))
        .args(args)
        .output()
        .expect("the chainify binary runs")
}

/// Runs `chainify <command>` with `args`.
pub fn subcommand(command: &str, args: &[&str]) -> Output {
    let mut all = vec![command];
    all.extend_from_slice(args);
    chainify(&all)
}

/// Its standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Its standard output, after asserting that it succeeded (the failure shows both streams).
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
