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
