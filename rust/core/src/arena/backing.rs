//! The optional host memory behind the arena: one anonymous private mapping, aligned to the
//! chunk size (so every chunk, bank and buddy block is aligned in memory as its offset is).
//! Pages are committed lazily by the kernel on first touch (`MAP_NORESERVE`). A pool that can
//! grow maps its whole offset space once: a new region needs no remap, so addresses stay valid,
//! and a region trimmed away gives its pages back (`discard`).

use crate::error::{Error, Result};
use std::ptr::NonNull;

pub(crate) struct HostBacking {
    /// Start of the whole mapping (for `munmap`).
    mapping: NonNull<u8>,
    mapped: usize,
    /// The aligned arena inside it.
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain memory owned by the backing; concurrent access to disjoint blocks
// is the allocator's guarantee, and callers of `base` take responsibility for aliasing.
unsafe impl Send for HostBacking {}
// SAFETY: as above.
unsafe impl Sync for HostBacking {}

impl HostBacking {
    /// Map `len` bytes aligned to `align` (a power of two).
    pub(crate) fn new(len: usize, align: usize) -> Result<HostBacking> {
        let page = 4096usize.max(align.min(1 << 30));
        let mapped = len
            .checked_add(align)
            .and_then(|n| n.checked_next_multiple_of(page))
            .ok_or_else(|| Error::Backing(format!("{len} bytes cannot be mapped")))?;
        if crate::util::failpoint::fire("host.backing") {
            return Err(Error::Backing(format!("mmap of {mapped} bytes failed: failpoint host.backing")));
        }
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::Backing(format!("mmap of {mapped} bytes failed: {}", std::io::Error::last_os_error())));
        }
        let mapping = NonNull::new(ptr as *mut u8).expect("mmap never returns null on success");
        let skew = (align - (ptr as usize) % align) % align;
        // SAFETY: skew < align and mapped >= len + align, so base..base+len is inside the mapping.
        let base = unsafe { mapping.add(skew) };
        // Transparent huge pages where the kernel offers them on request: a pool touches its
        // arena all over (blocks are scattered, compaction copies between far places), and
        // 2 MiB pages spare most TLB misses (a full compaction copies about 1.4x faster).
        // Only advice: without THP nothing changes.
        // SAFETY: the range is the mapping just made.
        unsafe { libc::madvise(mapping.as_ptr().cast(), mapped, libc::MADV_HUGEPAGE) };
        Ok(HostBacking { mapping, mapped, base })
    }

    /// The arena's first byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Give the pages of `[offset, offset + len)` back to the host (a region trimmed away): the
    /// address space stays reserved, and reads see zeros until the pages are touched again.
    pub(crate) fn discard(&self, offset: usize, len: usize) {
        // SAFETY: the range lies inside the mapping (a region of the arena), and no block lives
        // there (the region was withdrawn from the global pool first).
        unsafe { libc::madvise(self.base.as_ptr().add(offset).cast(), len, libc::MADV_DONTNEED) };
    }
}

impl Drop for HostBacking {
    fn drop(&mut self) {
        // SAFETY: the mapping came from mmap with exactly this start and length.
        unsafe { libc::munmap(self.mapping.as_ptr().cast(), self.mapped) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_writable() {
        let b = HostBacking::new(8 << 20, 2 << 20).unwrap();
        assert_eq!(b.base().as_ptr() as usize % (2 << 20), 0);
        // SAFETY: inside the mapping, no other user.
        unsafe {
            b.base().as_ptr().write_bytes(0xAB, 4096);
            b.base().as_ptr().add((8 << 20) - 1).write(7);
            assert_eq!(*b.base().as_ptr().add(4095), 0xAB);
        }
    }
}
