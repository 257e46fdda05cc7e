//! Apache Kafka in KRaft mode (one process as broker and controller), from Maven Central jars
//! rather than a distribution tarball (the only network here is package registries): the jars
//! named by `deploy/dev/kafka/pom.xml` go to `target/services/kafka/libs`, and we run
//! `java -cp 'libs/*' kafka.Kafka server.properties` ourselves, so the pid we record is the JVM's.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::sys::{self, Context as _, Result};
use super::{Ctx, Instance, Probe, Service, Started, check_port_free, say};

/// The broker's client listener.
pub(super) const PORT: u16 = 27092;
/// The KRaft controller listener; must be free too.
pub(super) const CONTROLLER_PORT: u16 = 27093;

/// A cold JVM, storage recovery and the first metadata log take a few seconds; be generous.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// The line Kafka logs once the broker serves clients.
const STARTED_LINE: &str = "Kafka Server started";

/// A small heap: tests create few topics with little data.
const JVM_OPTIONS: [&str; 4] = [
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-Djava.awt.headless=true",
];

#[derive(Debug)]
struct Paths {
    base: PathBuf,
    libs: PathBuf,
    /// A copy of the pom the jars in `libs` came from: a changed pom means fetching again.
    libs_pom: PathBuf,
    data: PathBuf,
    config: PathBuf,
    log4j: PathBuf,
    pid: PathBuf,
    log: PathBuf,
}

fn paths(ctx: &Ctx) -> Paths {
    let base = ctx.dir(Service::Kafka);
    Paths {
        libs: base.join("libs"),
        libs_pom: base.join("libs.pom.xml"),
        data: base.join("data"),
        config: base.join("server.properties"),
        log4j: base.join("log4j.properties"),
        pid: base.join("kafka.pid"),
        log: base.join("kafka.log"),
        base,
    }
}

pub(super) fn instance(ctx: &Ctx) -> Instance {
    let p = paths(ctx);
    Instance {
        pid_file: p.pid,
        marker: p.config.display().to_string(),
        port: PORT,
        log: p.log,
    }
}

/// `$JAVA_HOME/bin/java` when set, else `java` from `PATH`.
fn java() -> Result<PathBuf> {
    let from_home = std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin").join("java"))
        .filter(|java| sys::is_executable(java));
    from_home
        .or_else(|| sys::find_program("java"))
        .ok_or_else(|| {
            "java not found: Kafka needs Java 17 (`apt-get install openjdk-17-jre-headless`)"
                .to_owned()
        })
}

/// A `java` command for a Kafka main class, with our jars and logging configuration.
fn java_command(java: &PathBuf, p: &Paths, main_class: &str) -> Command {
    let mut cmd = Command::new(java);
    cmd.args(JVM_OPTIONS)
        .arg(format!("-Dlog4j.configuration=file:{}", p.log4j.display()))
        .arg("-cp")
        // Java expands the `*` itself (every jar in the directory); no shell is involved.
        .arg(format!("{}/*", p.libs.display()))
        .arg(main_class);
    cmd
}

pub(super) fn start(ctx: &Ctx) -> Result<Started> {
    let java = java()?;
    let p = paths(ctx);
    let instance = instance(ctx);
    if let Some(pid) = instance.reuse(Service::Kafka)? {
        return Ok(Started::Reused(pid));
    }
    check_port_free(Service::Kafka, CONTROLLER_PORT)?;
    sys::create_dir(&p.base)?;
    fetch_jars(ctx, &p)?;
    write_config(ctx, &p)?;
    if !p.data.join("meta.properties").exists() {
        format_storage(&java, &p)?;
    }

    match launch(&java, &p, &instance) {
        Err(Launch::Exited(why)) => {
            // Seen once on CI, cause unknown (the log kept only the shutdown): a second start of
            // a freshly formatted node costs seconds, a failed CI run costs the whole run.
            say(
                Service::Kafka,
                &format!("the JVM exited during startup; starting it once more\n{why}"),
            );
            launch(&java, &p, &instance).map_err(Launch::into_message)
        }
        other => other.map_err(Launch::into_message),
    }
}

/// Why one launch of the JVM did not give a running broker.
enum Launch {
    /// The JVM exited on its own: worth one more try.
    Exited(String),
    /// It did not come up in time, or we could not run it at all.
    Failed(String),
}

impl Launch {
    fn into_message(self) -> String {
        match self {
            Self::Exited(m) | Self::Failed(m) => m,
        }
    }
}

