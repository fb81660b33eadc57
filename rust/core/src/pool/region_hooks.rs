//! The hooks a pool that grows calls when a region is added (`on_grow`, which may refuse the
//! growth) or given back (`on_trim`); `growth.rs` calls them.

use std::sync::{Arc, RwLock};

/// Called with `(offset, nbytes)` of a region about to be added (`Err`: the growth fails) or
/// given back.
pub type RegionHook = Arc<dyn Fn(usize, usize) -> std::result::Result<(), String> + Send + Sync>;

/// A pool's growth hooks.
#[derive(Default)]
pub(crate) struct GrowthHooks {
    pub(crate) on_grow: RwLock<Option<RegionHook>>,
    pub(crate) on_trim: RwLock<Option<RegionHook>>,
}

impl GrowthHooks {
    pub(crate) fn get(slot: &RwLock<Option<RegionHook>>) -> Option<RegionHook> {
        slot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set(slot: &RwLock<Option<RegionHook>>, hook: Option<RegionHook>) -> Option<RegionHook> {
        std::mem::replace(&mut *slot.write().unwrap_or_else(|p| p.into_inner()), hook)
    }
}
