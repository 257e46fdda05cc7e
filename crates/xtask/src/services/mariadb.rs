//! MariaDB from Debian's `mariadb-server` package (installed with apt-get when missing), with its
//! own data directory in `target/services/mariadb/data`, TCP on 127.0.0.1:27306 and its socket and
//! pid file in our directory. Every program gets `--no-defaults` so that `/etc/mysql/` (the
//! system instance's port, socket and data directory) is never read.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::sys::{self, Result};
use super::{Ctx, DATABASE, Instance, Probe, Service, Started, say};

pub(super) const PORT: u16 = 27306;

/// The Debian package with `mariadbd`, `mariadb-install-db` and (as a dependency) `mariadb`.
const PACKAGE: &str = "mariadb-server";

/// How long a fresh `mariadbd` may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// What Debian's package starts on install on a machine with systemd; we stop it (only right
/// after installing it ourselves) and never use it.
const SYSTEM_PID_FILE: &str = "/run/mysqld/mysqld.pid";

#[derive(Debug)]
struct Paths {
    base: PathBuf,
    data: PathBuf,
    socket: PathBuf,
    pid: PathBuf,
    log: PathBuf,
}

fn paths(ctx: &Ctx) -> Paths {
    let base = ctx.dir(Service::MariaDb);
    Paths {
        data: base.join("data"),
        socket: base.join("mariadb.sock"),
        pid: base.join("mariadb.pid"),
        log: base.join("mariadb.log"),
        base,
    }
}

pub(super) fn instance(ctx: &Ctx) -> Instance {
    let p = paths(ctx);
    Instance {
        pid_file: p.pid,
        // `--datadir=<path>` is in mariadbd's command line.
        marker: format!("--datadir={}", p.data.display()),
        port: PORT,
        log: p.log,
    }
}

#[derive(Debug)]
struct Tools {
    server: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

fn find_tools() -> Result<Tools> {
    let find = |name: &str| {
        sys::find_program(name).ok_or_else(|| {
            format!("{name} not found (Debian package {PACKAGE}: `apt-get install {PACKAGE}`)")
        })
    };
    Ok(Tools {
        server: find("mariadbd")?,
        install_db: find("mariadb-install-db")?,
        client: find("mariadb")?,
    })
}

/// The MariaDB programs, installing Debian's package first when one is missing and we are root.
fn tools(ctx: &Ctx) -> Result<Tools> {
    let missing = match find_tools() {
        Ok(tools) => return Ok(tools),
        Err(e) => e,
    };
    if !ctx.is_root {
        return Err(format!(
            "{missing}; as root, `cargo xtask services start` installs it"
        ));
    }
    say(
        Service::MariaDb,
        &format!("{missing}; installing {PACKAGE} with apt-get (first start)"),
    );
    let apt = |args: &[&str]| {
        sys::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(args),
        )
        .map_err(|e| format!("cannot install {PACKAGE}: {e}"))
    };
    apt(&["update", "-q"])?;
    apt(&["install", "-y", "-q", "--no-install-recommends", PACKAGE])?;
    stop_system_instance()?;
    find_tools().map_err(|e| format!("{e}, even after installing {PACKAGE}"))
}

/// Stops the instance Debian's package starts on port 3306 where services start on install
/// (systemd); containers without an init system (`policy-rc.d`) start none. Only the process named
/// by the system pid file is touched, and only when it is a MariaDB server.
fn stop_system_instance() -> Result<()> {
    if std::path::Path::new("/run/systemd/system").is_dir()
        && let Err(e) = sys::run(Command::new("systemctl").args(["stop", "mariadb"]))
    {
        say(
            Service::MariaDb,
            &format!("could not stop the system instance: {e}"),
        );
    }
    let Ok(text) = std::fs::read_to_string(SYSTEM_PID_FILE) else {
        return Ok(());
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return Ok(());
    };
    if let Some(name) = sys::comm(pid).filter(|c| c == "mariadbd" || c == "mysqld") {
        say(
            Service::MariaDb,
            &format!("stopping the system instance the package started (pid {pid})"),
        );
        sys::terminate(pid, &name, Duration::from_secs(60))?;
    }
    Ok(())
}

pub(super) fn start(ctx: &Ctx) -> Result<Started> {
    let tools = tools(ctx)?;
    let p = paths(ctx);
    let instance = instance(ctx);
    if let Some(pid) = instance.reuse(Service::MariaDb)? {
        create_database(&tools, &p)?;
        return Ok(Started::Reused(pid));
    }
    sys::check_socket_path(&p.socket)?;
    sys::create_dir(&p.base)?;
    let as_root: &[&str] = if ctx.is_root { &["--user=root"] } else { &[] };
    if !p.data.join("mysql").is_dir() {
        // What an interrupted install left behind.
        sys::remove_dir(&p.data)?;
        say(Service::MariaDb, "mariadb-install-db (first start)");
        sys::run(
            Command::new(&tools.install_db)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", p.data.display()))
                .args(as_root)
                .args([
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                ]),
        )?;
    }
    let mut child = sys::spawn_detached(
        Command::new(&tools.server)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", p.data.display()))
            .arg(format!("--socket={}", p.socket.display()))
            .arg(format!("--pid-file={}", p.pid.display()))
            .arg(format!("--port={PORT}"))
            .args(as_root)
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                // Debian's /etc/mysql configures utf8mb4; --no-defaults would leave latin1.
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
            ]),
        &p.log,
    )?;
    let pid = child.id();
    let ready = sys::poll(STARTUP_TIMEOUT, || {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("wait for mariadbd: {e}"))?
        {
            return Err(format!(
                "mariadbd exited during startup ({status})\n{}",
                sys::log_tail(&p.log)
            ));
        }
        Ok((instance.probe() == Probe::Up(pid)).then_some(()))
    })?;
    if ready.is_none() {
        let stopped = sys::terminate(pid, &instance.marker, Duration::from_secs(10));
        return Err(format!(
            "mariadbd did not accept connections on 127.0.0.1:{PORT} within {} s (stopped it: \
             {stopped:?})\n{}",
            STARTUP_TIMEOUT.as_secs(),
            sys::log_tail(&p.log)
        ));
    }
    create_database(&tools, &p)?;
    Ok(Started::New(pid))
}

/// Creates the test database and lets `root` in over TCP without a password (the URL of
/// `services env`); idempotent, so every `start` repairs it. Runs over our socket, where
/// `mariadb-install-db` made `root@localhost` passwordless.
fn create_database(tools: &Tools, p: &Paths) -> Result<()> {
    sys::run(
        Command::new(&tools.client)
            .arg("--no-defaults")
            .arg("--protocol=socket")
            .arg(format!("--socket={}", p.socket.display()))
            .args(["-u", "root", "-e"])
            .arg(format!(
                "CREATE DATABASE IF NOT EXISTS {DATABASE}; \
                 CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; \
                 GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
            )),
    )
    .map(drop)
}
