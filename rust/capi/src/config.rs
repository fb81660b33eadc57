//! `npumem_config`: its defaults (those of the Python `Pool`) and its conversion into a
//! validated core configuration plus the pool's placement in memory.

use std::slice;

use npumem_core::{Backing, Error, Placement as ChunkPlacement, PoolConfig};

use crate::object::Location;
use crate::types::{NpumemConfig, BACKING_HOST, BACKING_NONE, PLACEMENT_BEST_FIT, PLACEMENT_FIRST_FIT};

/// DLPack `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// DLPack `kDLExtDev`: memory that no array library can read directly (the default of pools
/// without host memory that do not name their device).
pub const DEVICE_EXT_DEV: i32 = 12;

/// The number of online CPUs (Python's `os.cpu_count()`), at least 1.
fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// The defaults of the Python `Pool` for an arena of `capacity` bytes.
pub fn defaults(capacity: usize) -> NpumemConfig {
    let core = PoolConfig::new(capacity);
    NpumemConfig {
        struct_size: std::mem::size_of::<NpumemConfig>() as u32,
        backing: BACKING_HOST,
        capacity,
        cores: cpu_count(),
        chunk_size: core.chunk_size,
        min_block: core.min_block,
        bank_size: core.bank_size,
        alignment: core.alignment,
        core_reserve: core.core_reserve,
        slab_sizes: std::ptr::null(),
        slab_count: 0,
        placement: PLACEMENT_BEST_FIT,
        device_type: 0,
        device_id: 0,
        base_address: 0,
    }
}

fn bad(field: &'static str, reason: String) -> Error {
    Error::Config { field, reason }
}

/// The core configuration and the placement that `config` describes, every rule checked.
///
/// # Safety
/// `config.slab_sizes` is NULL or points to `config.slab_count` readable `size_t`s.
pub unsafe fn convert(config: &NpumemConfig) -> Result<(PoolConfig, Location), Error> {
    let backing = match config.backing {
        BACKING_HOST => Backing::Host,
        BACKING_NONE => Backing::None,
        other => {
            return Err(bad("backing", format!("must be NPUMEM_BACKING_HOST or NPUMEM_BACKING_NONE, got {other}")))
        }
    };
    let placement = match config.placement {
        PLACEMENT_BEST_FIT => ChunkPlacement::BestFit,
        PLACEMENT_FIRST_FIT => ChunkPlacement::FirstFit,
        other => {
            return Err(bad(
                "placement",
                format!("must be NPUMEM_PLACEMENT_BEST_FIT or NPUMEM_PLACEMENT_FIRST_FIT, got {other}"),
            ))
        }
    };
    let mut core = PoolConfig::new(config.capacity)
        .cores(config.cores)
        .chunk_size(config.chunk_size)
        .min_block(config.min_block)
        .bank_size(config.bank_size)
        .alignment(config.alignment)
        .core_reserve(config.core_reserve)
        .backing(backing)
        .placement(placement);
    if !config.slab_sizes.is_null() {
        // SAFETY: the caller guarantees `slab_count` readable entries.
        core = core.slab_sizes(unsafe { slice::from_raw_parts(config.slab_sizes, config.slab_count) }.to_vec());
    }
    core.validate()?;
    let device_type = match config.device_type {
        0 if backing == Backing::Host => DEVICE_CPU,
        0 => DEVICE_EXT_DEV,
        t if t < 0 => return Err(bad("device", format!("type must be a DLPack device type (>= 1), got {t}"))),
        t => t,
    };
    if config.device_id < 0 {
        return Err(bad("device", format!("index must be at least 0, got {}", config.device_id)));
    }
    if backing == Backing::Host {
        if device_type != DEVICE_CPU || config.device_id != 0 {
            return Err(bad(
                "device",
                format!(
                    "must be the CPU (type 1, index 0) for host-backed pools, got type {device_type} index {}",
                    config.device_id
                ),
            ));
        }
        if config.base_address != 0 {
            return Err(bad(
                "base_address",
                "applies to pools with backing none only (a host pool's address is its mapping)".into(),
            ));
        }
    } else if config.base_address.checked_add(config.capacity as u64).is_none() {
        return Err(bad(
            "base_address",
            format!("plus capacity must fit in 64 bits, got {:#x} + {}", config.base_address, config.capacity),
        ));
    }
    let location = Location { base_address: config.base_address, device_type, device_id: config.device_id };
    Ok((core, location))
}
