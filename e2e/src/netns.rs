//! A network namespace joined to the host by a veth pair, for partition
//! scenarios: a server started with [`Host::command`] runs inside it and is
//! reached from the host at [`Host::ip`]; [`Netns::cut`] takes the link
//! down and [`Netns::restore`] brings it back.
//!
//! The cut takes down the namespace's end of the pair. The host's end stays
//! up without a carrier, so its route stays (marked `linkdown`) and packets
//! to the server are dropped silently: connections in flight hang, and a new
//! connect fails only when ARP gives up (about 3 s), as on a real network
//! partition. Taking down the host's end instead would remove the route,
//! and packets would go to the default gateway.
//!
//! Addresses come from 198.18.0.0/15 (RFC 2544, for tests like this): one /30
//! per namespace, derived from the process id and a counter and skipped when
//! the host already has it, so tests in parallel processes do not collide.
//! Names carry the process id; namespaces left by a test process that died
//! (SIGKILL) are removed by the next [`Netns::create`].
//!
//! A test client can live in the namespace too, without a process of its
//! own: [`Netns::dial`] opens TCP connections from inside it (a thread
//! joins the namespace with `setns`, and a socket stays in the namespace it
//! was made in), to a server on the host bound to [`Netns::host_ip`]. The
//! server then sees a peer that is neither loopback nor any address of this
//! machine's real interfaces, and nothing is bound where the network can
//! reach it.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip` from iproute2.

use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use meshbridge::testing::pki::Dial;
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use anyhow::{Context, bail};

/// /30 subnets in 198.18.0.0/15.
const SUBNETS: u32 = 1 << 15;
/// Namespaces one process can have at once before indexes repeat.
const PER_PROCESS: u32 = 64;
const PREFIX: &str = "mbns";

/// Where a server runs: on the host's loopback, or inside a namespace.
#[derive(Debug, Clone)]
pub struct Host {
    /// The address the server binds and clients connect to.
    pub ip: Ipv4Addr,
    netns: Option<String>,
}

impl Default for Host {
    fn default() -> Host {
        Host::loopback()
    }
}

impl Host {
    /// `127.0.0.1` on the host.
    pub fn loopback() -> Host {
        Host { ip: Ipv4Addr::LOCALHOST, netns: None }
    }

    /// A command that runs `program` here (`ip netns exec NAME program`, which
    /// execs it in place: its pid is the server's, for signals).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match &self.netns {
            None => Command::new(program),
            Some(name) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", name]).arg(program);
                cmd
            }
        }
    }
}

/// A namespace and its veth pair; both are removed when dropped.
pub struct Netns {
    name: String,
    host_if: String,
    ns_if: String,
    host_ip: Ipv4Addr,
    ns_ip: Ipv4Addr,
}

