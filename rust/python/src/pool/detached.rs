//! Blocks whose ownership left Python (`Block.detach()`), until `Pool.adopt(handle)` takes
//! one back. Only a handle listed here can be adopted: a handle that a `Block` still owns, or
//! one adopted already, is refused, so that two objects never own one block.

use std::collections::HashMap;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyString;

/// What a `Block` needs to be made again for a detached handle.
pub(crate) struct DetachedBlock {
    pub(crate) nbytes: usize,
    pub(crate) tag: Option<Py<PyString>>,
    pub(crate) tag_id: u32,
    /// Pins that `pin()` took through the detached object: the adopting object holds them.
    pub(crate) pins: u32,
}

/// A pool's detached blocks, by handle bits.
#[derive(Default)]
pub(crate) struct Detached {
    blocks: Mutex<HashMap<u128, DetachedBlock>>,
}

impl Detached {
    pub(crate) fn insert(&self, handle: u128, block: DetachedBlock) {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).insert(handle, block);
    }

    /// Take the entry of `handle`, if it is detached.
    pub(crate) fn take(&self, handle: u128) -> Option<DetachedBlock> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).remove(&handle)
    }
}
