//! Scratch arrays for the rare paths (a failing allocation, its error) that would otherwise
//! allocate on the heap: a heap allocation there cost a microsecond or more in a process whose
//! allocator gives memory back to the system between calls (glibc trims the top of its heap),
//! about as much as the walk it served. [`InlineVec`] holds at most `N` values on the stack;
//! [`ScratchWords`] holds bitmap words over the chunks, on the stack for arenas of up to
//! [`INLINE_WORDS`] words of chunks, on the heap beyond.

use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};

/// Up to `N` values of a `Copy` type, on the stack; only the first `len` are ever written.
pub(crate) struct InlineVec<T, const N: usize> {
    items: [MaybeUninit<T>; N],
    len: usize,
}

impl<T: Copy, const N: usize> InlineVec<T, N> {
    /// `len` copies of `value` (`len` at most `N`).
    #[inline]
    pub(crate) fn filled(len: usize, value: T) -> InlineVec<T, N> {
        assert!(len <= N, "{len} values do not fit an inline array of {N}");
        let mut items = [const { MaybeUninit::uninit() }; N];
        for item in &mut items[..len] {
            item.write(value);
        }
        InlineVec { items, len }
    }
}

impl<T, const N: usize> Deref for InlineVec<T, N> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` items were written by `filled` (and `T` is `Copy`: nothing
        // to drop).
        unsafe { std::slice::from_raw_parts(self.items.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T, const N: usize> DerefMut for InlineVec<T, N> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`.
        unsafe { std::slice::from_raw_parts_mut(self.items.as_mut_ptr().cast::<T>(), self.len) }
    }
}

/// Bitmap words over the chunks kept on the stack: 16,384 chunks (32 GiB of 2 MiB chunks) in
/// 2 KiB.
pub(crate) const INLINE_WORDS: usize = 256;

/// Bitmap words over the chunks: on the stack up to [`INLINE_WORDS`], else on the heap.
// The inline variant is large on purpose: it is what keeps the words off the heap.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ScratchWords {
    Inline(InlineVec<u64, INLINE_WORDS>),
    Heap(Vec<u64>),
}

impl ScratchWords {
    /// `len` words, each `value`.
    #[inline]
    pub(crate) fn filled(len: usize, value: u64) -> ScratchWords {
        match len <= INLINE_WORDS {
            true => ScratchWords::Inline(InlineVec::filled(len, value)),
            false => ScratchWords::Heap(vec![value; len]),
        }
    }
}

impl Deref for ScratchWords {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            ScratchWords::Inline(words) => words,
            ScratchWords::Heap(words) => words,
        }
    }
}

impl DerefMut for ScratchWords {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            ScratchWords::Inline(words) => words,
            ScratchWords::Heap(words) => words,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn scratch_words_hold_what_a_vec_would_on_the_stack_or_the_heap() {
        for len in [0, 1, 8, INLINE_WORDS, INLINE_WORDS + 1, 5000] {
            let mut words = ScratchWords::filled(len, 7);
            assert_eq!(matches!(words, ScratchWords::Inline(_)), len <= INLINE_WORDS);
            assert_eq!(&*words, &vec![7u64; len][..]);
            if len > 0 {
                words[len - 1] = 9;
                assert_eq!(words[len - 1], 9);
            }
        }
        let v: InlineVec<u32, 4> = InlineVec::filled(3, 1);
        assert_eq!(&*v, &[1, 1, 1]);
    }

    #[test]
    #[should_panic(expected = "do not fit")]
    fn an_inline_vec_refuses_more_than_it_holds() {
        let _: InlineVec<u8, 2> = InlineVec::filled(3, 0);
    }
}
