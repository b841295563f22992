//! Pure translation from registry services and Ingresses to Istio objects
//! and Envoy resources. No I/O, no clocks, no locks: the same input always
//! gives the same output, byte for byte, which is what makes versions stable
//! content hashes and the output snapshot-testable.
//!
//! - [`model`]: the one typed model of the Istio objects we write.
//! - [`istio`], [`envoy`]: one registry service → its ServiceEntry,
//!   DestinationRule, clusters and endpoints.
//! - [`ingress`], [`gateway`], [`proxy`]: Ingresses → Istio objects →
//!   standalone-gateway listeners and routes; McpBridge proxies.
//! - [`pb`]: the model → Istio's generated prost messages, encoded.
//! - [`mcp`]: Istio objects → MCP resources.
//! - [`merge`]: one host that several registries report → one service.
//! - [`build`]: the incremental [`Translator`] that keeps a [`ConfigSet`]
//!   up to date at the cost of what changed.

pub mod build;
pub mod envoy;
pub mod gateway;
pub mod ingress;
pub mod inputs;
pub mod istio;
pub mod mcp;
pub mod merge;
pub mod model;
pub mod names;
pub mod pb;
pub mod proxy;
pub mod set;
pub mod shared;
pub mod warning;

pub use build::{Translator, build, config_set};
pub use inputs::Inputs;
pub use set::ConfigSet;
pub use warning::{Reason, Warning};

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
