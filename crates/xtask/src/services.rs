//! `cargo xtask services start|stop|status|env`: throw-away PostgreSQL, MariaDB and Kafka for the
//! integration tests, on private ports of 127.0.0.1, with all their state under
//! `target/services/`. They never use the machine's default ports, sockets or data directories,
//! so they coexist with system instances, and `rm -rf target/services` resets them.
//!
//! `start` is idempotent: an instance whose pid file names a live process of ours (checked by its
//! command line) that accepts connections is reused in milliseconds; stale pid files are removed.
//! `stop` signals only the pids in our pid files.

mod kafka;
mod mariadb;
mod postgres;
mod sys;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use sys::{Context as _, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Postgres,
    MariaDb,
    Kafka,
}

impl Service {
    const ALL: [Self; 3] = [Self::Postgres, Self::MariaDb, Self::Kafka];

    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::MariaDb => "mariadb",
            Self::Kafka => "kafka",
        }
    }

    /// The client port on 127.0.0.1: private, so tests never meet a system instance.
    fn port(self) -> u16 {
        match self {
            Self::Postgres => postgres::PORT,
            Self::MariaDb => mariadb::PORT,
            Self::Kafka => kafka::PORT,
        }
    }

    /// The environment variable the tests read, and its value.
    fn env(self) -> (&'static str, String) {
        match self {
            Self::Postgres => (
                "CHAINIFY_TEST_POSTGRES_URL",
                format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port()),
            ),
            Self::MariaDb => (
                "CHAINIFY_TEST_MYSQL_URL",
                format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.port()),
            ),
            Self::Kafka => (
                "CHAINIFY_TEST_KAFKA_BROKERS",
                format!("127.0.0.1:{}", self.port()),
            ),
        }
    }

    fn instance(self, ctx: &Ctx) -> Instance {
        match self {
            Self::Postgres => postgres::instance(ctx),
            Self::MariaDb => mariadb::instance(ctx),
            Self::Kafka => kafka::instance(ctx),
        }
    }
}

/// The database both SQL servers get, named in the URLs of [`Service::env`].
const DATABASE: &str = "chainify_test";

/// How long `start` waits for an instance of ours that is alive but not yet accepting
/// connections (e.g. started a moment ago by another `start`) before it gives up on it.
const STARTING_GRACE: Duration = Duration::from_secs(30);

/// What every command needs to know about the machine and the workspace.
#[derive(Debug)]
struct Ctx {
    /// The workspace root, found from this crate's manifest directory (`crates/xtask/../..`).
    root: PathBuf,
    /// `target/services/`, one directory per service below it.
    services: PathBuf,
    /// As root, PostgreSQL runs as user `postgres`, MariaDB needs `--user=root`, and missing
    /// packages can be installed.
    is_root: bool,
}

impl Ctx {
    fn new() -> Result<Self> {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = manifest
            .ancestors()
            .nth(2)
            .ok_or_else(|| format!("no workspace root above {}", manifest.display()))?
            .to_path_buf();
        Ok(Self {
            services: root.join("target").join("services"),
            root,
            is_root: sys::is_root()?,
        })
    }

    fn dir(&self, service: Service) -> PathBuf {
        self.services.join(service.name())
    }

    /// Serialises `start` and `stop` across processes (e.g. test runners starting services at
    /// once): two starts racing would both launch a server and one would overwrite the other's pid
    /// file. The lock is released when the returned file is dropped or the process exits.
    fn lock(&self) -> Result<std::fs::File> {
        sys::create_dir(&self.services)?;
        let path = self.services.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .context(|| format!("open {}", path.display()))?;
        if file.try_lock().is_err() {
            eprintln!("services: waiting for another `cargo xtask services` to finish");
            file.lock().context(|| format!("lock {}", path.display()))?;
        }
        Ok(file)
    }

    /// Configuration templates checked into `deploy/dev/`.
    fn template(&self, relative: &str) -> PathBuf {
        self.root.join("deploy").join("dev").join(relative)
    }
}

/// How to recognise a running instance of ours.
#[derive(Debug)]
struct Instance {
    pid_file: PathBuf,
    /// A string only our instance has in its command line: its data directory or config path.
    marker: String,
    port: u16,
    log: PathBuf,
}

/// What a pid file and a port say, without waiting or changing anything.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    Stopped,
    /// A pid file whose process is gone or is not ours (the pid, if the file held one).
    Stale(Option<u32>),
    /// Ours and accepting connections.
    Up(u32),
    /// Ours and alive, but the port refuses connections: starting, stopping or wedged.
    NotAnswering(u32),
}

