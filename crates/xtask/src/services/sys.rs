//! Processes, commands and ports with std only: pids are read from `/proc`, signals go through the
//! `kill` builtin of `sh` (no libc, `unsafe` is forbidden in the workspace, and the `kill` binary is
//! missing from minimal Debian images), readiness is a TCP connect.

use std::env;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Errors are messages for a human at a terminal: what failed, and what to do about it.
pub(super) type Result<T> = std::result::Result<T, String>;

/// Names the operation in an I/O error, e.g. "create target/services/kafka: Permission denied".
pub(super) trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| format!("{}: {e}", what()))
    }
}

/// Lines of a failed command's output or of a log shown in an error.
const TAIL_LINES: usize = 20;

/// Runs a command to completion and returns its stdout; on failure the error names the command
/// line and carries the tails of its stderr and stdout (Maven and apt write errors to stdout).
pub(super) fn run(cmd: &mut Command) -> Result<String> {
    let shown = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    let mut message = format!("`{shown}` failed ({})", out.status);
    for (name, bytes) in [("stderr", &out.stderr), ("stdout", &out.stdout)] {
        let text = strip_escapes(&String::from_utf8_lossy(bytes));
        if text.chars().any(char::is_alphanumeric) {
            message.push_str(&format!("\n  {name}:\n{}", tail(&text, TAIL_LINES)));
        }
    }
    Err(message)
}

