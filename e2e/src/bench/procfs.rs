//! What the bench reads from `/proc`: CPU time, memory and TCP connections
//! to a registry, of the meshbridge child process ([`Proc::pid`]) or of the
//! bench itself ([`Proc::me`]).

use std::collections::HashSet;
use std::path::PathBuf;

/// Thread name of a harness runtime's workers and blocking threads (under
/// the kernel's 15-byte limit, so `comm` holds all of it); tools that run
/// code under test in-process (`consul_change_cost`) tell their own CPU
/// apart by it.
pub const HARNESS_THREAD: &str = "bench-harness";

/// Clock ticks per second of `utime`/`stime` in `/proc/*/stat`. Linux has
/// reported `USER_HZ` = 100 to user space on every architecture since 2.6.
const TICKS_PER_SEC: f64 = 100.0;

/// utime + stime (seconds) from one `/proc/.../stat` line.
fn stat_cpu(stat: &str) -> Option<f64> {
    stat_user_sys(stat).map(|(user, sys)| user + sys)
}

/// (utime, stime) in seconds from one `/proc/.../stat` line. The command
/// name (field 2) may hold spaces, so fields are counted after its `)`.
fn stat_user_sys(stat: &str) -> Option<(f64, f64)> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3, so utime (14) and stime (15) are at 11, 12.
    let ticks = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some((ticks(11)? as f64 / TICKS_PER_SEC, ticks(12)? as f64 / TICKS_PER_SEC))
}

/// CPU seconds used so far by the whole bench process.
pub fn process_cpu() -> f64 {
    Proc::me().cpu()
}

/// Resident memory of a process, MiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss: f64,
    /// `VmHWM`: the most ever resident.
    pub hwm: f64,
}

/// One process's `/proc` directory.
#[derive(Debug, Clone)]
pub struct Proc(PathBuf);

impl Proc {
    pub fn me() -> Proc {
        Proc(PathBuf::from("/proc/self"))
    }

    pub fn pid(pid: u32) -> Proc {
        Proc(PathBuf::from(format!("/proc/{pid}")))
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file)).unwrap_or_default()
    }

    /// utime + stime of every thread, those that have exited included
    /// (seconds, in 10 ms ticks).
    pub fn cpu(&self) -> f64 {
        stat_cpu(&self.read("stat")).unwrap_or(0.0)
    }

    /// [`cpu`](Self::cpu) as (user, system) seconds.
    pub fn cpu_user_sys(&self) -> (f64, f64) {
        stat_user_sys(&self.read("stat")).unwrap_or_default()
    }

    pub fn memory(&self) -> Memory {
        let status = self.read("status");
        Memory { rss: status_mib(&status, "VmRSS:"), hwm: status_mib(&status, "VmHWM:") }
    }

    /// Threads now (`Threads:` of `status`).
    pub fn threads(&self) -> Option<usize> {
        self.read("status").lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok())
    }

    /// `smaps_rollup`'s lines, for a note on what the resident memory is.
    pub fn smaps_rollup(&self) -> String {
        self.read("smaps_rollup")
    }

    /// Established TCP connections from this process to any of `ports` on
    /// the loopback registry: `/proc/net/tcp{,6}` rows whose remote port
    /// matches and whose socket inode is one of the process's descriptors.
    pub fn connections_to(&self, ports: &[u16]) -> usize {
        let mine = self.socket_inodes();
        let mut n = 0;
        for table in ["net/tcp", "net/tcp6"] {
            for line in self.read(table).lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (Some(remote), Some(state), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else { continue };
                // 01 = ESTABLISHED.
                if *state != "01" {
                    continue;
                }
                let port = remote.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
                if port.is_some_and(|p| ports.contains(&p)) && inode.parse::<u64>().is_ok_and(|i| mine.contains(&i)) {
                    n += 1;
                }
            }
        }
        n
    }

    fn socket_inodes(&self) -> HashSet<u64> {
        let Ok(fds) = std::fs::read_dir(self.0.join("fd")) else { return HashSet::new() };
        fds.flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter_map(|target| {
                let t = target.to_string_lossy().into_owned();
                t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
            })
            .collect()
    }
}

/// A `Vm…:  1234 kB` line of `/proc/*/status`, in MiB (0 if absent).
fn status_mib(status: &str, key: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_skips_a_command_with_spaces() {
        let line = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0";
        assert_eq!(stat_cpu(line), Some(4.0));
        assert_eq!(stat_user_sys(line), Some((2.5, 1.5)));
    }

    #[test]
    fn status_lines_are_read_in_mib() {
        let status = "Name:\tx\nVmHWM:\t  20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_mib(status, "VmRSS:"), 10.0);
        assert_eq!(status_mib(status, "VmHWM:"), 20.0);
        assert_eq!(status_mib(status, "VmSwap:"), 0.0);
    }

    #[test]
    fn this_process_has_cpu_and_memory() {
        let me = Proc::me();
        assert!(me.memory().rss > 0.0);
        assert!(me.cpu() >= 0.0);
    }
}