impl Instance {
    fn probe(&self) -> Probe {
        let Ok(text) = std::fs::read_to_string(&self.pid_file) else {
            return Probe::Stopped;
        };
        // PostgreSQL's postmaster.pid has more lines; the pid is always the first.
        let pid = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok());
        match pid {
            Some(pid) if sys::is_ours(pid, &self.marker) => {
                if sys::port_open(self.port) {
                    Probe::Up(pid)
                } else {
                    Probe::NotAnswering(pid)
                }
            }
            _ => Probe::Stale(pid),
        }
    }

    /// The first step of every `start`: the pid of an instance to reuse, or `None` when a new one
    /// may start (stale pid file removed, port free).
    fn reuse(&self, service: Service) -> Result<Option<u32>> {
        let probe = match self.probe() {
            Probe::NotAnswering(pid) => {
                say(
                    service,
                    &format!("pid {pid} is ours but not answering yet; waiting"),
                );
                sys::wait_for(STARTING_GRACE, || {
                    sys::port_open(self.port) || !sys::is_ours(pid, &self.marker)
                });
                self.probe()
            }
            probe => probe,
        };
        match probe {
            Probe::Up(pid) => return Ok(Some(pid)),
            Probe::NotAnswering(pid) => {
                return Err(format!(
                    "pid {pid} (from {}) is ours and alive but 127.0.0.1:{} refuses connections; \
                     run `cargo xtask services stop {}` and start again\n{}",
                    self.pid_file.display(),
                    self.port,
                    service.name(),
                    sys::log_tail(&self.log)
                ));
            }
            Probe::Stale(pid) => {
                sys::remove_file(&self.pid_file)?;
                let pid = pid.map_or_else(|| "no pid".to_owned(), |p| format!("pid {p}"));
                say(
                    service,
                    &format!(
                        "removed stale {} ({pid} is not ours)",
                        self.pid_file.display()
                    ),
                );
            }
            Probe::Stopped => {}
        }
        check_port_free(service, self.port)?;
        Ok(None)
    }
}

/// Refuses to start when another program holds one of our ports: the tests would talk to it.
fn check_port_free(service: Service, port: u16) -> Result<()> {
    if sys::port_open(port) {
        return Err(format!(
            "127.0.0.1:{port} is in use by a process that is not our {} (no pid file of ours \
             names it); stop that process (see `ss -ltnp`)",
            service.name()
        ));
    }
    Ok(())
}

/// Progress on stderr, so that stdout stays clean for `env` and `status`.
fn say(service: Service, message: &str) {
    eprintln!("services: {}: {message}", service.name());
}

/// What `start` did for one service.
#[derive(Debug, Clone, Copy)]
enum Started {
    Reused(u32),
    New(u32),
}

const USAGE: &str = "usage: cargo xtask services start|stop [postgres|mariadb|kafka|all]... \
                     | status | env";

/// Runs `cargo xtask services <args>`; false on any failure (already reported on stderr).
pub(crate) fn main(args: &[String]) -> bool {
    let Some((command, names)) = args.split_first() else {
        eprintln!("{USAGE}");
        return false;
    };
    let services = match parse_services(names) {
        Ok(services) => services,
        Err(e) => {
            eprintln!("services: {e}\n{USAGE}");
            return false;
        }
    };
    let ctx = match Ctx::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("services: {e}");
            return false;
        }
    };
    let result = match command.as_str() {
        "start" => ctx.lock().map(|_lock| start(&ctx, &services)),
        "stop" => ctx.lock().map(|_lock| stop(&ctx, &services)),
        "status" if names.is_empty() => status(&ctx).map(|()| true),
        "env" if names.is_empty() => env().map(|()| true),
        _ => {
            eprintln!("{USAGE}");
            Ok(false)
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("services: {e}");
        false
    })
}

/// Service names from the command line; none or `all` means all, in a fixed order.
fn parse_services(names: &[String]) -> Result<Vec<Service>> {
    let mut chosen = Vec::new();
    for name in names {
        let found: &[Service] = match name.as_str() {
            "all" => &Service::ALL,
            "postgres" => &[Service::Postgres],
            "mariadb" => &[Service::MariaDb],
            "kafka" => &[Service::Kafka],
            other => return Err(format!("unknown service {other:?}")),
        };
        chosen.extend_from_slice(found);
    }
    if chosen.is_empty() {
        chosen.extend_from_slice(&Service::ALL);
    }
    Ok(Service::ALL
        .into_iter()
        .filter(|s| chosen.contains(s))
        .collect())
}

/// Runs `task` for each service on its own thread, since the cold paths (apt-get, Maven, a JVM)
/// are slow and independent; false when any failed.
fn for_each(services: &[Service], task: impl Fn(Service) -> Result<String> + Sync) -> bool {
    let results: Vec<(Service, Result<String>)> = thread::scope(|scope| {
        let task = &task;
        let handles: Vec<_> = services
            .iter()
            .map(|&service| (service, scope.spawn(move || task(service))))
            .collect();
        handles
            .into_iter()
            .map(|(service, handle)| {
                let result = handle
                    .join()
                    .unwrap_or_else(|_| Err("panicked (see above)".to_owned()));
                (service, result)
            })
            .collect()
    });
    let mut ok = true;
    for (service, result) in results {
        match result {
            Ok(message) => say(service, &message),
            Err(e) => {
                say(service, &format!("FAILED: {e}"));
                ok = false;
            }
        }
    }
    ok
}

