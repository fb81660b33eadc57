//! The validated pool configuration.

use crate::device::Device;
use crate::error::{Error, Result};

/// Where the arena's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Real host memory behind the arena (an aligned anonymous mapping): bytes can be read,
    /// written and moved.
    Host,
    /// Offsets only: the bytes live elsewhere (device memory); npumem never touches them.
    None,
}

/// How the global pool places chunk runs among its free runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The smallest free run that fits (keeps large holes large).
    BestFit,
    /// The lowest-addressed free run that fits.
    FirstFit,
}

/// The largest number of per-core pools a pool may have.
pub const MAX_CORES: usize = 1024;
/// The largest `core_reserve` a pool of at most this many chunks may have (a larger arena may
/// reserve up to its number of chunks).
pub const MAX_CORE_RESERVE: usize = 1024;
/// The deepest buddy tree a chunk may have (`chunk_size / min_block <= 2^MAX_TREE_DEPTH`).
pub const MAX_TREE_DEPTH: u32 = 24;
/// The largest capacity (2^48 bytes = 256 TiB): offsets fit comfortably in 64 bits.
pub const MAX_CAPACITY: usize = 1 << 48;
/// The most chunks an arena may span (`capacity / chunk_size`, with growth twice
/// `max_capacity`): its per-chunk metadata is reserved, and a check reads a chunk's state,
/// whatever the chunk holds. 2^30 chunks is 256 TiB of 256 KiB chunks.
pub const MAX_CHUNKS: usize = 1 << 30;
/// The most slab size classes a pool may have (a class index fits a byte in the slab metadata,
/// with one value left for "no slab").
pub const MAX_SLAB_CLASSES: usize = 255;

/// A value per slab class of a pool, on the stack. A failing allocation's error reads these
/// (its free bytes), and a heap allocation on that path cost 1-2 us when the process's
/// allocator had just given its heap top back to the system: more than the reading.
pub(crate) type ClassTable<T> = smallvec::SmallVec<[T; MAX_SLAB_CLASSES]>;
/// Classes per doubling of the default slab sizes: a request takes at most 1/8 more bytes than
/// it asked for.
pub const SLAB_CLASSES_PER_DOUBLING: usize = 8;
/// The largest default slab size (the default bank).
const DEFAULT_LARGEST_SLAB: usize = 4096;

/// A pool's configuration. [`PoolConfig::new`] gives the defaults of `docs/design.md`;
/// [`PoolConfig::validate`] checks every rule and names the field that broke one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Bytes in the arena.
    pub capacity: usize,
    /// Number of per-core pools.
    pub cores: usize,
    /// The unit the global pool grants to cores (power of two).
    pub chunk_size: usize,
    /// The smallest buddy block (power of two, >= 64).
    pub min_block: usize,
    /// Banks split the arena; a block of at most `bank_size` never straddles a bank boundary,
    /// a larger one starts on one (power of two, <= `chunk_size`).
    pub bank_size: usize,
    /// The default alignment of a block's offset (power of two).
    pub alignment: usize,
    /// Slab size classes (strictly increasing, positive, at most `bank_size`, at most
    /// [`MAX_SLAB_CLASSES`] of them); the default is [`PoolConfig::default_slab_sizes`].
    pub slab_sizes: Vec<usize>,
    /// Host memory behind the arena, or none.
    pub backing: Backing,
    /// How the global pool places chunk runs.
    pub placement: Placement,
    /// Whether a block past a chunk is its whole chunks and a *tail* of buddy nodes at the
    /// start of the next chunk (at most 1/16 over the request, `arena/tail.rs`) where whole
    /// chunks alone would waste more than 1/32 of it, instead of whole chunks only. On by
    /// default; off, a block of 2 MiB + 1 B takes two chunks of 2 MiB.
    pub run_tails: bool,
    /// Fully free chunks a core keeps before it returns further ones to the global pool (at
    /// most [`MAX_CORE_RESERVE`], or the arena's number of chunks if that is larger).
    pub core_reserve: usize,
    /// The address of offset 0, for pools with [`Backing::None`] (a host pool's address is its
    /// mapping, so it must be 0 there). Blocks report `base_address + offset`.
    pub base_address: u64,
    /// The device the memory lives on; `None`: the CPU for host pools, [`Device::EXT_DEV`]
    /// otherwise.
    pub device: Option<Device>,
    /// The most bytes the pool may grow to (`None`: `capacity`, no growth). A pool that can grow
    /// starts with one region of `capacity` bytes and adds regions when an allocation cannot be
    /// served otherwise (see `arena/regions.rs`); `capacity` must then be a multiple of
    /// `chunk_size`.
    pub max_capacity: Option<usize>,
    /// The least bytes one growth adds (rounded up to whole chunks; `None`: `capacity`). A
    /// growth that would leave less than this before `max_capacity` adds that rest too.
    pub grow_by: Option<usize>,
}

