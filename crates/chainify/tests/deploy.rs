//! The systemd material in `deploy/systemd` is valid for systemd itself (`systemd-analyze verify`
//! without a single warning, `systemd-sysusers` on the user file), runs this binary's real
//! subcommands, and orders the components as the commit component needs them.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd")
}

fn unit(name: &str) -> String {
    std::fs::read_to_string(deploy().join(name)).unwrap()
}

fn output(cmd: &mut Command) -> (bool, String) {
    let o = cmd.output().unwrap_or_else(|e| {
        panic!("{cmd:?}: {e} (systemd's tools come with Debian's systemd package)")
    });
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn units_verify_without_warnings_for_an_organization() {
    let dir = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(deploy()).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !(file.ends_with("@.service") || file.ends_with("@.target")) {
            continue;
        }
        // The instance org1, running the binary under test.
        let instance = file.replacen("@.", "@org1.", 1);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("/usr/local/bin/chainify", env!("CARGO_BIN_EXE_chainify"));
        std::fs::write(dir.path().join(&instance), text).unwrap();
        names.push(instance);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "chainify-chainify@org1.service",
            "chainify-commit@org1.service",
            "chainify-execution@org1.service",
            "chainify-node@org1.service",
            "chainify@org1.target",
        ]
    );
    verify_units(dir.path(), &names);
}

/// `systemd-analyze verify` of the units in `dir` must succeed without printing anything.
fn verify_units(dir: &Path, names: &[String]) {
    let (ok, said) = output(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(names)
            .current_dir(dir)
            .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display())),
    );
    assert!(
        ok && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
}

#[test]
fn components_start_in_the_order_they_need_each_other() {
    for (component, after) in [
        ("execution", None),
        ("commit", Some("chainify-execution@%i.service")),
        ("chainify", Some("chainify-commit@%i.service")),
    ] {
        let text = unit(&format!("chainify-{component}@.service"));
        assert!(
            text.contains(&format!(
                "ExecStart=/usr/local/bin/chainify node --config /etc/chainify/%i/org.toml --component {component}\n"
            )),
            "{component}: {text}"
        );
        assert!(text.contains("PartOf=chainify@%i.target"), "{component}");
        assert!(text.contains("User=chainify\n") && text.contains("NoNewPrivileges=yes"));
        if let Some(after) = after {
            let line = text.lines().find(|l| l.starts_with("After=")).unwrap();
            assert!(line.contains(after), "{component}: {line}");
        }
    }
    let all = unit("chainify-node@.service");
    assert!(
        all.contains("ExecStart=/usr/local/bin/chainify node --config /etc/chainify/%i/org.toml\n"),
        "{all}"
    );
    // The subcommand and flags the units use exist.
    let (ok, help) = output(Command::new(env!("CARGO_BIN_EXE_chainify")).args(["node", "--help"]));
    assert!(
        ok && help.contains("--component") && help.contains("--config"),
        "{help}"
    );
}

#[test]
fn the_service_users_are_valid_for_sysusers() {
    for (file, user) in [
        (deploy().join("chainify.sysusers.conf"), "chainify"),
        (deploy().join("../kafka/kafka.sysusers.conf"), "kafka"),
    ] {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        let (ok, said) = output(
            Command::new("systemd-sysusers")
                .arg(format!("--root={}", root.path().display()))
                .arg("--dry-run")
                .arg(file.canonicalize().unwrap()),
        );
        assert!(ok, "{said}");
        assert!(said.contains(&format!("Creating user '{user}'")), "{said}");
    }
}

/// The Kafka unit verifies too (the cluster it runs is tested in chainify-orderer's
/// kafka_kraft_cluster test).
#[test]
fn the_kafka_unit_verifies_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(deploy().join("../kafka/kafka.service")).unwrap();
    assert!(
        text.contains("kafka.Kafka /etc/kafka/server.properties"),
        "{text}"
    );
    std::fs::write(dir.path().join("kafka.service"), text).unwrap();
    verify_units(dir.path(), &["kafka.service".to_owned()]);
}

/// `deploy/examples/three-orgs.sh` writes a network across three machines that loads: endpoints
/// on the organizations' hosts, the public services on every interface and the rest on
/// loopback, certificates for the hosts, the Kafka cluster with three replicas, one engine each.
#[test]
fn the_example_network_across_machines_loads() {
    use chainify_core::config::{NetworkConfig, OrdererKind, OrgConfig};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("example");
    let (ok, said) = output(
        Command::new("bash")
            .arg(deploy().join("../examples/three-orgs.sh"))
            .arg(&out)
            .arg(env!("CARGO_BIN_EXE_chainify")),
    );
    assert!(ok, "{said}");
    let net = NetworkConfig::load(&out.join("network.toml")).unwrap();
    assert_eq!(net.orderer.kind, OrdererKind::Kafka);
    assert_eq!(net.orderer.kafka_replication, 3);
    assert_eq!(
        net.orderer.kafka_brokers.as_deref(),
        Some("kafka1.example.net:9092,kafka2.example.net:9092,kafka3.example.net:9092")
    );
    for (i, scheme) in [(1, "postgres://"), (2, "mysql://"), (3, "postgres://")] {
        let org = &net.orgs[&chainify_core::OrgId(i)];
        assert!(
            org.chainify_endpoint
                .starts_with(&format!("org{i}.example.net:")),
            "{org:?}"
        );
        assert!(
            org.commit_endpoint
                .starts_with(&format!("org{i}.example.net:"))
        );
        let cfg = OrgConfig::load(&out.join(format!("org{i}/org.toml"))).unwrap();
        assert!(cfg.database_url.starts_with(scheme), "{}", cfg.database_url);
        assert!(cfg.listen.chainify.starts_with("0.0.0.0:"));
        assert!(cfg.listen.commit.starts_with("0.0.0.0:"));
        assert!(cfg.listen.admin.starts_with("127.0.0.1:"));
        assert!(cfg.listen.metrics.starts_with("127.0.0.1:"));
        // The certificate names the organization's host.
        let (ok, san) = output(
            Command::new("openssl")
                .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
                .arg(out.join(format!("org{i}/tls.pem"))),
        );
        assert!(
            ok && san.contains(&format!("DNS:org{i}.example.net")),
            "{san}"
        );
    }
}