fn start(ctx: &Ctx, services: &[Service]) -> bool {
    let ok = for_each(services, |service| {
        let began = Instant::now();
        let started = match service {
            Service::Postgres => postgres::start(ctx),
            Service::MariaDb => mariadb::start(ctx),
            Service::Kafka => kafka::start(ctx),
        }?;
        let port = service.port();
        Ok(match started {
            Started::Reused(pid) => format!("running, pid {pid}, 127.0.0.1:{port} (already up)"),
            Started::New(pid) => format!(
                "running, pid {pid}, 127.0.0.1:{port} (started in {:.1} s)",
                began.elapsed().as_secs_f64()
            ),
        })
    });
    if ok {
        eprintln!("services: ready; for the tests: eval \"$(cargo xtask services env)\"");
    }
    ok
}

fn stop(ctx: &Ctx, services: &[Service]) -> bool {
    for_each(services, |service| {
        let instance = service.instance(ctx);
        match instance.probe() {
            Probe::Stopped => Ok("not running".to_owned()),
            Probe::Stale(_) => {
                sys::remove_file(&instance.pid_file)?;
                Ok(format!(
                    "not running (removed stale {})",
                    instance.pid_file.display()
                ))
            }
            Probe::Up(pid) | Probe::NotAnswering(pid) => {
                match service {
                    Service::Postgres => postgres::stop(ctx)?,
                    Service::MariaDb | Service::Kafka => {
                        sys::terminate(pid, &instance.marker, STOP_GRACE)?;
                        // Kafka never removes our pid file; MariaDB does not after a SIGKILL.
                        sys::remove_file(&instance.pid_file)?;
                    }
                }
                Ok(format!("stopped pid {pid}"))
            }
        }
    })
}

/// How long a server may take to shut down cleanly before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(60);

fn status(ctx: &Ctx) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for service in Service::ALL {
        let instance = service.instance(ctx);
        let port = service.port();
        let state = match instance.probe() {
            Probe::Up(pid) => format!("running  pid {pid}  127.0.0.1:{port}"),
            Probe::NotAnswering(pid) => format!(
                "not answering  pid {pid}  127.0.0.1:{port} refuses connections (see {})",
                instance.log.display()
            ),
            Probe::Stale(_) => format!("stopped  (stale {})", instance.pid_file.display()),
            Probe::Stopped => "stopped".to_owned(),
        };
        writeln!(out, "{:<9}{state}", service.name()).map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}

/// Shell exports for `eval "$(cargo xtask services env)"`.
/// Starts the servers the test suite needs (PostgreSQL, MariaDB, Kafka) (idempotent, quick when they already run) and
/// returns the environment variables that point the tests at them.
pub(crate) fn start_for_tests() -> Option<Vec<(&'static str, String)>> {
    let services = [Service::Postgres, Service::MariaDb, Service::Kafka];
    let ctx = Ctx::new().map_err(|e| eprintln!("services: {e}")).ok()?;
    let started = ctx
        .lock()
        .map(|_lock| start(&ctx, &services))
        .unwrap_or_else(|e| {
            eprintln!("services: {e}");
            false
        });
    started.then(|| services.iter().map(|s| s.env()).collect())
}

fn env() -> Result<()> {
    let mut out = std::io::stdout().lock();
    for service in Service::ALL {
        let (name, value) = service.env();
        writeln!(out, "export {name}={value}").map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(args: &[&str]) -> Result<Vec<Service>> {
        parse_services(&args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn no_name_or_all_means_every_service_once_in_order() {
        assert_eq!(names(&[]), Ok(Service::ALL.to_vec()));
        assert_eq!(
            names(&["kafka", "all", "postgres"]),
            Ok(Service::ALL.to_vec())
        );
        assert_eq!(
            names(&["kafka", "postgres"]),
            Ok(vec![Service::Postgres, Service::Kafka])
        );
        assert!(names(&["mysql"]).is_err());
    }

    /// Our listeners stay below the kernel's ephemeral range: a port inside it can be held, by
    /// chance, by the client end of any connection on the machine (Maven's downloads, Kafka's own
    /// broker talking to its controller), and then the server fails to bind at startup.
    #[test]
    fn ports_are_private_distinct_and_never_ephemeral() {
        let mut ports: Vec<u16> = Service::ALL.iter().map(|s| s.port()).collect();
        ports.push(kafka::CONTROLLER_PORT);
        let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| {
                let mut bounds = range.split_whitespace().map(str::parse::<u16>);
                Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
            })
            .unwrap_or((32768, 60999));
        for port in &ports {
            assert!(
                !(low..=high).contains(port),
                "port {port} is in the ephemeral range {low}-{high}"
            );
            assert!(
                ![5432, 3306, 9092, 9093].contains(port),
                "port {port} is a default"
            );
            assert!(*port > 1024, "port {port} is privileged");
        }
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    }
}
