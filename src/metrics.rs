//! Prometheus metrics, served by the admin server at `GET /metrics` in the
//! OpenMetrics text format (which Prometheus scrapes natively).
//!
//! Two kinds of series:
//!
//! - **Counters and histograms** are recorded where things happen: registry
//!   events, errors and full-sync durations by the cache's sinks
//!   ([`crate::cache::metrics`]); pushes, bytes, NACKs and latencies by each
//!   xDS stream's [`ClientHandle`](crate::xds::ClientHandle)
//!   ([`crate::xds::metrics`]). This module only assembles the registry.
//! - **Current state** (registry up/ready, services, endpoints, seconds since
//!   the last sync, connected clients, config objects) is read at scrape time
//!   by [`StateCollector`], so it never drifts from what the admin API shows
//!   and a removed registry's series go away with it.
//!
//! Names follow the Prometheus conventions: `meshbridge_` prefix, base units
//! (`_seconds`, `_bytes`), `_total` on counters.

use std::sync::Arc;
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::cache::Cache;
use crate::cache::metrics::RegistryLabels;
use crate::publish::Published;
use crate::translate::ConfigSet;
use crate::translate::warning::count_by_reason;
use crate::xds::Clients;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModeLabels {
    mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The process's metric registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub fn new(cache: Arc<Cache>, clients: Arc<Clients>, config: watch::Receiver<Arc<Published>>) -> Metrics {
        let mut r = Registry::default();
        let reg = cache.metrics().clone();
        r.register("meshbridge_registry_events", "Updates received from each registry's watcher", reg.events);
        r.register("meshbridge_registry_errors", "Failed calls to each registry, by error kind", reg.errors);
        r.register(
            "meshbridge_registry_sync_duration_seconds",
            "Duration of each registry's full syncs",
            reg.sync_duration,
        );
        r.register(
            "meshbridge_registry_drift_corrected",
            "Services a registry's periodic full read found changed although change detection had already seen past the change (missed changes, corrected)",
            reg.drift_corrected,
        );
        let xds = clients.metrics().clone();
        r.register("meshbridge_xds_pushes", "xDS responses sent, by type URL and mode", xds.pushes);
        r.register("meshbridge_xds_push_bytes", "Encoded size of the xDS responses sent", xds.push_bytes);
        r.register("meshbridge_xds_nacks", "xDS responses rejected by clients (NACK)", xds.nacks);
        r.register(
            "meshbridge_xds_event_to_send_seconds",
            "Latency from a registry change to the xDS response carrying it",
            xds.event_to_send,
        );
        r.register(
            "meshbridge_xds_event_to_ack_seconds",
            "Latency from a registry change to the client's ACK of the response carrying it",
            xds.event_to_ack,
        );
        r.register_collector(Box::new(StateCollector { cache, clients, config }));
        Metrics { registry: r }
    }

    /// The whole exposition, `# EOF` included.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Reads current state at scrape time.
#[derive(Debug)]
pub struct StateCollector {
    cache: Arc<Cache>,
    clients: Arc<Clients>,
    config: watch::Receiver<Arc<Published>>,
}

