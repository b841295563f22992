//! A real HTTP CONNECT proxy: Debian's tinyproxy, in the foreground on a free
//! loopback port, with its config and log in a temp dir.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{ChildGuard, binary_from_env, free_port, wait_for_tcp};

pub struct Tinyproxy {
    pub port: u16,
    guard: ChildGuard,
    dir: TempDir,
}

impl Tinyproxy {
    /// Start tinyproxy on `127.0.0.1:{free port}`, accepting clients from
    /// 127.0.0.1 and allowing CONNECT to `connect_port` only.
    pub async fn start(connect_port: u16) -> anyhow::Result<Tinyproxy> {
        let bin = binary_from_env("MESHBRIDGE_TINYPROXY_BIN")?;
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let log = dir.path().join("tinyproxy.log");
        // No User/Group: it runs as whoever starts it (and says so once).
        let config = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nAllow 127.0.0.1\nConnectPort {connect_port}\n\
             MaxClients 50\nLogFile \"{}\"\nLogLevel Info\n",
            log.display()
        );
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(&conf, config)?;
        let mut cmd = Command::new(bin);
        cmd.arg("-d").arg("-c").arg(&conf);
        let mut guard = ChildGuard::spawn("tinyproxy", cmd, dir.path().join("stdout.log"))?;
        if let Err(e) = wait_for_tcp(([127, 0, 0, 1], port).into(), Duration::from_secs(10)).await {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            guard.kill();
            anyhow::bail!("tinyproxy: {e}\n{log}{}", guard.log());
        }
        Ok(Tinyproxy { port, guard, dir })
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("tinyproxy.log")
    }

    /// The whole log so far, for failure messages.
    pub fn log(&self) -> String {
        let mut s = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        s.push_str(&self.guard.log());
        s
    }

    /// The targets of the CONNECT requests received so far (`host:port`),
    /// from tinyproxy's `Request (file descriptor N): CONNECT host:port
    /// HTTP/1.1` log lines.
    pub fn connects(&self) -> Vec<String> {
        std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("): CONNECT ")?.1.split_whitespace().next().map(str::to_string))
            .collect()
    }
}
