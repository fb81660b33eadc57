//! Tables that start at zero and cost host memory only where they are used.
//!
//! A pool's metadata is sized for the whole arena (a tree per chunk, a directory entry per slab
//! granule), but a pool rarely touches more than a small part of it. A [`Zeroed`] table of more
//! than [`MAPPED_FROM`] bytes is an anonymous private mapping with `MAP_NORESERVE`: the kernel
//! reserves address space only and backs a page with memory when it is first written, so an
//! empty 1 TiB pool costs almost nothing. Smaller tables come from the global allocator. Either
//! way the table is one contiguous slice: a lookup is one indexed load, as with a `Box<[T]>`.
//!
//! Making a table never aborts: a size that overflows, a mapping the kernel refuses or an
//! allocation that fails is `Error::HostMemory`, naming the table (failpoint `host.table`).
//! Small tables built from values come from `util/grow.rs` (failpoint `host.vec`).

use std::ops::Deref;

use crate::error::{Error, Result};
use crate::util::failpoint;
use crate::util::sync::{AtomicU64, Ordering};

/// Tables of at least this many bytes are mapped; smaller ones are allocated.
pub(crate) const MAPPED_FROM: usize = 64 << 10;

/// Types whose all-zero bytes are a valid value: atomics, and structs made only of them.
///
/// # Safety
/// An implementor must be valid when every byte of it is zero, and need no `Drop`.
#[cfg(not(loom))]
pub(crate) unsafe trait Zeroable {}

/// Under loom, atomics are not plain memory: tables are built from `Default` values instead.
///
/// # Safety
/// As without loom.
#[cfg(loom)]
pub(crate) unsafe trait Zeroable: Default {}

// SAFETY: `AtomicU64` has the representation of `u64`, for which zero is valid.
unsafe impl Zeroable for AtomicU64 {}

/// `n` values of `T`, all zero (see the module documentation).
pub(crate) struct Zeroed<T: Zeroable> {
    #[cfg(not(loom))]
    ptr: std::ptr::NonNull<T>,
    #[cfg(not(loom))]
    len: usize,
    #[cfg(loom)]
    values: Box<[T]>,
}

// SAFETY: the table owns its values like a `Box<[T]>` does.
unsafe impl<T: Zeroable + Send> Send for Zeroed<T> {}
// SAFETY: as above; shared access hands out `&T` only.
unsafe impl<T: Zeroable + Sync> Sync for Zeroed<T> {}

impl<T: Zeroable> Zeroed<T> {
    /// `n` zero values; `what` names the table in the error when host memory runs out.
    pub(crate) fn new(n: usize, what: &'static str) -> Result<Zeroed<T>> {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).ok_or(Error::HostMemory { what, bytes: usize::MAX })?;
        if failpoint::fire("host.table") {
            return Err(Error::HostMemory { what, bytes });
        }
        #[cfg(not(loom))]
        {
            let ptr = if bytes == 0 {
                std::ptr::NonNull::<T>::dangling()
            } else if bytes >= MAPPED_FROM {
                map_zeroed(bytes).ok_or(Error::HostMemory { what, bytes })?.cast()
            } else {
                let layout = std::alloc::Layout::array::<T>(n).map_err(|_| Error::HostMemory { what, bytes })?;
                // SAFETY: the layout has a non-zero size.
                let raw = unsafe { std::alloc::alloc_zeroed(layout) };
                std::ptr::NonNull::new(raw.cast()).ok_or(Error::HostMemory { what, bytes })?
            };
            Ok(Zeroed { ptr, len: n })
        }
        #[cfg(loom)]
        {
            let _ = bytes;
            Ok(Zeroed { values: (0..n).map(|_| T::default()).collect() })
        }
    }

    /// Bytes of this table the host has committed (pages resident in memory).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        let bytes = self.bytes();
        if bytes < MAPPED_FROM {
            return bytes;
        }
        let page = 4096;
        let mut pages = vec![0u8; bytes.div_ceil(page)];
        // SAFETY: the range is this table's mapping, and `pages` has a byte per page.
        let rc = unsafe { libc::mincore(self.ptr.as_ptr().cast(), bytes, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().filter(|&&p| p & 1 != 0).count() * page
    }

    #[cfg(not(loom))]
    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

/// `bytes` (non-zero) of fresh zero pages, reserved but not committed.
#[cfg(not(loom))]
fn map_zeroed(bytes: usize) -> Option<std::ptr::NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return None;
    }
    std::ptr::NonNull::new(ptr.cast())
}

impl<T: Zeroable> Deref for Zeroed<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        #[cfg(not(loom))]
        {
            // SAFETY: `ptr` holds `len` zero-initialized (hence valid, `Zeroable`) values that
            // live as long as `self`.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }
        #[cfg(loom)]
        {
            &self.values
        }
    }
}

impl<T: Zeroable> Drop for Zeroed<T> {
    fn drop(&mut self) {
        #[cfg(not(loom))]
        {
            let bytes = self.bytes();
            if bytes == 0 {
                return;
            }
            if bytes >= MAPPED_FROM {
                // SAFETY: mapped by `map_zeroed` with exactly this start and length.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), bytes) };
            } else {
                let layout = std::alloc::Layout::array::<T>(self.len).expect("the layout it was allocated with");
                // SAFETY: allocated by `alloc_zeroed` with this layout; `T` needs no drop.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
            }
        }
    }
}

