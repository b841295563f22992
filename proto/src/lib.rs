//! Istio networking and MCP messages, from the hand-written protos in this
//! crate (see `istio/`). Only the messages meshbridge emits are declared.

pub mod istio {
    pub mod mcp {
        pub mod v1alpha1 {
            include!(concat!(env!("OUT_DIR"), "/istio.mcp.v1alpha1.rs"));
        }
    }
    pub mod networking {
        pub mod v1alpha3 {
            include!(concat!(env!("OUT_DIR"), "/istio.networking.v1alpha3.rs"));
        }
    }
}
