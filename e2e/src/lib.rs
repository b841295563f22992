//! Harnesses for end-to-end tests: each starts a real server on free
//! loopback ports in a temp dir and kills it when dropped, so tests run in
//! parallel and clean up even when they fail.
//!
//! Binaries come from `e2e/setup.sh` (see `e2e/env.sh`): `MESHBRIDGE_CONSUL_BIN`,
//! `MESHBRIDGE_ENVOY_BIN`, `MESHBRIDGE_TINYPROXY_BIN`,
//! `MESHBRIDGE_EUREKA_SERVER_JAR`, `MESHBRIDGE_DUBBO_PROVIDER_JAR`, `MESHBRIDGE_SPRING_APP_JAR`, `MESHBRIDGE_HELM_BIN`,
//! `MESHBRIDGE_RNACOS_BIN`, `MESHBRIDGE_NACOS_SERVER_JAR`, `MESHBRIDGE_ISTIOD_BIN`. A test whose server is
//! not installed fails with a message naming the variable, it never passes
//! silently.

pub mod apiserver;
pub mod backend;
pub mod bench;
pub mod captured_logs;
pub mod consul;
pub mod consul_fake;
pub mod convergence;
pub mod delaying_proxy;
pub mod dns_fake;
pub mod dubbo;
pub mod envoy;
pub mod eureka;
pub mod eureka_fake;
pub mod faults;
pub mod gateway;
pub mod helm;
pub mod idle_cut_proxy;
pub mod istiod;
pub mod jvm;
pub mod kube_fake;
pub mod load;
pub mod nacos;
pub mod nacos_server;
pub mod netns;
pub mod process;
pub mod recorder;
pub mod request_log;
pub mod spring_app;
pub mod test_pki;
pub mod tinyproxy;
pub mod tls_backend;
pub mod tls_test_proxy;
pub mod traffic;
pub mod zookeeper;
pub mod zookeeper_old_fake;

pub use process::{ChildGuard, free_port, wait_for_http, wait_for_tcp};
