//! PostgreSQL 15 from Debian's server binaries, with its own cluster in
//! `target/services/postgres/data`, TCP on 127.0.0.1:27432 and its socket in our directory.
//!
//! `initdb` and `postgres` refuse to run as root, so as root they run as the system user
//! `postgres` (via `runuser`), which then owns `target/services/postgres/`.

use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::sys::{self, Context as _, Result};
use super::{Ctx, DATABASE, Instance, Probe, Service, Started, say};

pub(super) const PORT: u16 = 27432;

/// Debian's PostgreSQL 15 server binaries (package `postgresql-15`).
const BIN: &str = "/usr/lib/postgresql/15/bin";

/// The OS user that runs the server when we are root.
const OS_USER: &str = "postgres";

/// How long `pg_ctl` waits for start or stop, in seconds.
const PG_CTL_TIMEOUT: &str = "60";

#[derive(Debug)]
struct Paths {
    base: PathBuf,
    data: PathBuf,
    /// The Unix socket directory, ours so that we never use `/var/run/postgresql`.
    run: PathBuf,
    log: PathBuf,
}

fn paths(ctx: &Ctx) -> Paths {
    let base = ctx.dir(Service::Postgres);
    Paths {
        data: base.join("data"),
        run: base.join("run"),
        log: base.join("postgres.log"),
        base,
    }
}

pub(super) fn instance(ctx: &Ctx) -> Instance {
    let p = paths(ctx);
    Instance {
        pid_file: p.data.join("postmaster.pid"),
        marker: p.data.display().to_string(),
        port: PORT,
        log: p.log,
    }
}

fn tool(name: &str) -> Result<PathBuf> {
    let path = Path::new(BIN).join(name);
    if sys::is_executable(&path) {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: the PostgreSQL 15 server binaries are missing; install them with \
             `apt-get install postgresql-15`",
            path.display()
        ))
    }
}

/// A command for a PostgreSQL program, run as `postgres` when we are root. It runs in `base`
/// because `initdb` complains when it cannot read the current directory (e.g. under `/root`).
fn pg_command(ctx: &Ctx, program: &Path, base: &Path) -> Command {
    let mut cmd = if ctx.is_root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", OS_USER, "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    };
    cmd.current_dir(base);
    cmd
}

pub(super) fn start(ctx: &Ctx) -> Result<Started> {
    let (initdb, pg_ctl) = (tool("initdb")?, tool("pg_ctl")?);
    let p = paths(ctx);
    let instance = instance(ctx);
    if let Some(pid) = instance.reuse(Service::Postgres)? {
        create_database()?;
        return Ok(Started::Reused(pid));
    }
    sys::check_socket_path(&p.run.join(format!(".s.PGSQL.{PORT}.lock")))?;
    // `pg_ctl -o` goes through `sh`; single quotes keep the path one word.
    let run_dir = p.run.display().to_string();
    if run_dir.contains('\'') {
        return Err(format!("the path {run_dir} contains a single quote"));
    }
    sys::create_dir(&p.run)?;
    if ctx.is_root {
        give_to_os_user(&p)?;
    }
    if !p.data.join("PG_VERSION").exists() {
        // What an interrupted initdb left behind.
        sys::remove_dir(&p.data)?;
        say(Service::Postgres, "initdb (first start)");
        sys::run(
            pg_command(ctx, &initdb, &p.base)
                .arg("-D")
                .arg(&p.data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8"])
                .args(["--locale=C.UTF-8", "--no-instructions"]),
        )?;
    }
    let options = format!("-p {PORT} -k '{run_dir}' -c listen_addresses=127.0.0.1");
    sys::run(
        pg_command(ctx, &pg_ctl, &p.base)
            .arg("-D")
            .arg(&p.data)
            .arg("-l")
            .arg(&p.log)
            .args(["-w", "-t", PG_CTL_TIMEOUT, "-o", &options, "start"]),
    )
    .map_err(|e| format!("{e}\n{}", sys::log_tail(&p.log)))?;
    let Some(pid) = sys::poll(Duration::from_secs(5), || {
        Ok::<_, String>(match instance.probe() {
            Probe::Up(pid) => Some(pid),
            _ => None,
        })
    })?
    else {
        return Err(format!(
            "pg_ctl started the server but it does not answer on 127.0.0.1:{PORT}\n{}",
            sys::log_tail(&p.log)
        ));
    };
    create_database()?;
    Ok(Started::New(pid))
}

/// Makes `target/services/postgres` the `postgres` user's (creating that user if the machine
/// lacks it), and checks that it can reach it: a workspace under a private home such as `/root`
/// (mode 0700) is not reachable by other users.
fn give_to_os_user(p: &Paths) -> Result<()> {
    let (uid, gid) = os_user_ids()?;
    for dir in [&p.base, &p.run] {
        chown(dir, Some(uid), Some(gid)).context(|| format!("chown {}", dir.display()))?;
    }
    let reachable = Command::new("runuser")
        .args(["-u", OS_USER, "--", "test", "-w"])
        .arg(&p.base)
        .status()
        .is_ok_and(|s| s.success());
    if !reachable {
        return Err(format!(
            "user {OS_USER} cannot write {}: a parent directory is not searchable by others \
             (e.g. /root has mode 0700); move the workspace, or `chmod o+x` that parent",
            p.base.display()
        ));
    }
    Ok(())
}

/// Uid and gid of `postgres`, which Debian's server package creates; made with
/// `useradd --system` when missing.
fn os_user_ids() -> Result<(u32, u32)> {
    let ids = || -> Result<(u32, u32)> {
        let id = |flag: &str| -> Result<u32> {
            let out = sys::run(Command::new("id").args([flag, OS_USER]))?;
            out.trim()
                .parse()
                .map_err(|e| format!("`id {flag} {OS_USER}` printed {out:?}: {e}"))
        };
        Ok((id("-u")?, id("-g")?))
    };
    if let Ok(ids) = ids() {
        return Ok(ids);
    }
    say(
        Service::Postgres,
        &format!("creating the system user {OS_USER}"),
    );
    sys::run(Command::new("useradd").args([
        "--system",
        "--user-group",
        "--no-create-home",
        "--shell",
        "/usr/sbin/nologin",
        OS_USER,
    ]))?;
    ids()
}

/// Creates the test database unless it exists; cheap, so every `start` repairs a dropped one.
fn create_database() -> Result<()> {
    let port = PORT.to_string();
    let server = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let exists = sys::run(
        Command::new(tool("psql")?)
            .args(["-X", "-q", "-t", "-A", "-d", "postgres"])
            .args(server)
            .arg("-c")
            .arg(format!(
                "SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"
            )),
    )?;
    if exists.trim() != "1" {
        sys::run(Command::new(tool("createdb")?).args(server).arg(DATABASE))?;
    }
    Ok(())
}

pub(super) fn stop(ctx: &Ctx) -> Result<()> {
    let p = paths(ctx);
    sys::run(
        pg_command(ctx, &tool("pg_ctl")?, &p.base)
            .arg("-D")
            .arg(&p.data)
            .args(["-m", "fast", "-w", "-t", PG_CTL_TIMEOUT, "stop"]),
    )
    .map(drop)
}