impl Netns {
    /// Make a namespace with a veth pair and a fresh /30. Any failure is an
    /// error, not permitted (no root) included: a test that needs a
    /// namespace fails without one, it never passes without running.
    pub fn create() -> anyhow::Result<Netns> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        remove_orphans();
        let pid = std::process::id();
        let seq = SEQ.fetch_add(1, Ordering::Relaxed) % PER_PROCESS;
        let name = format!("{PREFIX}{pid}n{seq}");
        // Interface names: at most 15 bytes ("mbh" + 7-digit pid + 2 + 2).
        let (host_if, ns_if) = (format!("mbh{pid}x{seq}"), format!("mbn{pid}x{seq}"));
        let (host_ip, ns_ip) = free_subnet(pid, seq)?;
        let out = Command::new("ip").args(["netns", "add", &name]).output().context("run `ip netns add`")?;
        if !out.status.success() {
            bail!(
                "`ip netns add {name}`: {} (network namespaces need root: CAP_NET_ADMIN and CAP_SYS_ADMIN)",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // From here on, Drop cleans up whatever was made.
        let ns = Netns { name, host_if, ns_if, host_ip, ns_ip };
        ns.setup()?;
        Ok(ns)
    }

    fn setup(&self) -> anyhow::Result<()> {
        let (h, n, name) = (&self.host_if, &self.ns_if, &self.name);
        ip(&["link", "add", h, "type", "veth", "peer", "name", n])?;
        ip(&["link", "set", n, "netns", name])?;
        ip(&["addr", "add", &format!("{}/30", self.host_ip), "dev", h])?;
        ip(&["link", "set", h, "up"])?;
        ip(&["-n", name, "addr", "add", &format!("{}/30", self.ns_ip), "dev", n])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        self.restore()
    }

    /// Where to run a server inside the namespace.
    pub fn host(&self) -> Host {
        Host { ip: self.ns_ip, netns: Some(self.name.clone()) }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's end of the link. A server on the host bound here is
    /// reached from inside the namespace (and, for a client on the host
    /// that only needs a peer address that is not loopback, from here: an
    /// address this test made, on no real interface).
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// Run `f` on a thread that has joined the namespace: sockets it opens
    /// live there, whichever thread uses them later.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        in_namespace(&self.name, f)
    }

    /// TCP connections to `addr` opened from inside the namespace (their
    /// source is [`Host::ip`] of [`Netns::host`]), for the test clients of
    /// `meshbridge::testing` (`pki::channel_dialed`, `pki::tls_channel_dialed`).
    pub fn dial(&self, addr: SocketAddr) -> Dial {
        let name = self.name.clone();
        Arc::new(move || in_namespace(&name, || TcpStream::connect(addr)).map_err(std::io::Error::other)?)
    }

    /// Partition: the namespace's end of the link goes down.
    pub fn cut(&self) -> anyhow::Result<()> {
        ip(&["-n", &self.name, "link", "set", &self.ns_if, "down"])
    }

    /// Heal the partition.
    pub fn restore(&self) -> anyhow::Result<()> {
        ip(&["-n", &self.name, "link", "set", &self.ns_if, "up"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting either end of a veth pair deletes both.
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Run `f` on a new thread joined to namespace `name` (`setns(2)` on
/// `/run/netns/NAME`, where `ip netns add` mounts it; it changes only the
/// calling thread's namespace, so the thread is one of its own).
fn in_namespace<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
                    .with_context(|| format!("setns {path}"))?;
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("a thread in namespace {name} panicked"))?
    })
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().context("run `ip`")?;
    if !out.status.success() {
        bail!("`ip {}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The first /30 from this process's slot on that no host interface holds.
fn free_subnet(pid: u32, seq: u32) -> anyhow::Result<(Ipv4Addr, Ipv4Addr)> {
    let out = Command::new("ip").args(["-4", "-o", "addr", "show"]).output().context("run `ip addr show`")?;
    let taken = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = (pid.wrapping_mul(PER_PROCESS) + seq) % SUBNETS;
    for i in 0..SUBNETS {
        let (host, ns) = subnet((start + i) % SUBNETS);
        if !taken.contains(&format!("inet {host}/")) && !taken.contains(&format!("inet {ns}/")) {
            return Ok((host, ns));
        }
    }
    bail!("no free /30 in 198.18.0.0/15")
}

/// The host and namespace addresses of /30 number `index` of 198.18.0.0/15.
fn subnet(index: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + (index % SUBNETS) * 4;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

/// Namespaces of ours whose process is gone (killed before its Drop ran).
fn remove_orphans() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some((pid, seq)) = name.strip_prefix(PREFIX).and_then(|rest| rest.split_once('n')) else { continue };
        if pid.parse::<u32>().is_err() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = Command::new("ip").args(["link", "del", &format!("mbh{pid}x{seq}")]).output();
        let _ = Command::new("ip").args(["netns", "del", name]).output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_are_disjoint_slash_30s_in_the_benchmark_range() {
        assert_eq!(subnet(0), (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(subnet(SUBNETS - 1), (Ipv4Addr::new(198, 19, 255, 253), Ipv4Addr::new(198, 19, 255, 254)));
        assert_eq!(subnet(SUBNETS), subnet(0));
    }
}
