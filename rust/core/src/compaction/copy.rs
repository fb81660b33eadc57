//! Copying a block's bytes on host memory. Compaction copies many blocks of a few KiB to
//! places that are not in cache: with ordinary stores every destination line is first read
//! (read for ownership), a third of the traffic for nothing. Non-temporal stores skip that
//! read (about 1.5x faster for scattered 4-64 KiB copies on the machines measured, see
//! BENCHMARKS.md); they need a store fence before the data is published.
//!
//! Forward copying in 64-byte steps is correct when the destination lies at or below the
//! source (each step reads its bytes before any later step can overwrite them) or does not
//! overlap it; a destination above an overlapping source goes through `ptr::copy` (memmove).

/// Copies at least this long use non-temporal stores.
const STREAM_FROM: usize = 1024;

/// Copy `len` bytes from `src` to `dst` (they may overlap, as `ptr::copy`).
///
/// # Safety
/// Both ranges must be valid for `len` bytes, and nobody else may touch them meanwhile.
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    let forward = (dst as usize) <= (src as usize) || (src as usize) + len <= (dst as usize);
    if len < STREAM_FROM || !forward {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy(src, dst, len) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract; forward order is correct here (see the module doc).
        unsafe { stream_forward(src, dst, len) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy(src, dst, len) };
    }
}

/// Make every non-temporal store so far visible before what follows (re-pointing handles).
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions (SSE, part of x86_64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(target_arch = "x86_64")]
unsafe fn stream_forward(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // Head: up to the first 16-byte aligned destination byte.
    let head = (16 - (dst as usize) % 16) % 16;
    // SAFETY: `head < 16 <= len`; a forward copy of the head reads it before the body writes.
    unsafe { std::ptr::copy(src, dst, head) };
    let mut i = head;
    while i + 64 <= len {
        // SAFETY: `[i, i + 64)` is inside both ranges; the destination is 16-byte aligned; the
        // four loads happen before the four stores, and later steps only write higher bytes of
        // the destination, which lie at or below the bytes they read.
        unsafe {
            let a = _mm_loadu_si128(src.add(i) as *const __m128i);
            let b = _mm_loadu_si128(src.add(i + 16) as *const __m128i);
            let c = _mm_loadu_si128(src.add(i + 32) as *const __m128i);
            let d = _mm_loadu_si128(src.add(i + 48) as *const __m128i);
            _mm_stream_si128(dst.add(i) as *mut __m128i, a);
            _mm_stream_si128(dst.add(i + 16) as *mut __m128i, b);
            _mm_stream_si128(dst.add(i + 32) as *mut __m128i, c);
            _mm_stream_si128(dst.add(i + 48) as *mut __m128i, d);
        }
        i += 64;
    }
    // SAFETY: the tail `[i, len)` is inside both ranges.
    unsafe { std::ptr::copy(src.add(i), dst.add(i), len - i) };
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn copies_like_memmove_in_every_overlap() {
        let n = 1 << 16;
        for (src, dst, len) in
            [(0, 8192, 5000), (5000, 3, 20_000), (100, 37, 4096), (4096, 0, 30_000), (7, 7 + 2048, 1500)]
        {
            let mut a: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            let mut b = a.clone();
            // SAFETY: ranges inside the buffers.
            unsafe {
                copy(a.as_ptr().add(src), a.as_mut_ptr().add(dst), len);
                std::ptr::copy(b.as_ptr().add(src), b.as_mut_ptr().add(dst), len);
            }
            fence();
            assert_eq!(a, b, "src {src} dst {dst} len {len}");
            b.clear();
        }
    }
}
