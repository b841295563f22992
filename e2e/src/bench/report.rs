//! The bench's figures per registry and size, and the tables it prints.

use std::fmt::Write;

use super::procfs::Memory;
use super::registry::Kind;

/// Failing-check propagation, meshbridge against Envoy STRICT_DNS on
/// Consul's DNS, in the same run.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub meshbridge_ms: Vec<f64>,
    /// Of `meshbridge_ms`, Envoy's own: meshbridge's EDS response sent →
    /// Envoy's ACK.
    pub envoy_own_ms: Vec<f64>,
    pub dns_ms: Vec<f64>,
    pub note: Option<String>,
}

/// Everything measured for one registry at one size.
#[derive(Debug, Clone)]
pub struct Row {
    pub kind: Kind,
    pub services: usize,
    pub per: usize,
    /// Registering every instance (the harness, not meshbridge).
    pub fill_s: f64,
    /// meshbridge start → its cache holds every instance.
    pub sync_s: Option<f64>,
    /// (services, endpoints) in the cache when the sync ended or gave up.
    pub seen: (usize, usize),
    /// meshbridge's CPU from its start to the end of the sync.
    pub cpu_sync_s: f64,
    /// Envoy start → every cluster active, none warming.
    pub envoy_sync_s: Option<f64>,
    /// meshbridge's memory at sync, with Envoy synced, with every client
    /// connected and synced too, and after the changes.
    pub mem_sync: Memory,
    pub mem_envoy: Memory,
    pub mem_clients: Memory,
    pub mem_end: Memory,
    /// meshbridge's connections to the registry at sync, and the
    /// harness's own at that moment.
    pub connections: usize,
    pub connections_harness: usize,
    /// Changes the registry refused to the harness.
    pub change_errors: usize,
    pub changes: usize,
    pub done: usize,
    pub envoy_ms: Vec<f64>,
    /// Of `envoy_ms`, Envoy's own: meshbridge's EDS response sent → ACK.
    pub envoy_own_ms: Vec<f64>,
    pub bare_ms: Vec<f64>,
    pub diff_ms: Vec<f64>,
    pub fanout_ms: Vec<f64>,
    pub cpu_per_change_ms: f64,
    /// SotW, delta, MCP (Pilot-like SotW).
    pub bytes_per_change: [f64; 3],
    pub peer: Option<Peer>,
    pub notes: Vec<String>,
}

impl Row {
    pub fn new(kind: Kind, services: usize, per: usize) -> Row {
        Row {
            kind,
            services,
            per,
            fill_s: 0.0,
            sync_s: None,
            seen: (0, 0),
            cpu_sync_s: 0.0,
            envoy_sync_s: None,
            mem_sync: Memory::default(),
            mem_envoy: Memory::default(),
            mem_clients: Memory::default(),
            mem_end: Memory::default(),
            connections: 0,
            connections_harness: 0,
            change_errors: 0,
            changes: 0,
            done: 0,
            envoy_ms: Vec::new(),
            envoy_own_ms: Vec::new(),
            bare_ms: Vec::new(),
            diff_ms: Vec::new(),
            fanout_ms: Vec::new(),
            cpu_per_change_ms: 0.0,
            bytes_per_change: [0.0; 3],
            peer: None,
            notes: Vec::new(),
        }
    }
}

/// The `q` quantile (nearest rank) of `v`; `None` when empty.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

