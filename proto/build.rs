//! Compiles the hand-written Istio protos with protox (pure Rust, no protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["istio/mcp/v1alpha1/resource.proto", "istio/networking/v1alpha3/service_entry.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        // Ordered maps make encodings, and so content-hash versions, stable.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
