//! What the bench reads about its own process from `/proc`: CPU time, RSS
//! and TCP connections to a registry.
//!
//! meshbridge runs in the bench process, on its own runtime; the harness's
//! runtime names its threads [`HARNESS_THREAD`], so meshbridge's CPU is the
//! process's CPU less those threads' (a thread that has exited leaves its
//! time in the process total, so the harness runtime keeps its threads).

use std::collections::HashSet;

/// Thread name of the harness runtime's workers and blocking threads
/// (under the kernel's 15-byte limit, so `comm` holds all of it).
pub const HARNESS_THREAD: &str = "bench-harness";

/// Clock ticks per second of `utime`/`stime` in `/proc/*/stat`. Linux has
/// reported `USER_HZ` = 100 to user space on every architecture since 2.6.
const TICKS_PER_SEC: f64 = 100.0;

/// utime + stime (seconds) from one `/proc/.../stat` line. The command name
/// (field 2) may hold spaces, so fields are counted after its `)`.
fn stat_cpu(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3, so utime (14) and stime (15) are at 11, 12.
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / TICKS_PER_SEC)
}

/// CPU seconds used so far by everything in this process except the
/// harness threads: meshbridge's share.
pub fn meshbridge_cpu() -> f64 {
    process_cpu() - harness_cpu()
}

/// CPU seconds used so far by the whole process.
pub fn process_cpu() -> f64 {
    std::fs::read_to_string("/proc/self/stat").ok().and_then(|s| stat_cpu(&s)).unwrap_or(0.0)
}

fn harness_cpu() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    let mut sum = 0.0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == HARNESS_THREAD {
            sum += std::fs::read_to_string(task.path().join("stat")).ok().and_then(|s| stat_cpu(&s)).unwrap_or(0.0);
        }
    }
    sum
}

/// Resident set size of this process, MiB.
pub fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Established TCP connections from this process to any of `ports` on
/// the loopback registry: `/proc/net/tcp{,6}` rows whose remote port
/// matches and whose socket inode is one of this process's descriptors.
pub fn connections_to(ports: &[u16]) -> usize {
    let mine = own_socket_inodes();
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
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

fn own_socket_inodes() -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else { return HashSet::new() };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_skips_a_command_with_spaces() {
        let line = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0";
        assert_eq!(stat_cpu(line), Some(4.0));
    }
}