impl PoolConfig {
    /// The defaults of `docs/design.md` for an arena of `capacity` bytes on one core.
    pub fn new(capacity: usize) -> Self {
        PoolConfig {
            capacity,
            cores: 1,
            chunk_size: 2 << 20,
            min_block: 256,
            bank_size: 4096,
            alignment: 64,
            slab_sizes: PoolConfig::default_slab_sizes(),
            backing: Backing::Host,
            placement: Placement::BestFit,
            run_tails: true,
            core_reserve: 1,
            base_address: 0,
            device: None,
            max_capacity: None,
            grow_by: None,
        }
    }

    /// Let the pool grow up to `max_capacity` bytes, by at least `grow_by` bytes at a time.
    pub fn growth(mut self, max_capacity: usize, grow_by: Option<usize>) -> Self {
        self.max_capacity = Some(max_capacity);
        self.grow_by = grow_by;
        self
    }

    /// Whether the pool may add regions (a `max_capacity` above `capacity`).
    pub fn grows(&self) -> bool {
        self.max_capacity.is_some_and(|max| max > self.capacity)
    }

    /// The most bytes the pool's regions may hold together.
    pub fn limit(&self) -> usize {
        self.max_capacity.unwrap_or(self.capacity).max(self.capacity)
    }

    /// The offset space of the arena: `capacity` for a pool that cannot grow; for one that can,
    /// twice `max_capacity` in whole chunks, so that regions separated by one absent chunk
    /// (and regions given back and added again) always find offsets. Offsets cost metadata
    /// address space only (`util/zeroed.rs`), no memory.
    pub fn offset_space(&self) -> usize {
        match self.grows() {
            true => 2 * self.limit().div_ceil(self.chunk_size) * self.chunk_size,
            false => self.capacity,
        }
    }

    /// The default slab size classes, 80 of them: every size from 1 to 16 bytes, then
    /// `SLAB_CLASSES_PER_DOUBLING` (8) evenly spaced classes per doubling up to 4096 bytes
    /// (18, 20, ..., 32, 36, ..., 64, 72, ..., 3840, 4096). A request of `n <= 4096` bytes takes
    /// at most `n * 9 / 8` bytes, and each class is a multiple of its step, so a request aligned
    /// beyond its first class's natural alignment lands on `n` rounded up to the alignment.
    pub fn default_slab_sizes() -> Vec<usize> {
        let per = SLAB_CLASSES_PER_DOUBLING;
        let mut sizes: Vec<usize> = (1..=2 * per).collect();
        let mut low = 2 * per;
        while low < DEFAULT_LARGEST_SLAB {
            let step = low / per;
            sizes.extend((1..=per).map(|i| low + i * step));
            low *= 2;
        }
        sizes
    }

