//! npumem-core
pub fn version() -> &'static str { env!("CARGO_PKG_VERSION") }
