//! meshbridge: watches service registries and serves what it sees as one
//! Istio config set, to Istio Pilot over MCP-over-xDS and to Envoy over ADS.
//!
//! Data flow (see ARCHITECTURE.md): `config` → `reconcile` → registry
//! watchers → `cache` → `translate` → `xds` / `admin`.

// No unwrap() outside tests: errors are handled, or expect()ed with a reason.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin;
pub mod cache;
pub mod check;
pub mod config;
pub mod dump;
pub mod kube;
pub mod lifecycle;
pub mod metrics;
pub mod model;
pub mod publish;
pub mod reconcile;
pub mod resources;
pub mod run;
pub mod staleness;
pub mod startup;
pub mod time;
pub mod translate;
pub mod translate_cli;
pub mod watchers;
pub mod xds;

#[cfg(feature = "testing")]
pub mod testing;