    /// Set the number of per-core pools.
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = cores;
        self
    }

    /// Set the chunk size.
    pub fn chunk_size(mut self, chunk_size: usize) -> Self {
        self.chunk_size = chunk_size;
        self
    }

    /// Set the smallest buddy block.
    pub fn min_block(mut self, min_block: usize) -> Self {
        self.min_block = min_block;
        self
    }

    /// Set the bank size.
    pub fn bank_size(mut self, bank_size: usize) -> Self {
        self.bank_size = bank_size;
        self
    }

    /// Set the default alignment.
    pub fn alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }

    /// Set the slab size classes.
    pub fn slab_sizes(mut self, slab_sizes: Vec<usize>) -> Self {
        self.slab_sizes = slab_sizes;
        self
    }

    /// Set the backing.
    pub fn backing(mut self, backing: Backing) -> Self {
        self.backing = backing;
        self
    }

    /// Set the global pool's placement rule.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Serve blocks past a chunk as whole chunks and a tail (see [`PoolConfig::run_tails`]).
    pub fn run_tails(mut self, on: bool) -> Self {
        self.run_tails = on;
        self
    }

    /// Set the per-core reserve of fully free chunks.
    pub fn core_reserve(mut self, core_reserve: usize) -> Self {
        self.core_reserve = core_reserve;
        self
    }

    /// Set the address of offset 0 (pools without host memory).
    pub fn base_address(mut self, base_address: u64) -> Self {
        self.base_address = base_address;
        self
    }

    /// Set the device the memory lives on.
    pub fn device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// The device, with the default of the backing filled in.
    pub fn resolved_device(&self) -> Device {
        match (self.device, self.backing) {
            (Some(device), _) => device,
            (None, Backing::Host) => Device::CPU,
            (None, Backing::None) => Device::EXT_DEV,
        }
    }

    /// Check every rule; the error names the first field that broke one, and why.
    pub fn validate(&self) -> Result<()> {
        fn bad(field: &'static str, reason: String) -> Result<()> {
            Err(Error::Config { field, reason })
        }
        fn power_of_two(field: &'static str, value: usize) -> Result<()> {
            if value == 0 || !value.is_power_of_two() {
                return bad(field, format!("must be a power of two, got {value}"));
            }
            Ok(())
        }
        if self.capacity == 0 {
            return bad("capacity", "must be greater than 0, got 0".into());
        }
        if self.capacity > MAX_CAPACITY {
            return bad("capacity", format!("must be at most 2^48 bytes, got {}", self.capacity));
        }
        if self.cores == 0 || self.cores > MAX_CORES {
            return bad("cores", format!("must be between 1 and {MAX_CORES}, got {}", self.cores));
        }
        power_of_two("chunk_size", self.chunk_size)?;
        power_of_two("min_block", self.min_block)?;
        power_of_two("bank_size", self.bank_size)?;
        power_of_two("alignment", self.alignment)?;
        if self.chunk_size > MAX_CAPACITY {
            return bad("chunk_size", format!("must be at most 2^48 bytes, got {}", self.chunk_size));
        }
        if self.min_block < 64 {
            return bad("min_block", format!("must be at least 64, got {}", self.min_block));
        }
        if self.min_block > self.chunk_size / 2 {
            return bad(
                "min_block",
                format!("must be at most half of chunk_size ({}), got {}", self.chunk_size, self.min_block),
            );
        }
        if (self.chunk_size / self.min_block).trailing_zeros() > MAX_TREE_DEPTH {
            return bad(
                "chunk_size",
                format!(
                    "must be at most 2^{MAX_TREE_DEPTH} times min_block ({}), got {}",
                    self.min_block, self.chunk_size
                ),
            );
        }
        if self.capacity < self.min_block {
            return bad(
                "capacity",
                format!(
                    "must be at least min_block ({} bytes) for any block to fit, got {}",
                    self.min_block, self.capacity
                ),
            );
        }
        // After the capacity has room for a block: a capacity too small for any block is named
        // as such, not through the default alignment.
        if self.alignment > self.capacity {
            return bad(
                "alignment",
                format!("must be at most the capacity ({} bytes), got {}", self.capacity, self.alignment),
            );
        }
        if self.bank_size > self.chunk_size {
            return bad(
                "bank_size",
                format!("must be at most chunk_size ({}), got {}", self.chunk_size, self.bank_size),
            );
        }
        if self.slab_sizes.len() > MAX_SLAB_CLASSES {
            return bad(
                "slab_sizes",
                format!("must have at most {MAX_SLAB_CLASSES} entries, got {}", self.slab_sizes.len()),
            );
        }
        let mut previous = 0usize;
        for (i, &size) in self.slab_sizes.iter().enumerate() {
            if size == 0 {
                return bad("slab_sizes", format!("entry {i} must be positive, got 0"));
            }
            if size <= previous {
                return bad(
                    "slab_sizes",
                    format!("must be strictly increasing, entry {i} ({size}) follows {previous}"),
                );
            }
            if size > self.bank_size {
                return bad("slab_sizes", format!("entry {i} ({size}) must be at most bank_size ({})", self.bank_size));
            }
            previous = size;
        }
        // The growth rules first: a max_capacity beyond its own bound is named as such, not
        // as too many chunks.
        self.validate_growth()?;
        let chunks = self.capacity.div_ceil(self.chunk_size);
        let spanned = match self.max_capacity {
            Some(max) => max.saturating_mul(2).div_ceil(self.chunk_size),
            None => chunks,
        };
        if spanned > MAX_CHUNKS {
            let (size, named) = match self.max_capacity {
                Some(max) => (max.saturating_mul(2), "twice max_capacity"),
                None => (self.capacity, "capacity"),
            };
            return bad(
                "chunk_size",
                format!(
                    "must be at least {} here, got {}: {size} bytes ({named}) make {spanned} chunks, and \
                     an arena has at most {MAX_CHUNKS}",
                    size.div_ceil(MAX_CHUNKS).next_power_of_two(),
                    self.chunk_size,
                ),
            );
        }
        if self.core_reserve > chunks.max(MAX_CORE_RESERVE) {
            return bad(
                "core_reserve",
                format!(
                    "must be at most {MAX_CORE_RESERVE} or the number of chunks in the arena ({chunks}), got {}",
                    self.core_reserve
                ),
            );
        }
        if let Some(&largest) = self.slab_sizes.last() {
            if largest > self.chunk_size / 2 {
                return bad(
                    "chunk_size",
                    format!("must be at least twice the largest slab size ({largest}), got {}", self.chunk_size),
                );
            }
        }
        self.validate_location()
    }

    /// The rules of `max_capacity` and `grow_by`.
    fn validate_growth(&self) -> Result<()> {
        fn bad(field: &'static str, reason: String) -> Result<()> {
            Err(Error::Config { field, reason })
        }
        if let Some(max) = self.max_capacity {
            if max < self.capacity {
                return bad(
                    "max_capacity",
                    format!("must be at least the capacity ({} bytes), got {max}", self.capacity),
                );
            }
            if max > MAX_CAPACITY / 2 {
                return bad("max_capacity", format!("must be at most 2^47 bytes, got {max}"));
            }
        }
        if let Some(step) = self.grow_by {
            if step == 0 {
                return bad("grow_by", "must be greater than 0, got 0".into());
            }
            if self.max_capacity.is_none() {
                return bad("grow_by", "applies only with a max_capacity".into());
            }
        }
        if self.grows() && self.capacity % self.chunk_size != 0 {
            return bad(
                "capacity",
                format!(
                    "must be a multiple of chunk_size ({} bytes) for a pool that can grow, got {}",
                    self.chunk_size, self.capacity
                ),
            );
        }
        // Regions are whole chunks: a limit between two multiples could only be passed or
        // left short of.
        if let Some(max) = self.max_capacity.filter(|_| self.grows()) {
            if max % self.chunk_size != 0 {
                return bad(
                    "max_capacity",
                    format!(
                        "must be a multiple of chunk_size ({} bytes) for a pool that can grow, got {max}",
                        self.chunk_size
                    ),
                );
            }
        }
        Ok(())
    }

    /// The rules of `base_address` and `device`.
    fn validate_location(&self) -> Result<()> {
        fn bad(field: &'static str, reason: String) -> Result<()> {
            Err(Error::Config { field, reason })
        }
        let device = self.resolved_device();
        if device.type_code < 1 {
            return bad("device", format!("type must be a DLPack device type (>= 1), got {}", device.type_code));
        }
        if device.index < 0 {
            return bad("device", format!("index must be at least 0, got {}", device.index));
        }
        match self.backing {
            Backing::Host if device != Device::CPU => bad(
                "device",
                format!(
                    "must be (\"cpu\", 0) for pools with host memory, got ({:?}, {})",
                    device.type_name().unwrap_or("?"),
                    device.index
                ),
            ),
            Backing::Host if self.base_address != 0 => bad(
                "base_address",
                format!(
                    "applies to pools with backing none only (a host pool's address is its mapping), got {:#x}",
                    self.base_address
                ),
            ),
            Backing::None if self.base_address.checked_add(self.offset_space() as u64).is_none() => bad(
                "base_address",
                format!(
                    "plus the arena's offsets must fit in 64 bits, got {:#x} + {}",
                    self.base_address,
                    self.offset_space()
                ),
            ),
            _ => Ok(()),
        }
    }

    /// The largest slab size class (0 when there are none).
    pub fn largest_slab(&self) -> usize {
        self.slab_sizes.last().copied().unwrap_or(0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn field_of(config: &PoolConfig) -> &'static str {
        match config.validate() {
            Err(Error::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        PoolConfig::new(800 << 20).cores(16).validate().unwrap();
        PoolConfig::new(256).validate().unwrap();
    }

    #[test]
    fn an_arena_spans_at_most_max_chunks() {
        let small = |capacity: usize| PoolConfig::new(capacity).chunk_size(8 << 10).bank_size(4 << 10).min_block(256);
        small(MAX_CHUNKS * (8 << 10)).validate().unwrap();
        let too_many = small(MAX_CHUNKS * (8 << 10) + 1);
        assert_eq!(field_of(&too_many), "chunk_size");
        let message = too_many.validate().unwrap_err().to_string();
        assert!(message.contains("must be at least 16384 here, got 8192"), "{message}");
        // With growth, the arena spans twice max_capacity.
        assert_eq!(field_of(&small(1 << 20).growth(MAX_CHUNKS * (4 << 10) + (8 << 10), None)), "chunk_size");
        small(1 << 20).growth(MAX_CHUNKS * (4 << 10), None).validate().unwrap();
    }

    #[test]
    fn powers_of_two_near_the_top_of_the_word_are_refused_by_their_own_field() {
        let base = PoolConfig::new(1 << 20);
        assert_eq!(field_of(&base.clone().min_block(1 << 63)), "min_block");
        assert_eq!(field_of(&base.clone().chunk_size(1 << 63)), "chunk_size");
        assert_eq!(field_of(&base.clone().chunk_size(1 << 49)), "chunk_size");
        let huge = PoolConfig::new(MAX_CAPACITY).chunk_size(MAX_CAPACITY).min_block(1 << 40).bank_size(MAX_CAPACITY);
        assert_eq!(field_of(&huge.clone().slab_sizes(vec![1 << 63])), "slab_sizes");
        assert_eq!(field_of(&huge.clone().bank_size(1 << 63).slab_sizes(vec![1 << 63])), "bank_size");
        let everything_huge = huge.clone().chunk_size(1 << 63).bank_size(1 << 63).slab_sizes(vec![1 << 63]);
        assert_eq!(field_of(&everything_huge), "chunk_size");
        huge.slab_sizes(vec![MAX_CAPACITY / 2]).validate().unwrap();
        // A max_capacity beyond its bound is named, however many chunks it would make.
        assert_eq!(field_of(&PoolConfig::new(4 << 20).growth(1 << 52, None)), "max_capacity");
        assert_eq!(field_of(&PoolConfig::new(64 << 20).growth(usize::MAX, None)), "max_capacity");
    }

    #[test]
    fn a_capacity_too_small_for_any_block_is_named_before_the_default_alignment() {
        for capacity in [1, 63, 255] {
            let error = PoolConfig::new(capacity).validate().unwrap_err().to_string();
            assert_eq!(field_of(&PoolConfig::new(capacity)), "capacity", "{error}");
            assert!(error.contains("must be at least min_block (256 bytes)"), "{error}");
        }
        assert_eq!(field_of(&PoolConfig::new(4096).alignment(8192)), "alignment");
    }

    #[test]
    fn a_pool_that_grows_has_a_max_capacity_of_whole_chunks() {
        let base = PoolConfig::new(64 << 20);
        for max in [(64 << 20) + 1, 65 << 20, (100 << 20) + 1] {
            let error = base.clone().growth(max, None).validate().unwrap_err().to_string();
            assert_eq!(field_of(&base.clone().growth(max, None)), "max_capacity", "{error}");
            assert!(error.contains("must be a multiple of chunk_size (2097152 bytes)"), "{error}");
        }
        base.clone().growth(66 << 20, None).validate().unwrap();
        // A limit at the capacity is no growth: any capacity goes.
        PoolConfig::new((3 << 20) + 5).growth((3 << 20) + 5, None).validate().unwrap();
    }

    #[test]
    fn every_rule_names_its_field() {
        let base = PoolConfig::new(64 << 20);
        assert_eq!(field_of(&PoolConfig { capacity: 0, ..base.clone() }), "capacity");
        assert_eq!(field_of(&base.clone().cores(0)), "cores");
        assert_eq!(field_of(&base.clone().chunk_size(3 << 20)), "chunk_size");
        assert_eq!(field_of(&base.clone().min_block(32)), "min_block");
        assert_eq!(field_of(&base.clone().min_block(384)), "min_block");
        assert_eq!(field_of(&base.clone().bank_size(3000)), "bank_size");
        assert_eq!(field_of(&base.clone().bank_size(4 << 20)), "bank_size");
        assert_eq!(field_of(&base.clone().alignment(48)), "alignment");
        assert_eq!(field_of(&base.clone().alignment(0)), "alignment");
        assert_eq!(field_of(&base.clone().slab_sizes(vec![64, 64])), "slab_sizes");
        assert_eq!(field_of(&base.clone().slab_sizes(vec![64, 60])), "slab_sizes");
        assert_eq!(field_of(&base.clone().slab_sizes(vec![0])), "slab_sizes");
        assert_eq!(field_of(&base.clone().slab_sizes((1..=256).collect())), "slab_sizes");
        base.clone().slab_sizes((1..=255).collect()).validate().unwrap();
        base.clone().slab_sizes(vec![1, 3, 100, 1000]).validate().unwrap();
        assert_eq!(field_of(&base.clone().slab_sizes(vec![8192])), "slab_sizes");
        assert_eq!(field_of(&base.clone().chunk_size(4096).bank_size(4096).min_block(64)), "chunk_size");
        assert_eq!(field_of(&base.clone().core_reserve(1025)), "core_reserve");
        assert_eq!(field_of(&base.clone().core_reserve(1 << 33)), "core_reserve");
        base.clone().core_reserve(1024).validate().unwrap();
        PoolConfig::new(4 << 30).core_reserve(2048).validate().unwrap();
        assert_eq!(field_of(&PoolConfig::new(4 << 30).core_reserve(2049)), "core_reserve");
        assert_eq!(field_of(&base.clone().base_address(4096)), "base_address");
        assert_eq!(field_of(&base.clone().device(Device { type_code: 2, index: 0 })), "device");
        let none = base.clone().backing(Backing::None);
        assert_eq!(field_of(&none.clone().base_address(u64::MAX - 4096)), "base_address");
        assert_eq!(field_of(&none.clone().device(Device { type_code: 0, index: 0 })), "device");
        assert_eq!(field_of(&none.clone().device(Device { type_code: 2, index: -1 })), "device");
        none.clone().base_address(1 << 40).device(Device { type_code: 2, index: 1 }).validate().unwrap();
        assert_eq!(none.resolved_device(), Device::EXT_DEV);
        assert_eq!(base.resolved_device(), Device::CPU);
    }

    #[test]
    fn default_slab_sizes_are_fine_and_exact_for_tiny_sizes() {
        let sizes = PoolConfig::default_slab_sizes();
        assert_eq!(sizes.len(), 80);
        assert_eq!(&sizes[..18], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20]);
        assert_eq!(&sizes[sizes.len() - 3..], &[3584, 3840, 4096]);
        assert!(sizes.windows(2).all(|w| w[0] < w[1] && w[1] * 8 <= (w[0] + 1) * 9));
    }

    #[test]
    fn messages_say_what_was_expected() {
        let err = PoolConfig::new(1 << 20).alignment(48).validate().unwrap_err();
        assert_eq!(err.to_string(), "invalid pool configuration: alignment must be a power of two, got 48");
    }
}
