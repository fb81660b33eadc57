//! `npumem_config`: its defaults (those of the Python `Pool`) and its conversion into a
//! validated core configuration plus the pool's placement in memory.

use std::slice;

use npumem_core::{Backing, Device, Error, Placement as ChunkPlacement, PoolConfig, MAX_SLAB_CLASSES};

use crate::object::Location;
use crate::types::{NpumemConfig, BACKING_HOST, BACKING_NONE, PLACEMENT_BEST_FIT, PLACEMENT_FIRST_FIT};

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
        run_tails: u32::from(core.run_tails),
    }
}

fn bad(field: &'static str, reason: String) -> Error {
    Error::Config { field, reason }
}

/// The core configuration and the location that `config` describes, every rule checked (the
/// base address of a host pool is known once its memory is mapped).
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
    if config.slab_sizes.is_null() {
        if config.slab_count != 0 {
            return Err(bad(
                "slab_sizes",
                format!(
                    "is NULL with slab_count {}: NULL asks for the default classes and needs slab_count 0",
                    config.slab_count
                ),
            ));
        }
    } else {
        if config.slab_count > MAX_SLAB_CLASSES {
            return Err(bad(
                "slab_sizes",
                format!("must have at most {MAX_SLAB_CLASSES} entries, got slab_count {}", config.slab_count),
            ));
        }
        // SAFETY: the caller guarantees `slab_count` readable entries (at most
        // `MAX_SLAB_CLASSES`).
        core = core.slab_sizes(unsafe { slice::from_raw_parts(config.slab_sizes, config.slab_count) }.to_vec());
    }
    core = core.base_address(config.base_address);
    core = match config.run_tails {
        0 => core.run_tails(false),
        1 => core.run_tails(true),
        other => return Err(bad("run_tails", format!("must be 0 or 1, got {other}"))),
    };
    if config.device_type != 0 {
        core = core.device(Device { type_code: config.device_type, index: config.device_id });
    } else if config.device_id != 0 {
        return Err(bad("device", format!("index {} needs a device type", config.device_id)));
    }
    core.validate()?;
    let device = core.resolved_device();
    let location = Location { base_address: core.base_address, device_type: device.type_code, device_id: device.index };
    Ok((core, location))
}
