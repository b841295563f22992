//! Compiles the hand-written Istio protos with protox (pure Rust, no protoc):
//! prost structs for every message, plus the descriptor set that
//! `descriptor_pool()` loads for the JSON → protobuf path.
//!
//! It also compiles the descriptors (only those, no Rust code) of the Envoy
//! messages meshbridge sends, from the `.proto` sources the envoy-types
//! crate ships, for `envoy::to_json` (`meshbridge translate --envoy`).
//! envoy-types exposes neither its descriptors nor where its sources are,
//! so they are found in Cargo's registry by the version Cargo.lock names
//! (or under `MESHBRIDGE_ENVOY_PROTO_DIR`, for a vendored build).

use std::path::PathBuf;

use prost::Message;

const FILES: &[&str] = &[
    "istio/mcp/v1alpha1/resource.proto",
    "istio/networking/v1alpha3/destination_rule.proto",
    "istio/networking/v1alpha3/envoy_filter.proto",
    "istio/networking/v1alpha3/gateway.proto",
    "istio/networking/v1alpha3/service_entry.proto",
    "istio/networking/v1alpha3/sidecar.proto",
    "istio/networking/v1alpha3/virtual_service.proto",
    "istio/networking/v1alpha3/workload_entry.proto",
    "istio/security/v1beta1/authorization_policy.proto",
    "istio/type/v1beta1/selector.proto",
];

/// The Envoy messages meshbridge sends as resources or inside `typed_config`;
/// their imports come along.
const ENVOY_FILES: &[&str] = &[
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/extensions/clusters/aggregate/v3/cluster.proto",
    "envoy/extensions/filters/http/cors/v3/cors.proto",
    "envoy/extensions/filters/http/custom_response/v3/custom_response.proto",
    "envoy/extensions/filters/http/rbac/v3/rbac.proto",
    "envoy/extensions/filters/http/local_ratelimit/v3/local_rate_limit.proto",
    "envoy/extensions/filters/http/router/v3/router.proto",
    "envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
    "envoy/extensions/http/custom_response/redirect_policy/v3/redirect_policy.proto",
    "envoy/extensions/transport_sockets/tls/v3/secret.proto",
    "envoy/extensions/transport_sockets/tls/v3/tls.proto",
    "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
    "envoy/type/matcher/v3/status_code_input.proto",
];

/// Where envoy-types keeps each proto tree, under its `proto/`.
const ENVOY_INCLUDES: &[&str] = &[
    "data-plane-api",
    "xds",
    "protoc-gen-validate",
    "googleapis",
    "cel-spec/proto",
    "opentelemetry-proto",
    "client_model",
];

/// The descriptor set without comments: the pool needs none, and the
/// embedded bytes stay small.
fn bare(fds: &prost_types::FileDescriptorSet) -> Vec<u8> {
    let mut bare = fds.clone();
    for file in &mut bare.file {
        file.source_code_info = None;
    }
    bare.encode_to_vec()
}

/// envoy-types' `proto/` directory.
fn envoy_proto_dir() -> Result<PathBuf, Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=MESHBRIDGE_ENVOY_PROTO_DIR");
    if let Some(dir) = std::env::var_os("MESHBRIDGE_ENVOY_PROTO_DIR") {
        return Ok(dir.into());
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let lock_path = manifest.join("../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock_path.display());
    let lock = std::fs::read_to_string(&lock_path)?;
    let version = lock
        .split("[[package]]")
        .find(|p| p.lines().any(|l| l.trim() == "name = \"envoy-types\""))
        .and_then(|p| p.lines().find_map(|l| l.trim().strip_prefix("version = \"")?.strip_suffix('"')))
        .ok_or("Cargo.lock names no envoy-types version")?
        .to_owned();
    let cargo_home = match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("neither CARGO_HOME nor HOME is set")?).join(".cargo"),
    };
    let registry = cargo_home.join("registry/src");
    for index in std::fs::read_dir(&registry)? {
        let dir = index?.path().join(format!("envoy-types-{version}/proto"));
        if dir.is_dir() {
            return Ok(dir);
        }
    }
    Err(format!(
        "envoy-types {version}'s proto/ is not under {}; set MESHBRIDGE_ENVOY_PROTO_DIR to it",
        registry.display()
    )
    .into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=istio");
    let fds = protox::compile(FILES, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("istio_fds.bin"), bare(&fds))?;

    let envoy = envoy_proto_dir()?;
    let envoy_fds = protox::compile(ENVOY_FILES, ENVOY_INCLUDES.iter().map(|i| envoy.join(i)))?;
    std::fs::write(out.join("envoy_fds.bin"), bare(&envoy_fds))?;

    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        // Ordered maps make encodings, and so content-hash versions, stable.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
