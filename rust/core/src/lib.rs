//! npumem-core
pub mod packing;

pub fn version() -> &'static str { env!("CARGO_PKG_VERSION") }
