//! The alignment sweep (as jemalloc's): every power-of-two alignment from 8 to 2^22, with sizes
//! up to three times the alignment, on every path (slab objects, buddy blocks, chunk runs).
//! Every block is aligned, keeps the bank rule, overlaps no other live block and keeps its bytes.
#![cfg(not(loom))]

use npumem_core::{Handle, Pool, PoolConfig};

const MIB: usize = 1 << 20;

#[test]
fn every_alignment_from_8_to_4_mib_with_sizes_up_to_three_times_it() {
    let p = Pool::new(PoolConfig::new(256 * MIB).cores(2)).unwrap();
    let bank = 4096;
    let chunk = 2 * MIB;
    let (mut slab, mut buddy, mut run) = (0, 0, 0);
    for shift in 3..=22 {
        let align = 1usize << shift;
        // Sizes around 1/4, 1/2, 1, 2 and 3 times the alignment, and a few bytes off each.
        let mut sizes: Vec<usize> = Vec::new();
        for base in [align / 4, align / 2, align, 2 * align, 3 * align] {
            for delta in [-1isize, 0, 1] {
                let s = base as isize + delta;
                if s >= 1 && s as usize <= 3 * align {
                    sizes.push(s as usize);
                }
            }
        }
        sizes.extend([1, 7, 8, 63, 64, 65, 4095, 4097]);
        sizes.sort_unstable();
        sizes.dedup();
        let mut live: Vec<(Handle, usize, usize, u8)> = Vec::new();
        for (k, &size) in sizes.iter().enumerate() {
            let h = p.alloc(size, Some(align), 0).unwrap_or_else(|e| panic!("{size} aligned {align}: {e}"));
            let info = p.block(h).unwrap();
            let off = info.offset;
            assert_eq!(off % align, 0, "{size} bytes aligned to {align} at {off}");
            if size <= bank {
                assert_eq!(off / bank, (off + size - 1) / bank, "{size} bytes at {off} straddle a bank");
            } else {
                assert_eq!(off % bank, 0, "{size} bytes at {off} do not start a bank");
            }
            let (ptr, _) = p.host_ptr(h).unwrap();
            // The backing's base is aligned to the chunk size: addresses keep alignments up to it.
            assert_eq!(ptr.as_ptr() as usize % align.min(chunk), 0, "the address keeps the alignment");
            if size <= 4096 && info.block_bytes < 4096.max(size) && info.block_bytes % 256 != 0 {
                slab += 1;
            } else if info.block_bytes > chunk / 2 {
                run += 1;
            } else {
                buddy += 1;
            }
            let pattern = (shift * 31 + k) as u8 | 1;
            p.write(h, 0, &vec![pattern; size]).unwrap();
            for &(_, o, l, _) in &live {
                assert!(
                    off + info.block_bytes <= o || o + l <= off,
                    "[{off}, +{}) overlaps [{o}, +{l})",
                    info.block_bytes
                );
            }
            live.push((h, off, info.block_bytes, pattern));
        }
        for (h, _, _, pattern) in live {
            let size = p.block(h).unwrap().size;
            let mut out = vec![0u8; size];
            p.read(h, 0, &mut out).unwrap();
            assert!(out.iter().all(|&b| b == pattern), "bytes of a block aligned to {align} changed");
            p.free(h).unwrap();
        }
        p.check().unwrap();
    }
    assert!(slab > 0 && buddy > 0 && run > 0, "every path taken: {slab} slab, {buddy} buddy, {run} run");
    assert_eq!(p.stats().bytes_in_use, 0);
}
