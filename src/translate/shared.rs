//! Small maps that thousands of translated objects hold with the same
//! contents, shared instead of copied: the registry labels of every
//! ServiceEntry (`higress-registry-type`, `higress-registry-name`), a
//! WorkloadEntry's port name → port map and its labels, which are the
//! registry endpoint's own shared copy. The type and its interner live in
//! the registries crate (`meshbridge_registries::shared`), whose endpoints
//! share their labels the same way.

pub use meshbridge_registries::shared::{Labels, PortMap, Shared, intern};
