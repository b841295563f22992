//! What the cache's sinks record per registry: events, errors, full-sync
//! durations and corrected drift. Registered by [`crate::metrics::Metrics`]; a leaf module, so
//! the cache depends on no other part for its metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Full syncs take milliseconds on a small registry and tens of seconds on a
/// large one behind a slow link.
const SYNC_BUCKETS: [f64; 13] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

fn sync_histogram() -> Histogram {
    Histogram::new(SYNC_BUCKETS)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RegistryLabels {
    pub name: String,
    pub r#type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RegistryErrorLabels {
    pub name: String,
    pub r#type: &'static str,
    /// [`meshbridge_registries::RegistryError::kind`].
    pub kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RepairLabels {
    pub name: String,
    pub r#type: &'static str,
    /// [`meshbridge_registries::RepairKind::as_str`].
    pub kind: &'static str,
}

/// What the cache's sinks record per registry. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct RegistryMetrics {
    pub events: Family<RegistryLabels, Counter>,
    pub errors: Family<RegistryErrorLabels, Counter>,
    pub sync_duration: HistogramFamily<RegistryLabels>,
    /// Services the anti-entropy pass repaired, by why (the watcher's
    /// change detection had left them wrong).
    pub drift_corrected: Family<RepairLabels, Counter>,
}

impl Default for RegistryMetrics {
    fn default() -> Self {
        RegistryMetrics {
            events: Family::default(),
            errors: Family::default(),
            sync_duration: Family::new_with_constructor(sync_histogram),
            drift_corrected: Family::default(),
        }
    }
}

impl RegistryMetrics {
    /// Drop a removed registry's series.
    pub fn forget<'a>(&self, labels: &RegistryLabels, error_kinds: impl IntoIterator<Item = &'a &'static str>) {
        self.events.remove(labels);
        self.sync_duration.remove(labels);
        for kind in meshbridge_registries::RepairKind::ALL {
            self.drift_corrected.remove(&RepairLabels {
                name: labels.name.clone(),
                r#type: labels.r#type,
                kind: kind.as_str(),
            });
        }
        for kind in error_kinds {
            self.errors.remove(&RegistryErrorLabels { name: labels.name.clone(), r#type: labels.r#type, kind });
        }
    }
}