/// Encode one gauge family from `(labels, value)` pairs.
fn gauges<S: EncodeLabelSet, V: prometheus_client::encoding::EncodeGaugeValue + Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (S, V)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let regs = self.cache.registries();
        let labels = |r: &crate::cache::RegistryReport| RegistryLabels::from(&r.key);
        let e = &mut encoder;
        gauges(
            e,
            "meshbridge_registry_up",
            "1 if the most recent call to the registry succeeded",
            regs.iter().map(|r| (labels(r), i64::from(r.status.healthy))),
        )?;
        gauges(
            e,
            "meshbridge_registry_ready",
            "1 once the registry's first full sync has completed",
            regs.iter().map(|r| (labels(r), i64::from(r.status.ready))),
        )?;
        gauges(
            e,
            "meshbridge_registry_stale",
            "1 while the registry's services come from the state dump (it has not answered since the start)",
            regs.iter().map(|r| (labels(r), i64::from(r.status.stale))),
        )?;
        gauges(
            e,
            "meshbridge_registry_withdrawn",
            "1 while --max-stale has withdrawn the registry's endpoints",
            regs.iter().map(|r| (labels(r), i64::from(r.status.withdrawn))),
        )?;
        gauges(
            e,
            "meshbridge_watchers",
            "Live registry watcher tasks",
            [(Vec::<(String, String)>::new(), self.cache.watchers().get())],
        )?;
        gauges(
            e,
            "meshbridge_registry_services",
            "Services the registry reports",
            regs.iter().map(|r| (labels(r), r.services as i64)),
        )?;
        gauges(
            e,
            "meshbridge_registry_endpoints",
            "Endpoints the registry reports, over all its services",
            regs.iter().map(|r| (labels(r), r.endpoints as i64)),
        )?;
        gauges(
            e,
            "meshbridge_registry_consecutive_failures",
            "Failed registry calls since the last success",
            regs.iter().map(|r| (labels(r), r.status.consecutive_failures as i64)),
        )?;
        let now = SystemTime::now();
        gauges(
            e,
            "meshbridge_registry_last_sync_age_seconds",
            "Seconds since the registry's last successful full sync (absent before the first)",
            regs.iter().filter_map(|r| {
                let at = r.status.last_sync_time?;
                Some((labels(r), now.duration_since(at).unwrap_or_default().as_secs_f64()))
            }),
        )?;

        let mut modes = std::collections::BTreeMap::from([("delta", 0i64), ("sotw", 0i64)]);
        for (mode, n) in self.clients.count_by_mode() {
            *modes.entry(mode).or_default() += n as i64;
        }
        gauges(
            e,
            "meshbridge_xds_connected_clients",
            "Connected xDS streams, by mode",
            modes.into_iter().map(|(mode, n)| (ModeLabels { mode }, n)),
        )?;

        gauges(
            e,
            "meshbridge_xds_buffered_responses",
            "xDS responses built but not yet taken by the transport (slow clients)",
            [(ModeLabels { mode: "all" }, self.clients.buffered() as i64)],
        )?;

        let set = self.config.borrow().clone();
        gauges(
            e,
            "meshbridge_config_objects",
            "Objects in the current config set, by kind",
            object_counts(&set).into_iter().map(|(kind, n)| (KindLabels { kind }, n as i64)),
        )?;
        gauges(
            e,
            "meshbridge_config_rejected_objects",
            "Objects left out of the current config set, by reason",
            count_by_reason(set.warnings())
                .into_iter()
                .map(|(reason, n)| (ReasonLabels { reason: reason.as_str() }, n as i64)),
        )?;
        gauges(
            e,
            "meshbridge_config_errors",
            "Current problems with the config (files that do not parse, invalid entries, …); see /v1/config",
            [(Vec::<(String, String)>::new(), set.config.errors.len() as i64)],
        )?;
        Ok(())
    }
}

/// Objects per kind: the Istio objects, then the Envoy resources by the
/// message name of their type URL (`Cluster`, `ClusterLoadAssignment`, …).
pub fn object_counts(set: &ConfigSet) -> Vec<(String, usize)> {
    let mut istio = std::collections::BTreeMap::from([("ServiceEntry".to_string(), 0)]);
    for (kind, _, _) in set.istio.keys() {
        *istio.entry(kind.to_string()).or_default() += 1;
    }
    let mut out: Vec<(String, usize)> = istio.into_iter().collect();
    for (type_url, resources) in &set.envoy {
        out.push((type_kind(type_url).to_string(), resources.len()));
    }
    out
}

/// `type.googleapis.com/envoy.config.cluster.v3.Cluster` → `Cluster`.
pub fn type_kind(type_url: &str) -> &str {
    type_url.rsplit(['/', '.']).next().unwrap_or(type_url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RegistryKey;
    use crate::translate;
    use crate::translate::Reason;
    use meshbridge_registries::{Endpoint, Protocol, RegistryKind, Service, ServicePort, Update};

    #[test]
    fn reasons_from_real_warnings() {
        // Produce the warnings the way the code does: every one carries its
        // reason, none is read back from text.
        let cache = Cache::new();
        let ep = Endpoint { address: "10.0.0.1".into(), port: 80, weight: 1, labels: Default::default() };
        let port = ServicePort { number: 80, protocol: Protocol::Http, name: "http-80".into() };
        let web = Service::new("web.static", vec![port], vec![ep.clone()]);
        let a = cache.attach(&RegistryKey::new(RegistryKind::Static, "a"));
        a.update(Update::Upsert(web.clone()));
        a.update(Update::Upsert(Service::new("portless.static", vec![], vec![ep.clone()])));
        // Registry b reports web over HTTP/2 on the same port: a conflict.
        let h2 = ServicePort { number: 80, protocol: Protocol::Http2, name: "http2-80".into() };
        cache.attach(&RegistryKey::new(RegistryKind::Static, "b")).update(Update::Upsert(Service::new(
            "web.static",
            vec![h2],
            vec![ep],
        )));
        let set = translate::config_set(&cache.view());
        let counts: Vec<(&str, usize)> =
            count_by_reason(set.warnings()).into_iter().filter(|(_, n)| *n > 0).map(|(r, n)| (r.as_str(), n)).collect();
        assert_eq!(counts, [("host_conflict", 1), ("no_port", 1)], "{:?}", set.warnings().collect::<Vec<_>>());
        assert_eq!(count_by_reason([]).len(), Reason::ALL.len(), "every reason is reported");
    }

    #[test]
    fn kinds_from_type_urls() {
        assert_eq!(type_kind("type.googleapis.com/envoy.config.cluster.v3.Cluster"), "Cluster");
        assert_eq!(
            type_kind("type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"),
            "ClusterLoadAssignment"
        );
        assert_eq!(type_kind("networking.istio.io/v1alpha3/ServiceEntry"), "ServiceEntry");
    }
}
