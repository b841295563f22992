//! What xDS streams record: pushes, bytes, NACKs and push latencies, by
//! type URL (known ones only, see [`super::clients::metric_type_url`]) and
//! mode. Registered by [`crate::metrics::Metrics`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Event-to-push latency: sub-millisecond in process, seconds when a client
/// is slow to ACK.
const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct XdsLabels {
    pub type_url: String,
    /// `sotw` or `delta`.
    pub mode: &'static str,
}

/// What xDS streams record. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct XdsMetrics {
    pub pushes: Family<XdsLabels, Counter>,
    pub push_bytes: Family<XdsLabels, Counter>,
    pub nacks: Family<XdsLabels, Counter>,
    /// From the first unpublished registry change to the response carrying it.
    pub event_to_send: HistogramFamily<XdsLabels>,
    /// From the same change to the client's ACK of that response.
    pub event_to_ack: HistogramFamily<XdsLabels>,
}

impl Default for XdsMetrics {
    fn default() -> Self {
        XdsMetrics {
            pushes: Family::default(),
            push_bytes: Family::default(),
            nacks: Family::default(),
            event_to_send: Family::new_with_constructor(latency_histogram),
            event_to_ack: Family::new_with_constructor(latency_histogram),
        }
    }
}