/// Give the pages under `words` memory of their own now, by a write: for words that are zero
/// and that no other thread uses yet (a chunk's tree and summaries when the chunk is first
/// granted), before anything reads them.
///
/// A page of a mapped table whose first access is a read is mapped to the host's shared zero
/// page; the first write then replaces that mapping, and in a process with several threads the
/// replacement interrupts every other CPU that runs one of them (a TLB shootdown). A write
/// first avoids both. It is a plain store of zero to the first word and to each word that starts
/// a page: an atomic read-modify-write that changes nothing (`fetch_or(0)`) is compiled to a
/// load on x86, which maps the zero page.
pub(crate) fn back_with_writes(words: &[AtomicU64]) {
    const PAGE: usize = 4096;
    let Some(first) = words.first() else { return };
    first.store(0, Ordering::Relaxed);
    // Under loom a table is a boxed slice with no pages to back, and a count of stores that
    // followed its heap address would make the models' schedules differ from run to run.
    if cfg!(loom) {
        return;
    }
    // Then the word that starts each later page.
    let size = std::mem::size_of::<AtomicU64>();
    let to_next_page = (PAGE - words.as_ptr() as usize % PAGE) % PAGE;
    for word in words.iter().skip(to_next_page / size).step_by(PAGE / size) {
        word.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::util::sync::{AtomicU64, Ordering};

    #[test]
    fn zero_and_writable_small_and_mapped() {
        for n in [1usize, 100, MAPPED_FROM / 8, 1 << 20] {
            let table: Zeroed<AtomicU64> = Zeroed::new(n, "test").unwrap();
            assert_eq!(table.len(), n);
            assert!(table.iter().step_by(4097).all(|a| a.load(Ordering::Relaxed) == 0));
            table[n - 1].store(7, Ordering::Relaxed);
            assert_eq!(table[n - 1].load(Ordering::Relaxed), 7);
        }
        assert!(Zeroed::<AtomicU64>::new(0, "test").unwrap().is_empty());
    }

    /// Bytes of private memory (`Rss` in `/proc/self/smaps`) of the mapping that starts at
    /// `at`: a page mapped to the shared zero page counts none.
    fn private_bytes_of_mapping_at(at: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let start = line.split_once('-').and_then(|(a, _)| usize::from_str_radix(a, 16).ok());
            if let Some(start) = start.filter(|_| !line.starts_with(|c: char| c.is_ascii_uppercase())) {
                inside = start == at;
            } else if inside && line.starts_with("Rss:") {
                let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
                return kib << 10;
            }
        }
        panic!("no mapping starts at {at:#x}");
    }

    #[test]
    fn words_backed_with_writes_have_pages_of_their_own_even_after_a_read() {
        const PAGE: usize = 4096;
        const PAGES: usize = 16;
        // A mapping of its own between two inaccessible pages (so that the kernel does not merge
        // it with a neighbouring one, whose pages `Rss` would count).
        let all = (PAGES + 2) * PAGE;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), all, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(base, libc::MAP_FAILED);
        let at = base as usize + PAGE;
        // SAFETY: the middle pages lie in the mapping just made.
        let rc = unsafe { libc::mprotect(at as *mut libc::c_void, PAGES * PAGE, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(rc, 0);
        // SAFETY: readable and writable zero pages, `AtomicU64`s of zero, alive until the unmap.
        let words: &[AtomicU64] = unsafe { std::slice::from_raw_parts(at as *const AtomicU64, PAGES * PAGE / 8) };
        // Reads map the zero page: no memory of its own.
        assert!(words.iter().step_by(PAGE / 8).all(|w| w.load(Ordering::Relaxed) == 0));
        assert_eq!(private_bytes_of_mapping_at(at), 0, "reads commit nothing");
        // Words from the middle of page 3 to the middle of page 9: pages 3 to 9, seven pages.
        back_with_writes(&words[3 * 512 + 100..9 * 512 + 100]);
        assert_eq!(private_bytes_of_mapping_at(at), 7 * PAGE);
        assert!(words.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        // SAFETY: the mapping made above; `words` is not used after.
        unsafe { libc::munmap(base, all) };
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        let err = Zeroed::<AtomicU64>::new(usize::MAX / 4, "huge").err().unwrap();
        assert!(matches!(err, Error::HostMemory { what: "huge", .. }), "{err:?}");
        // Address space no kernel maps (2^62 bytes): refused by mmap, not fatal.
        let err = Zeroed::<AtomicU64>::new(1 << 59, "vast").err().unwrap();
        assert!(matches!(err, Error::HostMemory { what: "vast", .. }), "{err:?}");
    }

    #[test]
    fn an_empty_mapped_table_costs_no_memory() {
        let before = rss_bytes();
        let table: Zeroed<AtomicU64> = Zeroed::new(1 << 30, "test").unwrap(); // 8 GiB reserved
        table[12345].store(1, Ordering::Relaxed);
        // Other tests run meanwhile: the bound only tells lazy pages from committed ones.
        let grown = rss_bytes().saturating_sub(before);
        assert!(grown < 1 << 30, "an 8 GiB table with one entry used grew RSS by {grown} bytes");
    }

    /// The resident set of this process.
    pub(crate) fn rss_bytes() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}
