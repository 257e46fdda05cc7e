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
    let (ok, said) = output(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(&names)
            .current_dir(dir.path())
            .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.path().display())),
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
fn the_service_user_is_valid_for_sysusers() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    let file = deploy()
        .join("chainify.sysusers.conf")
        .canonicalize()
        .unwrap();
    let (ok, said) = output(
        Command::new("systemd-sysusers")
            .arg(format!("--root={}", root.path().display()))
            .arg("--dry-run")
            .arg(&file),
    );
    assert!(ok, "{said}");
    assert!(said.contains("Creating user 'chainify'"), "{said}");
}
