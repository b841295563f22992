//! The `meshbridge` binary as a user runs it: flags and terminal output.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the child on drop, so a failing test leaves no process behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run `meshbridge run` on an empty config dir with `extra` flags and
/// stderr piped (not a terminal); return its stderr up to the line that
/// contains `until`.
fn stderr_until(extra: &[&str], until: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_meshbridge"))
            .args(["run", "--config-dir"])
            .arg(dir.path())
            .args(["--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(extra)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start meshbridge"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = String::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        out.push_str(&line);
        out.push('\n');
        if line.contains(until) {
            return out;
        }
    }
    panic!("no line with {until:?} within 20s; stderr so far:\n{out}");
}

#[test]
fn text_logs_have_no_colour_codes_when_not_on_a_terminal() {
    let out = stderr_until(&["--log-format", "text"], " serving");
    assert!(out.contains("starting meshbridge"), "{out}");
    assert!(!out.contains('\x1b'), "ANSI escape codes in piped output:\n{out:?}");
}

#[test]
fn min_refresh_interval_flag_is_parsed_and_logged() {
    let out = stderr_until(&["--min-refresh-interval", "500ms"], "refresh-interval floor");
    assert!(out.contains("min_refresh_interval=500ms"), "{out}");
}

/// `meshbridge check ARGS` with `stdin`: (exit code, stdout).
fn check(args: &[&str], stdin: &str) -> (i32, String) {
    use std::io::Write;
    // Offline and short-lived: it exits on its own once stdin is closed.
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshbridge"))
        .arg("check")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("MESHBRIDGE_INGRESS_CLASS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start meshbridge check");
    // A check that does not read stdin may exit first: a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    assert!(out.stderr.is_empty(), "check writes to stdout only: {}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().expect("exited"), String::from_utf8(out.stdout).unwrap())
}

/// Every example config directory passes, as CI and the quick start run it.
#[test]
fn check_passes_the_examples() {
    let mut dirs: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.is_dir() && std::fs::read_dir(p).unwrap().any(|f| f.unwrap().path().extension() == Some("yaml".as_ref()))
        })
        .map(|p| p.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap().display().to_string())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 4, "{dirs:?}");
    let args: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let (code, out) = check(&args, "");
    assert_eq!(code, 0, "{out}");
    for dir in &dirs {
        assert!(out.contains(&format!("{dir}: ")), "{dir} not reported:\n{out}");
    }
    assert!(out.lines().all(|l| !l.trim_start().starts_with("error")), "{out}");

    // `deploy/examples/*`, as the README runs it: the directories are
    // checked, the files beside them that are not config are skipped.
    let mut all: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples"))
        .unwrap()
        .map(|e| e.unwrap().path().strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap().display().to_string())
        .collect();
    all.sort();
    let args: Vec<&str> = all.iter().map(String::as_str).collect();
    let (code, out) = check(&args, "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("deploy/examples/envoy-bootstrap.yaml: skipped: no Kubernetes object"), "{out}");
    assert!(out.contains("deploy/examples/demo-backend.py: skipped: not a .yaml or .yml file"), "{out}");
}

#[test]
fn check_exits_non_zero_on_errors_and_with_strict_on_warnings() {
    let bridge = |fields: &str| {
        format!(
            "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {{name: default, namespace: higress-system}}\n\
             spec:\n  registries:\n  - {{type: consul, name: consul, domain: 127.0.0.1, {fields}}}\n"
        )
    };
    let (code, out) = check(&["-"], &bridge("port: 8500"));
    assert_eq!((code, out.as_str()), (0, "-: 1 McpBridge, 0 Ingresses, 0 Secrets; 0 errors, 0 warnings\n"));

    let (code, out) = check(&["-"], &bridge("port: 0"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("error: McpBridge higress-system/default: spec.registries[0].port"), "{out}");

    let warned = bridge("port: 8500, registryTls: {enabled: false}");
    let (code, out) = check(&["-"], &warned);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "warning [pruned_by_higress_crd]: McpBridge higress-system/default: spec.registries[0].registryTls"
        ),
        "{out}"
    );
    let (code, _) = check(&["--strict", "-"], &warned);
    assert_eq!(code, 1);

    let (code, out) = check(&["--output", "json", "-"], &warned);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["warnings"], 1, "{json}");
    assert_eq!(json["sources"][0]["warnings"][0]["reason"], "pruned_by_higress_crd", "{json}");

    let (code, out) = check(&["no/such/dir"], "");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("error: no/such/dir: "), "{out}");
}