fn p(v: &[f64]) -> String {
    match (quantile(v, 0.5), quantile(v, 0.99)) {
        (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
        _ => "–".into(),
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

pub fn render(rows: &[Row]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\n## Sync, memory, connections\n");
    let _ = writeln!(
        o,
        "| registry | services × inst | register (s) | sync (s) | sync CPU (s) | Envoy warm (s) | RSS at sync (MiB) | with Envoy | with Envoy + clients | after changes (peak) | conns to registry (harness's) |"
    );
    let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        let _ = writeln!(
            o,
            "| {} | {} × {} | {:.1} | {} | {:.2} | {} | {:.0} | {:.0} | {:.0} | {:.0} ({:.0}) | {} ({}) |",
            r.kind.name(),
            r.services,
            r.per,
            r.fill_s,
            opt(r.sync_s, 2),
            r.cpu_sync_s,
            opt(r.envoy_sync_s, 2),
            r.mem_sync.rss,
            r.mem_envoy.rss,
            r.mem_clients.rss,
            r.mem_end.rss,
            r.mem_end.hwm,
            r.connections,
            r.connections_harness
        );
    }
    let _ = writeln!(o, "\n## Single-instance changes (p50 / p99, ms)\n");
    let _ = writeln!(
        o,
        "| registry | services | changes ok (refused) | Envoy EDS applied | of it Envoy's own (sent → ACK) | bare client notified | difference | last of fan-out | CPU/change (ms) | bytes/change SotW | delta | MCP |"
    );
    let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        let [s, d, m] = r.bytes_per_change;
        let _ = writeln!(
            o,
            "| {} | {} | {}/{} ({}) | {} | {} | {} | {} | {} | {:.2} | {s:.0} | {d:.0} | {m:.0} |",
            r.kind.name(),
            r.services,
            r.done,
            r.changes,
            r.change_errors,
            p(&r.envoy_ms),
            p(&r.envoy_own_ms),
            p(&r.bare_ms),
            p(&r.diff_ms),
            p(&r.fanout_ms),
            r.cpu_per_change_ms
        );
    }
    peer_table(&mut o, rows);
    growth_table(&mut o, rows);
    let _ = writeln!(o, "\n## Notes\n");
    for r in rows {
        let _ = writeln!(o, "- {} {}: bare client = {}", r.kind.name(), r.services, r.kind.bare_client());
        for n in &r.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    o
}

fn peer_table(o: &mut String, rows: &[Row]) {
    let peers: Vec<(&Row, &Peer)> = rows.iter().filter_map(|r| Some((r, r.peer.as_ref()?))).collect();
    if peers.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n## Failing health check: meshbridge vs Envoy STRICT_DNS on Consul DNS (ms)\n");
    let _ = writeln!(
        o,
        "| services | rounds | meshbridge → Envoy (p50 / max) | of it Envoy's own (p50 / max) | STRICT_DNS (p50 / max) | ratio of p50s |"
    );
    let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
    for (r, peer) in peers {
        let pm = |v: &[f64]| match (quantile(v, 0.5), quantile(v, 1.0)) {
            (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
            _ => "–".into(),
        };
        let ratio = match (quantile(&peer.dns_ms, 0.5), quantile(&peer.meshbridge_ms, 0.5)) {
            (Some(d), Some(m)) if m > 0.0 => format!("{:.0}×", d / m),
            _ => "–".into(),
        };
        let rounds = peer.dns_ms.len();
        let _ = writeln!(
            o,
            "| {} | {rounds} | {} | {} | {} | {ratio} |{}",
            r.services,
            pm(&peer.meshbridge_ms),
            pm(&peer.envoy_own_ms),
            pm(&peer.dns_ms),
            peer.note.as_deref().map(|n| format!(" {n}")).unwrap_or_default()
        );
    }
}

fn growth_table(o: &mut String, rows: &[Row]) {
    let mut lines = Vec::new();
    for kind in [Kind::Consul, Kind::Nacos, Kind::Zookeeper] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.kind == kind && r.done > 0).collect();
        let (Some(small), Some(big)) = (mine.iter().min_by_key(|r| r.services), mine.iter().max_by_key(|r| r.services))
        else {
            continue;
        };
        if small.services == big.services {
            continue;
        }
        let ratio = |a: f64, b: f64| if a > 0.0 { format!("{:.2}", b / a) } else { "–".into() };
        let q = |r: &Row, x| quantile(&r.envoy_ms, x).unwrap_or(0.0);
        lines.push(format!(
            "| {} | {} → {} | {} | {} | {} | {} | {} | {} |",
            kind.name(),
            small.services,
            big.services,
            ratio(small.cpu_per_change_ms, big.cpu_per_change_ms),
            ratio(small.bytes_per_change[0], big.bytes_per_change[0]),
            ratio(small.bytes_per_change[1], big.bytes_per_change[1]),
            ratio(small.bytes_per_change[2], big.bytes_per_change[2]),
            ratio(q(small, 0.5), q(big, 0.5)),
            ratio(q(small, 0.99), q(big, 0.99)),
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n## Growth: per-change cost at the largest size over the smallest\n");
    let _ =
        writeln!(o, "| registry | services | CPU | bytes SotW | bytes delta | bytes MCP | latency p50 | latency p99 |");
    let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    for l in lines {
        let _ = writeln!(o, "{l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
