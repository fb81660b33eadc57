//! The structs of `npumem.h`, laid out as C lays them out. Field order and types must match the
//! header exactly; `tests/c` compiles the header and checks `sizeof` against these.

use npumem_core::Handle;

/// `npumem_backing`: real host memory behind the arena.
pub const BACKING_HOST: u32 = 0;
/// `npumem_backing`: offsets only; the bytes live elsewhere (device memory).
pub const BACKING_NONE: u32 = 1;
/// `npumem_placement`: the smallest free run that fits.
pub const PLACEMENT_BEST_FIT: u32 = 0;
/// `npumem_placement`: the lowest-addressed free run that fits.
pub const PLACEMENT_FIRST_FIT: u32 = 1;

/// `npumem_config`: what `npumem_pool_create` builds. Fill it with `npumem_config_init`
/// (the defaults of the Python `Pool`), then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NpumemConfig {
    /// `sizeof(npumem_config)` as the caller compiled it (set by `npumem_config_init`).
    pub struct_size: u32,
    /// `NPUMEM_BACKING_HOST` or `NPUMEM_BACKING_NONE`.
    pub backing: u32,
    pub capacity: usize,
    pub cores: usize,
    pub chunk_size: usize,
    pub min_block: usize,
    pub bank_size: usize,
    pub alignment: usize,
    pub core_reserve: usize,
    /// The slab size classes; NULL keeps the defaults, a non-NULL pointer with count 0 means none.
    pub slab_sizes: *const usize,
    pub slab_count: usize,
    /// `NPUMEM_PLACEMENT_BEST_FIT` or `NPUMEM_PLACEMENT_FIRST_FIT`.
    pub placement: u32,
    /// The DLPack device type (`kDLCPU` = 1, `kDLCUDA` = 2, ...) and index of the memory.
    pub device_type: i32,
    pub device_id: i32,
    /// The address of offset 0 (backing none only; host pools report their mapping).
    pub base_address: u64,
    /// 1 (default): a block past a chunk is whole chunks and a tail; 0: whole chunks only.
    pub run_tails: u32,
}

/// `npumem_handle`: a block reference that survives moves and detects reuse.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NpumemHandle {
    pub pool_id: u32,
    pub slot: u32,
    pub generation: u32,
    pub reserved: u32,
}

impl NpumemHandle {
    /// The core's handle, or None when the reserved field is not 0: npumem writes 0 there, so
    /// such a struct is not a handle npumem made (or it was overwritten).
    pub fn to_core(self) -> Option<Handle> {
        (self.reserved == 0).then(|| {
            Handle::from_bits((self.pool_id as u128) << 64 | (self.slot as u128) << 32 | self.generation as u128)
        })
    }

    pub fn from_core(handle: Handle) -> NpumemHandle {
        NpumemHandle { pool_id: handle.pool_id(), slot: handle.slot(), generation: handle.generation(), reserved: 0 }
    }
}

/// `npumem_block`: a block as an allocation returns it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NpumemBlock {
    pub handle: NpumemHandle,
    /// Offset in the arena.
    pub offset: usize,
    /// Bytes asked for.
    pub size: usize,
    /// `base_address + offset`: a host pointer on host pools, a device address otherwise.
    pub address: u64,
}

/// Defines `npumem_stats` from the core's field list (`npumem_core::pool_stats_fields!`): every
/// scalar field of `npumem_core::PoolStats`, in its order and with its doc, plus the copy from a
/// core snapshot and the field names (the header's struct is checked against them).
macro_rules! c_stats_struct {
    ([$(#[$attr:meta])* $name:ident] $($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        $(#[$attr])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub struct $name {
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl $name {
            /// The C view of a core snapshot.
            pub fn from_core(s: &npumem_core::PoolStats) -> $name {
                $name { $($field: s.$field,)* }
            }

            /// The field names, in order.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field),)*];
        }
    };
}

npumem_core::pool_stats_fields!(
    c_stats_struct,
    /// `npumem_stats`: a snapshot of a pool's usage and counters.
    NpumemStats
);

/// `npumem_pool_info`: what a pool is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NpumemPoolInfo {
    pub capacity: usize,
    pub cores: usize,
    pub alignment: usize,
    pub backing: u32,
    pub pool_id: u32,
    pub device_type: i32,
    pub device_id: i32,
    pub base_address: u64,
}
