//! Compiles the hand-written Istio protos with protox (pure Rust, no protoc):
//! prost structs for every message, plus the descriptor set that
//! `descriptor_pool()` loads for the JSON → protobuf path.

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
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=istio");
    let fds = protox::compile(FILES, ["."])?;

    // The pool needs no comments; dropping them keeps the embedded bytes small.
    let mut bare = fds.clone();
    for file in &mut bare.file {
        file.source_code_info = None;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("istio_fds.bin"), bare.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        // Ordered maps make encodings, and so content-hash versions, stable.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