fn launch(java: &PathBuf, p: &Paths, instance: &Instance) -> std::result::Result<Started, Launch> {
    let log_start = sys::file_len(&p.log);
    let mut child =
        sys::spawn_detached(java_command(java, p, "kafka.Kafka").arg(&p.config), &p.log)
            .map_err(Launch::Failed)?;
    let pid = child.id();
    fs::write(&p.pid, format!("{pid}\n"))
        .context(|| format!("write {}", p.pid.display()))
        .map_err(Launch::Failed)?;
    let ready = sys::poll(STARTUP_TIMEOUT, || {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Launch::Failed(format!("wait for kafka: {e}")))?
        {
            return Err(Launch::Exited(format!(
                "the Kafka JVM exited during startup ({status})\n{}",
                sys::log_tail_from(&p.log, log_start)
            )));
        }
        let up = instance.probe() == Probe::Up(pid)
            && sys::read_from(&p.log, log_start).contains(STARTED_LINE);
        Ok(up.then_some(()))
    });
    match ready {
        Ok(Some(())) => Ok(Started::New(pid)),
        Ok(None) => {
            let stopped = sys::terminate(pid, &instance.marker, Duration::from_secs(30));
            sys::remove_file(&p.pid).map_err(Launch::Failed)?;
            Err(Launch::Failed(format!(
                "Kafka did not log {STARTED_LINE:?} and accept connections on 127.0.0.1:{PORT} \
                 within {} s (stopped it: {stopped:?})\n{}",
                STARTUP_TIMEOUT.as_secs(),
                sys::log_tail_from(&p.log, log_start)
            )))
        }
        Err(e) => {
            sys::remove_file(&p.pid).map_err(Launch::Failed)?;
            Err(e)
        }
    }
}

/// Copies the jars of `deploy/dev/kafka/pom.xml` with Maven, unless `libs` already holds the jars
/// of exactly this pom.
fn fetch_jars(ctx: &Ctx, p: &Paths) -> Result<()> {
    let pom = ctx.template("kafka/pom.xml");
    let wanted = fs::read(&pom).context(|| format!("read {}", pom.display()))?;
    if p.libs.is_dir() && fs::read(&p.libs_pom).ok().as_ref() == Some(&wanted) {
        return Ok(());
    }
    let mvn = sys::find_program("mvn").ok_or_else(|| {
        "mvn not found: Maven fetches the Kafka jars (`apt-get install maven`)".to_owned()
    })?;
    say(
        Service::Kafka,
        &format!("fetching the jars of {} with Maven", pom.display()),
    );
    sys::remove_file(&p.libs_pom)?;
    sys::remove_dir(&p.libs)?;
    sys::run(
        Command::new(mvn)
            .args(["-q", "-B", "-Dstyle.color=never", "-f"])
            .arg(&pom)
            .arg("dependency:copy-dependencies")
            .arg(format!("-DoutputDirectory={}", p.libs.display())),
    )?;
    fs::write(&p.libs_pom, wanted).context(|| format!("write {}", p.libs_pom.display()))
}

/// Renders `deploy/dev/kafka/server.properties` (ports and data directory filled in) and copies
/// the logging configuration, on every fresh start so template edits take effect.
fn write_config(ctx: &Ctx, p: &Paths) -> Result<()> {
    let template = ctx.template("kafka/server.properties");
    let text = fs::read_to_string(&template).context(|| format!("read {}", template.display()))?;
    let rendered = text
        .replace("@DATA_DIR@", &p.data.display().to_string())
        .replace("@BROKER_PORT@", &PORT.to_string())
        .replace("@CONTROLLER_PORT@", &CONTROLLER_PORT.to_string());
    fs::write(&p.config, rendered).context(|| format!("write {}", p.config.display()))?;
    let log4j = ctx.template("kafka/log4j.properties");
    fs::copy(&log4j, &p.log4j)
        .map(drop)
        .context(|| format!("copy {} to {}", log4j.display(), p.log4j.display()))
}

/// Formats the KRaft storage once, with a fresh cluster id.
fn format_storage(java: &PathBuf, p: &Paths) -> Result<()> {
    say(Service::Kafka, "formatting the KRaft storage (first start)");
    let out = sys::run(java_command(java, p, "kafka.tools.StorageTool").arg("random-uuid"))?;
    let cluster_id = out
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .ok_or_else(|| "StorageTool random-uuid printed nothing".to_owned())?;
    sys::run(
        java_command(java, p, "kafka.tools.StorageTool")
            .args(["format", "--ignore-formatted", "-t", cluster_id, "-c"])
            .arg(&p.config),
    )
    .map(drop)
}
