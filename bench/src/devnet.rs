//! The layout of a devnet's directory (`chainify devnet up`), shared by `chainify devnet` and
//! `chainify bench --devnet`: which processes an organization runs, their pid files, and the
//! number of Smallbank accounts loaded.

use std::path::{Path, PathBuf};

/// The file holding the number of Smallbank accounts loaded, in the network's directory.
pub const ACCOUNTS_FILE: &str = "accounts";

/// The processes of one organization, in start order: `node` (all components in one) or,
/// for a network started with --split, `execution`, `commit`, `chainify`.
pub fn processes(dir: &Path) -> Vec<&'static str> {
    match std::fs::read_to_string(dir.join("layout")) {
        Ok(layout) if layout.trim() == "split" => vec!["execution", "commit", "chainify"],
        _ => vec!["node"],
    }
}

/// Where `process` of organization `org` writes its pid.
pub fn pid_file(dir: &Path, org: u32, process: &str) -> PathBuf {
    dir.join(format!("org{org}/{process}.pid"))
}

/// The pid in `path`, if it holds one.
pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
