//! meshbridge: watches service registries and serves what it sees as one
//! Istio config set, to Istio Pilot over MCP-over-xDS and to Envoy over ADS.
//!
//! Data flow (see ARCHITECTURE.md): `config` → `reconcile` → registry
//! watchers → `cache` → `translate` → `xds` / `admin`.

pub mod admin;
pub mod cache;
pub mod config;
pub mod kube;
pub mod metrics;
pub mod publish;
pub mod reconcile;
pub mod run;
pub mod translate;
pub mod xds;

#[cfg(feature = "testing")]
pub mod testing;
