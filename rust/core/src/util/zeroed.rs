//! Large tables that start at zero, from zeroed memory: the kernel commits their pages only when
//! first touched, so a table sized for the whole arena costs memory only where it is used (and
//! a lookup is one indexed load, with no segment to find first).

use crate::util::sync::AtomicU64;

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

/// `n` values, all zero.
pub(crate) fn table<T: Zeroable>(n: usize) -> Box<[T]> {
    #[cfg(not(loom))]
    {
        if n == 0 || std::mem::size_of::<T>() == 0 {
            // SAFETY: zero-sized requests: a dangling, well-aligned pointer is a valid empty or
            // zero-sized slice, and `T` is valid when zeroed (there are no bytes).
            return unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(std::ptr::NonNull::<T>::dangling().as_ptr(), n))
            };
        }
        let layout = std::alloc::Layout::array::<T>(n).expect("a table that fits the address space");
        // SAFETY: the layout has a non-zero size; all-zero bytes are a valid `T` (`Zeroable`);
        // the box frees with the same layout it was allocated with.
        unsafe {
            let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n))
        }
    }
    #[cfg(loom)]
    {
        (0..n).map(|_| T::default()).collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::util::sync::{AtomicU64, Ordering};

    #[test]
    fn zero_and_writable() {
        let table: Box<[AtomicU64]> = super::table(1 << 20);
        assert!(table.iter().step_by(4097).all(|a| a.load(Ordering::Relaxed) == 0));
        table[12345].store(7, Ordering::Relaxed);
        assert_eq!(table[12345].load(Ordering::Relaxed), 7);
        assert!(super::table::<AtomicU64>(0).is_empty());
    }
}
