//! What a block below a bank reserves: every size from 1 B to 4 KiB, at the default alignment
//! and at a few explicit ones, takes at most 9/8 of what it asks for, or the size rounded up to
//! its alignment where that is more (a block starts on a multiple of its alignment, so a 65-byte
//! request aligned to 64 cannot take less than 128 bytes without breaking its neighbour's
//! alignment).

use npumem_core::{Backing, Pool, PoolConfig};

fn reserved(p: &Pool, size: usize, align: Option<usize>) -> usize {
    let h = p.alloc(size, align, 0).unwrap_or_else(|e| panic!("{size} bytes aligned to {align:?}: {e}"));
    let info = p.block(h).unwrap();
    assert_eq!(info.offset % info.align, 0, "{size} bytes: offset {} not aligned to {}", info.offset, info.align);
    p.free(h).unwrap();
    info.block_bytes
}

#[test]
fn below_a_bank_a_block_reserves_at_most_an_eighth_more_or_its_aligned_size() {
    let p = Pool::new(PoolConfig::new(64 << 20).cores(1).backing(Backing::None)).unwrap();
    let bank = p.config().bank_size;
    let default_align = p.config().alignment;
    for align in [None, Some(8), Some(16), Some(256), Some(1024)] {
        let a = align.unwrap_or(default_align);
        let mut worst = (0.0f64, 0usize, 0usize);
        for size in 1..=bank {
            let r = reserved(&p, size, align);
            let bound = (size * 9).div_ceil(8).max(size.next_multiple_of(a));
            assert!(r >= size && r <= bound, "{size} bytes aligned to {a} reserve {r}, more than {bound}");
            let over_aligned = r as f64 / size.next_multiple_of(a) as f64;
            if over_aligned > worst.0 {
                worst = (over_aligned, size, r);
            }
        }
        eprintln!(
            "alignment {a}: worst reserved / aligned size {:.4} ({} bytes reserve {})",
            worst.0, worst.1, worst.2
        );
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}