/// Removes terminal colour codes (`ESC [ … letter`), which Maven prints even with `-B`.
fn strip_escapes(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // Skip up to and including the final letter of the sequence.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The command line as a human would type it, for messages.
fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts a long-running server with output appended to `log`, in its own process group so that
/// Ctrl-C on `cargo xtask` does not reach it. The returned child's pid is the server's own pid:
/// there is no wrapper shell in between.
pub(super) fn spawn_detached(cmd: &mut Command, log: &Path) -> Result<Child> {
    let shown = describe(cmd);
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .context(|| format!("open {}", log.display()))?;
    let err = out
        .try_clone()
        .context(|| format!("open {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))
}

/// The last `n` lines of `text`, indented so they stand apart from our own messages.
pub(super) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The error lines and the end of a server log, for errors about a server that did not come up.
/// The error lines come first because a server that fails at startup (Kafka's JVM) logs its whole
/// orderly shutdown after the one line that says why.
pub(super) fn log_tail(log: &Path) -> String {
    log_tail_from(log, 0)
}

/// [`log_tail`] of what the log gained since it was `offset` bytes long: one start's lines only.
pub(super) fn log_tail_from(log: &Path, offset: u64) -> String {
    match fs::read(log) {
        Ok(bytes) => {
            let from = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let text = String::from_utf8_lossy(&bytes[from..]);
            let errors = error_lines(&text, TAIL_LINES);
            let mut report = String::new();
            if !errors.is_empty() {
                report.push_str(&format!("errors in {}:\n{errors}\n", log.display()));
            }
            report.push_str(&format!(
                "last lines of {}:\n{}",
                log.display(),
                tail(&text, TAIL_LINES)
            ));
            report
        }
        Err(e) => format!("(cannot read {}: {e})", log.display()),
    }
}

/// The first `n` lines of `text` that report an error (log4j's ERROR and FATAL levels,
/// PostgreSQL's ERROR/FATAL/PANIC, MariaDB's `[ERROR]`, a Java exception), indented like [`tail`].
fn error_lines(text: &str, n: usize) -> String {
    const MARKS: [&str; 6] = [
        " ERROR ",
        " FATAL ",
        "FATAL:",
        "PANIC:",
        "[ERROR]",
        "Exception",
    ];
    text.lines()
        .filter(|l| MARKS.iter().any(|m| l.contains(m)))
        .take(n)
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A program from `PATH` or the sbin directories, which a non-login root shell may lack.
pub(super) fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(
            [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .map(PathBuf::from),
        )
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

pub(super) fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether we run as root: then PostgreSQL must run as another user and apt-get may install.
pub(super) fn is_root() -> Result<bool> {
    Ok(run(Command::new("id").arg("-u"))?.trim() == "0")
}

/// Alive means present in `/proc` and not a zombie (a zombie holds its pid but serves nothing).
pub(super) fn alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may contain anything.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, None | Some("Z" | "X" | "x"))
}

/// The command line of a process, arguments joined by spaces.
pub(super) fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(String::from_utf8_lossy)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// A pid from one of our pid files is ours only while it is alive and its command line names our
/// data directory or config: pids are reused, and a stale file must never make us signal a
/// stranger.
pub(super) fn is_ours(pid: u32, marker: &str) -> bool {
    alive(pid) && cmdline(pid).is_some_and(|c| c.contains(marker))
}

/// The executable name of a process (`/proc/<pid>/comm`).
pub(super) fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

pub(super) fn signal(pid: u32, sig: &str) -> Result<()> {
    run(Command::new("sh").args(["-c", "kill -s \"$0\" \"$1\"", sig, &pid.to_string()])).map(drop)
}

/// SIGTERM, then SIGKILL when the process has not exited after `grace`.
pub(super) fn terminate(pid: u32, marker: &str, grace: Duration) -> Result<()> {
    let gone = || !is_ours(pid, marker);
    if let Err(e) = signal(pid, "TERM") {
        // It may have exited between the check and the signal.
        return if gone() { Ok(()) } else { Err(e) };
    }
    if wait_for(grace, gone) {
        return Ok(());
    }
    signal(pid, "KILL")?;
    if wait_for(Duration::from_secs(10), gone) {
        Ok(())
    } else {
        Err(format!("pid {pid} survived SIGKILL"))
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub(super) fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

/// How often conditions are polled: servers come up in hundreds of milliseconds to seconds.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Polls `check` until it yields a value or an error; `Ok(None)` when `timeout` passes first.
pub(super) fn poll<T, E>(
    timeout: Duration,
    mut check: impl FnMut() -> std::result::Result<Option<T>, E>,
) -> std::result::Result<Option<T>, E> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check()? {
            return Ok(Some(value));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Waits until `cond` holds; false when `timeout` passes first.
pub(super) fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    matches!(
        poll(timeout, || Ok::<_, ()>(cond().then_some(()))),
        Ok(Some(()))
    )
}

/// Unix socket paths are limited to 107 bytes (`sun_path`); a deep workspace would otherwise fail
/// later with an obscure bind error.
pub(super) fn check_socket_path(path: &Path) -> Result<()> {
    const MAX: usize = 107;
    if path.as_os_str().len() > MAX {
        return Err(format!(
            "the socket path {} is longer than {MAX} bytes, the limit of Unix sockets; \
             move the workspace to a shorter path",
            path.display()
        ));
    }
    Ok(())
}

pub(super) fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).context(|| format!("create {}", dir.display()))
}

/// Removes a file that may already be gone.
pub(super) fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(format!("remove {}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Removes a directory tree that may already be gone.
pub(super) fn remove_dir(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(format!("remove {}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The current length of a log, so that a readiness check reads only what this start wrote.
pub(super) fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

/// What was appended to `path` after byte `offset`.
pub(super) fn read_from(path: &Path, offset: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_report_leads_with_the_line_that_says_why() {
        let log = "[t] INFO starting\n\
                   [t] ERROR [KafkaRaftServer nodeId=1] Fatal error during startup. \
                   (kafka.server.KafkaRaftServer)\n\
                   org.apache.kafka.common.KafkaException: Socket server failed to bind to \
                   127.0.0.1:27092: Address already in use.\n\
                   [t] INFO shutting down\n";
        assert_eq!(
            error_lines(log, 5),
            "    [t] ERROR [KafkaRaftServer nodeId=1] Fatal error during startup. \
             (kafka.server.KafkaRaftServer)\n    org.apache.kafka.common.KafkaException: Socket \
             server failed to bind to 127.0.0.1:27092: Address already in use."
        );
        assert_eq!(error_lines("[t] INFO all well\n", 5), "");
        assert_eq!(error_lines(log, 1).lines().count(), 1);
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc", 2), "    b\n    c");
        assert_eq!(tail("a", 5), "    a");
    }

    #[test]
    fn colour_codes_are_removed() {
        assert_eq!(strip_escapes("\x1b[0m[ERROR] x\x1b[1;31m!"), "[ERROR] x!");
    }

    #[test]
    fn this_process_is_alive_and_ours_by_its_command_line() {
        let pid = std::process::id();
        assert!(alive(pid));
        let exe = cmdline(pid).unwrap_or_default();
        assert!(is_ours(pid, exe.split(' ').next().unwrap_or("?")));
        assert!(!is_ours(pid, "no such marker in a test command line"));
        assert!(!alive(u32::MAX));
    }

    #[test]
    fn a_failed_command_shows_its_stderr() {
        let err = run(Command::new("sh").args(["-c", "echo out; echo oops >&2; exit 3"]));
        let msg = err.err().unwrap_or_default();
        assert!(msg.contains("sh -c") && msg.contains("oops"), "{msg}");
    }
}
