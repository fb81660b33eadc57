//! Mixed sizes: what a block of every size reserves (the waste sweep), how full an
//! arena gets before the first failure when filled with random sizes (the fill floors), and
//! placement staying correct through churn at high occupancy.

mod common;

use common::Rng;
use npumem_core::{Backing, CompactionMode, Handle, Move, Pool, PoolConfig, PoolStats};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const CHUNK: usize = 2 * MIB;

fn pool(capacity: usize) -> Pool {
    Pool::new(PoolConfig::new(capacity).cores(1).backing(Backing::None)).unwrap()
}

/// Every size on a log grid (16 steps per doubling) from 1 B to 64 MiB, and each size next to a
/// slab class, a power of two, a trimming granule (1/32 of a power of two), a chunk multiple and
/// a chunk multiple plus a power of two (where a run's tail changes shape).
fn sweep_sizes(classes: &[usize]) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut x = 1.0f64;
    while x <= (64 * MIB) as f64 {
        sizes.push(x as usize);
        x *= 2f64.powf(1.0 / 16.0);
    }
    for &c in classes {
        sizes.extend([c - 1, c, c + 1]);
    }
    for shift in 0..=26 {
        let p = 1usize << shift;
        sizes.extend([p - 1, p, p + 1, p + p / 32 + 1, p + p / 16 + 1, p - p / 32 + 1]);
    }
    for k in 1..=32 {
        sizes.extend([k * CHUNK - 1, k * CHUNK, k * CHUNK + 1]);
        for shift in [8, 12, 16, 20] {
            let p = 1usize << shift;
            sizes.extend([k * CHUNK + p - 1, k * CHUNK + p + 1, k * CHUNK + p + p / 32 + 1, k * CHUNK + CHUNK - p + 1]);
        }
    }
    sizes.retain(|&s| (1..=64 * MIB).contains(&s));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The rest of the last bank of a block of `reserved` bytes larger than a bank (the next block
/// starts on a bank boundary).
fn bank_slack(reserved: usize, bank: usize) -> usize {
    if reserved > bank {
        reserved.next_multiple_of(bank) - reserved
    } else {
        0
    }
}

/// Every size of the sweep, and past it up to the capacity, reserves at most 17/16 of what it
/// asks for, plus the bank slack, from 4 KiB up, on a pool with the default configuration:
/// buddy blocks are trimmed to 1/32 of their enclosing power of two (less than 1/16 of the
/// request), and a block past a chunk is a run of whole chunks and a tail trimmed the same way
/// where whole chunks alone would lose more than 1/32 of it (`PoolConfig::run_tails`, on by
/// default). The worst case per range is printed (`-- --nocapture`), below 4 KiB (slab classes)
/// too.
#[test]
fn waste_is_at_most_a_sixteenth_from_4_kib_up() {
    let capacity = 160 * MIB;
    let p = Pool::new(PoolConfig::new(capacity)).unwrap();
    assert!(p.config().run_tails, "tails are on by default");
    let config = p.config();
    let bank = config.bank_size;
    let classes = config.slab_sizes.clone();
    let ranges = [
        ("1 B - 4 KiB", 1, 4 * KIB - 1),
        ("4 - 64 KiB", 4 * KIB, 64 * KIB - 1),
        ("64 KiB - 1 MiB", 64 * KIB, MIB - 1),
        ("1 - 2 MiB", MIB, CHUNK),
        ("2 - 8 MiB", CHUNK + 1, 8 * MIB),
        ("8 - 64 MiB", 8 * MIB + 1, 64 * MIB),
        ("64 - 160 MiB", 64 * MIB + 1, capacity),
    ];
    let mut worst = [(0.0f64, 0usize, 0usize); 7];
    let mut sizes = sweep_sizes(&classes);
    // Past the sweep, up to the capacity: a chunk multiple, one byte either side, and a quarter
    // chunk past it.
    for k in 33..=capacity / CHUNK {
        sizes.extend([k * CHUNK - 1, k * CHUNK, k * CHUNK + 1, k * CHUNK + CHUNK / 4]);
    }
    sizes.retain(|&s| s <= capacity);
    for size in sizes {
        let h = p.alloc(size, None, 0).unwrap_or_else(|e| panic!("{size} bytes: {e}"));
        let reserved = p.block(h).unwrap().block_bytes;
        assert!(reserved >= size);
        if size >= 4 * KIB {
            assert!(
                reserved <= size + size / 16 + bank_slack(reserved, bank),
                "{size} bytes reserve {reserved} (more than 1/16 over, plus the bank slack)"
            );
        }
        let ratio = reserved as f64 / size as f64;
        let range = ranges.iter().position(|&(_, lo, hi)| (lo..=hi).contains(&size)).unwrap();
        if ratio > worst[range].0 {
            worst[range] = (ratio, size, reserved);
        }
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
    for ((what, _, _), w) in ranges.iter().zip(worst) {
        eprintln!("worst waste {what}: {:.4} ({} bytes reserve {})", w.0, w.1, w.2);
    }
}

/// The 17/16 bound from 4 KiB up is no property of the default configuration alone: with
/// chunks of 512 KiB to 8 MiB, banks of 4 KiB to 256 KiB, smallest blocks of 64 and 256 B and
/// a default alignment of 64 B or 4 KiB, every size on a log grid (24 steps per doubling) up to
/// 24 chunks, next to powers of two and their trimming granules, and next to chunk multiples,
/// reserves at most 17/16 of what it asks for plus the bank slack.
#[test]
fn waste_is_at_most_a_sixteenth_in_every_geometry() {
    for chunk in [MIB / 2, MIB, 8 * MIB] {
        for bank in [4 * KIB, 64 * KIB, 256 * KIB] {
            for (min_block, alignment) in [(64, 64), (256, 4 * KIB)] {
                let capacity = 24 * chunk;
                let config = PoolConfig::new(capacity)
                    .chunk_size(chunk)
                    .bank_size(bank)
                    .min_block(min_block)
                    .alignment(alignment)
                    .backing(Backing::None)
                    .cores(2);
                let p = Pool::new(config).unwrap();
                let geometry = format!("chunk {chunk}, bank {bank}, min block {min_block}, alignment {alignment}");
                let mut sizes = Vec::new();
                let mut x = (4 * KIB) as f64;
                while x <= capacity as f64 {
                    sizes.push(x as usize);
                    x *= 2f64.powf(1.0 / 24.0);
                }
                for shift in 12..usize::BITS - capacity.leading_zeros() {
                    let p = 1usize << shift;
                    sizes.extend([p - 1, p, p + 1, p + p / 32 + 1, p + p / 16 + 1, p - p / 32 + 1]);
                }
                for k in 1..=capacity / chunk {
                    let c = k * chunk;
                    sizes.extend([c - 1, c, c + 1, c + 4 * KIB + 1, c + chunk / 32 + 1, c + chunk / 4 + 1]);
                }
                sizes.retain(|&s| (4 * KIB..=capacity).contains(&s));
                sizes.sort_unstable();
                sizes.dedup();
                for size in sizes {
                    let h = p.alloc(size, None, 0).unwrap_or_else(|e| panic!("{geometry}: {size} bytes: {e}"));
                    let reserved = p.block(h).unwrap().block_bytes;
                    assert!(
                        reserved >= size && reserved <= size + size / 16 + bank_slack(reserved, bank),
                        "{geometry}: {size} bytes reserve {reserved}"
                    );
                    p.free(h).unwrap();
                }
                p.check().unwrap();
                assert_eq!(p.stats().bytes_in_use, 0, "{geometry}");
            }
        }
    }
}

/// The share of the arena requested when the first allocation fails, filling with random sizes
/// of `[lo, hi]` and never freeing.
fn fill(capacity: usize, lo: usize, hi: usize, seed: u64) -> f64 {
    let p = pool(capacity);
    let mut rng = Rng(seed);
    let mut requested = 0usize;
    loop {
        let size = rng.size(lo, hi);
        match p.alloc_raw(size, None) {
            Ok(_) => requested += size,
            Err(_) => break,
        }
    }
    p.check().unwrap();
    requested as f64 / capacity as f64
}

/// Floors on the fill per band (256 MiB, a few seeds each): what this build reaches, so that a
/// change that strands more of the arena fails here. The goal is 95% in every band. Blocks
/// with a front tile the arena (`arena/front.rs`): from 1 to 8 MiB the 98% goal holds; from
/// 4 KiB to 1 MiB, once 27% of the arena is in use, a block that the core's chunks cannot hold
/// takes the free end of a chunk (with a tail in the next) before a fresh chunk is cut, which
/// brings 64 KiB-1 MiB to 0.94 (4-64 KiB stays near 0.87: its holes are mostly inside chunks,
/// shorter than the next request).
#[test]
fn fill_floors_per_band() {
    let bands: [(usize, usize, f64); 4] =
        [(4 * KIB, 64 * KIB, 0.85), (64 * KIB, MIB, 0.93), (MIB, 8 * MIB, 0.98), (64, 8 * MIB, 0.96)];
    for (lo, hi, floor) in bands {
        for seed in [1u64, 7, 12345] {
            let share = fill(256 * MIB, lo, hi, seed);
            eprintln!("fill {lo}-{hi} seed {seed}: {share:.4}");
            assert!(share >= floor, "{lo}-{hi} (seed {seed}): first failure at {share:.4} of the arena, below {floor}");
        }
    }
}

/// The share of the arena requested when the first allocation fails, filling with sizes drawn
/// from `shapes`, equally likely, and never freeing; and the share at which the same sequence
/// would need more than the arena under the bank rule alone (each block of more than a bank in
/// whole banks, each smaller one its share of a bank tiled by its slab class, at the pool's
/// default alignment).
fn fill_shapes(capacity: usize, shapes: &[usize], seed: u64) -> (f64, f64) {
    let p = pool(capacity);
    let config = PoolConfig::new(capacity);
    let (bank, align) = (config.bank_size, config.alignment);
    let cost = |size: usize| -> usize {
        if size > bank {
            return size.next_multiple_of(bank);
        }
        let aligned = size.next_multiple_of(align);
        let class = config.slab_sizes.iter().copied().find(|&c| c >= aligned && c % align == 0).unwrap_or(bank);
        bank / (bank / class)
    };
    let mut rng = Rng(seed);
    let mut next = || shapes[(rng.next() % shapes.len() as u64) as usize];
    let mut sizes = Vec::new();
    loop {
        let size = next();
        sizes.push(size);
        if p.alloc_raw(size, None).is_err() {
            break;
        }
    }
    p.check().unwrap();
    let requested: usize = sizes[..sizes.len() - 1].iter().sum();
    // The same sequence, on until the bank rule alone runs out of room.
    let (mut allowed, mut reserved) = (0usize, 0usize);
    for size in sizes.into_iter().chain(std::iter::repeat_with(next)) {
        reserved += cost(size);
        if reserved > capacity {
            break;
        }
        allowed += size;
    }
    (requested as f64 / capacity as f64, allowed as f64 / capacity as f64)
}

/// A runtime with fixed tensor shapes asks for a few sizes over and over: blocks larger than a
/// bank that are not powers of two must not each strand the rest of their enclosing node (one
/// shape of 70,000 bytes, 72 KiB of a 128 KiB node, once filled the arena to 0.53 where the
/// bank rule allows 0.95). Filled with one to four shapes from 4 KiB to 256 KiB (seeded,
/// sixteen sets, with a few slab sizes beside them in half the sets), the first failure comes
/// after at least `FLOOR` of what the bank rule allows is requested: besides the bank rule,
/// a block loses at most 1/32 of its enclosing node to rounding, and a chunk its last stretch.
#[test]
fn fixed_shapes_fill_the_arena() {
    const FLOOR: f64 = 0.95;
    let mut sets = vec![vec![70_000], vec![256, 3000, 4096, 70_000]];
    let mut rng = Rng(0x5eed_f111);
    for i in 0..16 {
        let mut shapes: Vec<usize> = (0..1 + rng.next() % 4).map(|_| rng.size(4 * KIB + 1, 256 * KIB)).collect();
        if i % 2 == 1 {
            shapes.extend((0..1 + rng.next() % 3).map(|_| rng.size(64, 4 * KIB)));
        }
        sets.push(shapes);
    }
    let mut worst = (f64::INFINITY, Vec::new(), 0.0, 0.0);
    for (i, shapes) in sets.iter().enumerate() {
        let (share, bound) = fill_shapes(256 * MIB, shapes, 1 + i as u64);
        eprintln!("fill {shapes:?}: {share:.4} (the bank rule allows {bound:.4})");
        if share / bound < worst.0 {
            worst = (share / bound, shapes.clone(), share, bound);
        }
    }
    let (ratio, shapes, share, bound) = worst;
    eprintln!("worst: {ratio:.4} of what the bank rule allows, with {shapes:?}");
    assert!(
        ratio >= FLOOR,
        "shapes {shapes:?}: first failure at {share:.4} of the arena, where the bank rule allows {bound:.4}"
    );
}

/// Blocks of a quarter of a chunk to a chunk and more, one size at a time: fewer than four
/// fit in a chunk, so a chunk's rest holds no more of them, and the arena fills only where
/// they tile across chunk ends (blocks with a front, `arena/front.rs`). A block whose bytes
/// fit in a chunk's free end but whose buddy block (rounded to its class) does not takes a
/// front from a later start: 1 MiB + 1 B once filled the arena to 0.51, each block on a fresh
/// chunk's start once the free ends shrank below 1,088 KiB; it must reach `CROSSING`. The
/// others reach `FLOOR` of what the bank rule allows: blocks keep inside chunks until 27% of
/// the arena is in use (so that a compaction can move them out of the chunks it empties), and
/// from 2/3 on a fresh chunk comes before a front, each costing up to a third of a chunk
/// (two blocks of 704 KiB in a chunk leave 640 KiB that none of them fits).
#[test]
fn one_large_shape_fills_the_arena() {
    const FLOOR: f64 = 0.78;
    const CROSSING: f64 = 0.95;
    let mut worst = (f64::INFINITY, 0);
    for size in [524_289, 600_000, 700_000, 900_000, (1 << 20) + 1, 1_100_000, 1_500_000, 2 * MIB - 4096] {
        let (share, bound) = fill_shapes(256 * MIB, &[size], 1);
        eprintln!("fill {size}: {share:.4} (the bank rule allows {bound:.4})");
        if size == (1 << 20) + 1 {
            assert!(
                share / bound >= CROSSING,
                "{size} bytes: first failure at {share:.4}, the bank rule allows {bound:.4}"
            );
        }
        if share / bound < worst.0 {
            worst = (share / bound, size);
        }
    }
    eprintln!("worst: {:.4} of what the bank rule allows, with {}", worst.0, worst.1);
    assert!(worst.0 >= FLOOR, "{} bytes: first failure at {:.4} of what the bank rule allows", worst.1, worst.0);
}

/// Churn at 85% with random sizes: every block placed is inside the arena and disjoint from
/// the others, every failure is an out-of-memory error whose largest free block is too small
/// for the request, failures are few, and the pool checks clean after.
#[test]
fn churn_at_85_percent_stays_consistent() {
    let capacity = 128 * MIB;
    let p = pool(capacity);
    let mut rng = Rng(99);
    let mut held: Vec<(usize, usize)> = Vec::new();
    let mut bytes = 0usize;
    while bytes < capacity * 85 / 100 {
        let size = rng.size(256, MIB);
        match p.alloc_raw(size, None) {
            Ok(o) => {
                held.push((o, size));
                bytes += size;
            }
            Err(_) => break,
        }
    }
    let mut failed = 0;
    for _ in 0..40_000 {
        let i = rng.next() as usize % held.len();
        let (o, s) = held[i];
        p.free_raw(o, s).unwrap();
        let size = rng.size(256, MIB);
        match p.alloc_raw(size, None) {
            Ok(o) => held[i] = (o, size),
            Err(npumem_core::Error::OutOfMemory { requested, largest_free_block, .. }) => {
                assert_eq!(requested, size);
                // The block a request takes is trimmed: at most 1/16 more than it asks for.
                assert!(
                    largest_free_block < size + size / 16,
                    "{size} B refused with a free block of {largest_free_block} B"
                );
                failed += 1;
                held.swap_remove(i);
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Blocks from 64 KiB go to the best-fitting free stretch once no chunk is left to grant.
    eprintln!("churn at 85%: {failed} failed allocations of 40000");
    assert!(failed <= 100, "{failed} failed allocations of 40000 at 85%");
    let mut extents: Vec<(usize, usize)> = held.clone();
    extents.sort_unstable();
    for pair in extents.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{:?} overlaps {:?}", pair[0], pair[1]);
    }
    p.check().unwrap();
    for (o, s) in held {
        p.free_raw(o, s).unwrap();
    }
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// A block a little over a multiple of the chunk is a run and a tail: it reserves one unit
/// past its whole chunks, the rest of the tail's chunk serves other blocks, a raw free of the
/// wrong size changes nothing, and everything frees and checks clean.
#[test]
fn a_run_with_a_tail_shares_its_last_chunk() {
    let p = pool(32 * MIB);
    let h = p.alloc(2 * CHUNK + 1, None, 0).unwrap();
    let run = p.block(h).unwrap();
    assert_eq!(run.block_bytes, 2 * CHUNK + 256);
    assert_eq!(run.offset % CHUNK, 0);
    let stats = p.stats();
    assert_eq!((stats.chunks_in_runs, stats.chunks_in_cores), (2, 1));
    // The tail's chunk is a core chunk: once no other chunk has room, a 1 MiB block goes
    // after the tail.
    let filler = p.alloc(13 * CHUNK, None, 0).unwrap();
    let other = p.alloc(MIB, None, 0).unwrap();
    let at = p.block(other).unwrap().offset;
    assert!(at >= run.offset + 2 * CHUNK && at < run.offset + 3 * CHUNK, "{at}");
    p.free(filler).unwrap();
    p.check().unwrap();
    let snapshot = p.snapshot().unwrap();
    assert!(snapshot.untracked.is_empty(), "{:?}", snapshot.untracked);
    // Raw blocks: a wrong size is refused before anything changes.
    let raw = p.alloc_raw(4 * CHUNK + 5, None).unwrap();
    for wrong in [4 * CHUNK, 4 * CHUNK + MIB, 5 * CHUNK] {
        assert!(p.free_raw(raw, wrong).is_err(), "{wrong}");
    }
    p.free_raw(raw, 4 * CHUNK + 5).unwrap();
    assert!(p.free_raw(raw, 4 * CHUNK + 5).is_err(), "freed already");
    p.free(h).unwrap();
    assert!(p.free(h).is_err(), "a double free is refused");
    p.check().unwrap();
    p.free(other).unwrap();
    p.check().unwrap();
    let stats = p.stats();
    assert_eq!((stats.bytes_in_use, stats.chunks_in_runs), (0, 0));
}

/// In a pool that grows, a run with a tail that finds no room gets a region holding its chunks
/// and its tail's chunk: a block never spans two regions.
#[test]
fn a_run_with_a_tail_lies_inside_one_region() {
    let p = Pool::new(
        PoolConfig::new(4 * MIB).cores(1).backing(Backing::None).run_tails(true).growth(32 * MIB, Some(2 * MIB)),
    )
    .unwrap();
    let first = p.alloc(MIB, None, 0).unwrap();
    let h = p.alloc(2 * CHUNK + 5, None, 0).unwrap();
    assert_eq!(p.stats().regions, 2);
    let b = p.block(h).unwrap();
    assert_eq!(b.block_bytes, 2 * CHUNK + 256);
    let regions = p.regions();
    let inside = |r: &npumem_core::Region| b.offset >= r.offset && b.offset + b.block_bytes <= r.offset + r.bytes;
    assert!(regions.iter().any(inside), "{b:?} is not inside one region of {regions:?}");
    p.check().unwrap();
    p.free(h).unwrap();
    p.free(first).unwrap();
    p.check().unwrap();
}

/// A run with a tail moves with its tail: to whole free chunks followed by a chunk whose start
/// is free (a free chunk is granted for it), its bytes along; a full compaction slides it down.
#[test]
fn a_run_with_a_tail_moves_with_its_tail() {
    let p = Pool::new(PoolConfig::new(32 * MIB).cores(1).run_tails(true)).unwrap();
    let low = p.alloc(4 * CHUNK, None, 0).unwrap();
    let h = p.alloc(2 * CHUNK + 1000, None, 0).unwrap();
    let data: Vec<u8> = (0..2 * CHUNK + 1000).map(|i| (i * 7 + i / 4096) as u8).collect();
    p.write(h, 0, &data).unwrap();
    let token = p.pause(std::time::Duration::from_secs(5)).unwrap();
    p.move_blocks(&token, &[Move { handle: h, to: 10 * CHUNK }], None).unwrap();
    p.check().unwrap();
    p.resume(&token).unwrap();
    assert_eq!(p.block(h).unwrap().offset, 10 * CHUNK);
    p.free(low).unwrap();
    p.compact(&CompactionMode::Full, None, std::time::Duration::from_secs(5)).unwrap();
    p.check().unwrap();
    assert!(p.block(h).unwrap().offset < 10 * CHUNK, "the full compaction slid it down");
    let mut back = vec![0u8; data.len()];
    p.read(h, 0, &mut back).unwrap();
    assert!(back == data, "the bytes moved with the block");
    p.free(h).unwrap();
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// A freed run with a tail leaves its whole chunks free and the start of its tail's chunk free,
/// while other blocks keep that chunk: a block of the same size takes that room again (its tail
/// at the start of the chunk that other blocks share), and the pool counts the room as one
/// free block. Without that, every run with a tail that is freed leaves a hole one chunk too
/// short for its own size.
#[test]
fn a_freed_run_with_a_tail_serves_its_size_again() {
    let p = pool(8 * CHUNK);
    let size = 3 * CHUNK + MIB;
    let first = p.alloc(size, None, 0).unwrap();
    assert_eq!(p.block(first).unwrap().offset, 0);
    // A run takes the other chunks; the rest of the tail's chunk then serves another block.
    let rest = p.alloc(4 * CHUNK, None, 0).unwrap();
    let neighbour = p.alloc(MIB, None, 0).unwrap();
    assert_eq!(p.block(neighbour).unwrap().offset, 3 * CHUNK + MIB);
    p.free(first).unwrap();
    let stats = p.stats();
    assert_eq!(stats.bytes_free, size);
    assert_eq!(stats.largest_free_block, size, "three free chunks and the free start of the fourth");
    let again = p.alloc(size, None, 0).unwrap_or_else(|e| panic!("the hole a run with a tail left: {e}"));
    assert_eq!(p.block(again).unwrap().offset, 0);
    p.check().unwrap();
    for h in [again, neighbour, rest] {
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// Runs with a tail that come and go next to small blocks that stay (an inference service's
/// activation arenas and its KV cache pages): the small blocks settle in chunks of their own,
/// not in the rest of a tail's chunk, so the chunks that freed runs give back join into runs
/// long enough for a large block whenever the free bytes would hold it.
#[test]
fn small_blocks_that_stay_do_not_split_the_runs_of_tails_that_go() {
    let p = pool(48 * CHUNK);
    let mut rng = Rng(2024);
    let page = 192 * KIB;
    let mut pages = std::collections::VecDeque::new();
    let mut arenas = std::collections::VecDeque::new();
    let big = 12 * CHUNK;
    let mut refused = 0;
    for step in 0..3000 {
        let chunks = 1 + rng.next() as usize % 6;
        let size = chunks * CHUNK + 64 * KIB + rng.next() as usize % (MIB + MIB / 2);
        if let Ok(h) = p.alloc(size, None, 0) {
            arenas.push_back(h);
        }
        if arenas.len() > 2 {
            p.free(arenas.pop_front().unwrap()).unwrap();
        }
        if let Ok(h) = p.alloc(page, None, 0) {
            pages.push_back(h);
        }
        if pages.len() > 40 {
            p.free(pages.pop_front().unwrap()).unwrap();
        }
        if step % 10 == 9 {
            let free = p.stats().bytes_free;
            match p.alloc(big, None, 0) {
                Ok(h) => p.free(h).unwrap(),
                Err(_) if free >= big + 4 * CHUNK => refused += 1,
                Err(_) => {}
            }
        }
    }
    p.check().unwrap();
    assert_eq!(refused, 0, "a run of {big} bytes was refused with far more bytes free");
}

/// A full compaction of a pool that holds runs with a tail between small blocks and holes: the
/// runs move with their tails, the pool checks clean, every block keeps its bytes, and the free
/// chunks join into one long run that a large block then takes.
#[test]
fn full_compaction_gathers_runs_with_tails_into_long_free_runs() {
    let p = Pool::new(PoolConfig::new(64 * MIB)).unwrap();
    let mut rng = Rng(77);
    let mut live = Vec::new();
    for i in 0..24 {
        let size = match i % 3 {
            0 => CHUNK + 300 * KIB + rng.next() as usize % (600 * KIB),
            1 => 2 * CHUNK + MIB + rng.next() as usize % (512 * KIB),
            _ => 64 * KIB + rng.next() as usize % (256 * KIB),
        };
        let Ok(h) = p.alloc(size, None, 0) else { break };
        let bytes: Vec<u8> = (0..size).map(|j| (j as u64 * 31 + i as u64) as u8).collect();
        p.write(h, 0, &bytes).unwrap();
        live.push((h, bytes));
    }
    assert!(live.len() > 12, "{} blocks placed", live.len());
    let tailed =
        live.iter().filter(|(h, _)| p.block(*h).unwrap().block_bytes % CHUNK != 0 && p.block(*h).unwrap().size > CHUNK);
    assert!(tailed.count() >= 4, "runs with a tail were placed");
    // Every other block goes: holes between runs, tails and small blocks.
    let (kept, before, after) = free_every_nth_and_compact(&p, live, 2);
    assert!(
        after.largest_free_block > before.largest_free_block
            && after.largest_free_block + 4 * CHUNK >= after.bytes_free,
        "largest free block {} of {} free (before: {} of {})",
        after.largest_free_block,
        after.bytes_free,
        before.largest_free_block,
        before.bytes_free
    );
    let large = p.alloc(after.largest_free_block, None, 0).unwrap();
    p.check().unwrap();
    p.free(large).unwrap();
    for (h, _) in kept {
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// Free every `nth` block of `live` (blocks with the bytes written to them), run a full
/// compaction, and check the pool and that every kept block still holds its bytes. Returns the
/// kept blocks and the statistics before and after the compaction.
fn free_every_nth_and_compact(
    p: &Pool,
    live: Vec<(Handle, Vec<u8>)>,
    nth: usize,
) -> (Vec<(Handle, Vec<u8>)>, PoolStats, PoolStats) {
    let mut kept = Vec::new();
    for (i, entry) in live.into_iter().enumerate() {
        if i % nth == 0 {
            p.free(entry.0).unwrap();
        } else {
            kept.push(entry);
        }
    }
    p.check().unwrap();
    let before = p.stats();
    p.compact(&CompactionMode::Full, None, std::time::Duration::from_secs(5)).unwrap();
    p.check().unwrap();
    let after = p.stats();
    for (h, bytes) in &kept {
        let mut back = vec![0u8; bytes.len()];
        p.read(*h, 0, &mut back).unwrap();
        assert!(back == *bytes, "a block kept its bytes");
    }
    (kept, before, after)
}

/// Whether the block `[offset, +size)` starts inside a chunk and its requested bytes go on past
/// that chunk's end: a block with a front.
fn has_front(offset: usize, size: usize) -> bool {
    offset % CHUNK != 0 && offset % CHUNK + size > CHUNK
}

/// One bit per byte of an arena: which bytes live blocks hold.
struct Bytes(Vec<u64>);

impl Bytes {
    /// Mark `[offset, offset + len)` held (`on`) or free; every byte must have been the other.
    fn set(&mut self, offset: usize, len: usize, on: bool) {
        let end = offset + len;
        for w in offset / 64..end.div_ceil(64) {
            let (lo, hi) = (offset.max(w * 64) - w * 64, end.min(w * 64 + 64) - w * 64);
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            let held = self.0[w] & mask;
            assert_eq!(held, if on { 0 } else { mask }, "[{offset}, +{len}): bytes near {} already {on}", w * 64);
            self.0[w] ^= mask;
        }
    }
}

/// Blocks with a front against a model with one bit per byte: random sizes across chunk
/// boundaries (and smaller blocks between them), allocated and freed in random order at high
/// occupancy, from two cores. Every block lies inside the arena, starts on a bank boundary and
/// overlaps no other block; one with a front reserves its request rounded up to a unit; a raw
/// free of another size past the chunk's end, one from inside the block (where its shape is not
/// that of a block: see below) and a second free are refused and change nothing; blocks with a front are placed (more than a few); the pool checks clean
/// throughout and is whole at the end.
#[test]
fn blocks_with_a_front_against_a_byte_model() {
    let capacity = 96 * MIB;
    let p = Pool::new(PoolConfig::new(capacity).cores(2).backing(Backing::None)).unwrap();
    let mut model = Bytes(vec![0u64; capacity / 64]);
    let mut rng = Rng(4242);
    let mut held: Vec<(npumem_core::Handle, usize, usize, usize)> = Vec::new(); // handle, offset, size, bytes
    let (mut live, mut fronted) = (0usize, 0usize);
    for step in 0..6000 {
        let grow = live < capacity * 80 / 100 && (held.is_empty() || rng.next() % 5 < 3);
        if grow {
            let size = match rng.next() % 4 {
                0 => rng.size(4 * KIB, MIB),
                1 => rng.size(MIB, CHUNK),
                _ => rng.size(CHUNK, 9 * MIB),
            };
            let Ok(h) = p.alloc(size, None, 0) else { continue };
            let b = p.block(h).unwrap();
            let (offset, bytes) = (b.offset, b.block_bytes);
            assert!(offset + bytes <= capacity && bytes >= size, "[{offset}, +{bytes}) for {size}");
            assert_eq!(offset % 4096, 0, "a block past a bank starts on a bank boundary");
            model.set(offset, bytes, true);
            if has_front(offset, size) {
                fronted += 1;
                assert_eq!(bytes, size.next_multiple_of(256), "a block with a front of {size} bytes");
                // Sizes that also cross the chunk's end (a smaller one that ends inside it is
                // taken for a buddy block there, as for any block of several nodes).
                let crossing = CHUNK - offset % CHUNK;
                for wrong in [size + CHUNK, crossing + (size - crossing) / 2, size + 64 * KIB, size + 256] {
                    if wrong > crossing && wrong.div_ceil(256) != size.div_ceil(256) {
                        assert!(p.free_raw(offset, wrong).is_err(), "a free of {wrong} for {size} at {offset}");
                    }
                }
                // From inside: one unit in (no block larger than a bank starts off a bank), and a
                // bank in unless that is the next chunk's start. There the rest of the block lies
                // as the nodes of a buddy block of its own size, which a raw free cannot tell from
                // one (`Pool::free_raw` does not detect a part of a block): a block whose front is
                // one bank gets there, depending on the core pools its calls use.
                assert!(p.free_raw(offset + 256, size - 256).is_err(), "a free from a unit inside the block");
                if (offset + 4096) % CHUNK != 0 {
                    assert!(p.free_raw(offset + 4096, size - 4096).is_err(), "a free from a bank inside the block");
                }
            }
            held.push((h, offset, size, bytes));
            live += bytes;
        } else {
            let i = rng.next() as usize % held.len();
            let (h, offset, size, bytes) = held.swap_remove(i);
            p.free(h).unwrap();
            assert!(p.free(h).is_err(), "a second free of {size} at {offset}");
            assert!(p.free_raw(offset, size).is_err(), "a raw free of {size} at {offset}, freed already");
            model.set(offset, bytes, false);
            live -= bytes;
        }
        if step % 500 == 499 {
            p.check().unwrap();
            assert_eq!(p.stats().bytes_in_use, live);
        }
    }
    assert!(fronted > 20, "only {fronted} blocks with a front were placed");
    for (h, offset, _, bytes) in held.drain(..) {
        p.free(h).unwrap();
        model.set(offset, bytes, false);
    }
    p.check().unwrap();
    let stats = p.stats();
    assert_eq!(stats.bytes_in_use, 0);
    assert_eq!(stats.largest_free_block, capacity, "every chunk went back and joined");
}

/// Blocks with a front move: a full compaction of a pool where they lie between holes moves
/// them (as their size lays out) with their bytes, and checks clean; the free space joins.
#[test]
fn blocks_with_a_front_move_with_their_bytes() {
    let p = Pool::new(PoolConfig::new(64 * MIB).cores(1)).unwrap();
    let mut rng = Rng(31);
    let mut live = Vec::new();
    for i in 0..40 {
        let size = if i % 2 == 0 { rng.size(MIB, CHUNK) } else { rng.size(CHUNK, 5 * MIB) };
        let Ok(h) = p.alloc(size, None, 0) else { break };
        let bytes: Vec<u8> = (0..size).map(|j| (j as u64 * 29 + i as u64) as u8).collect();
        p.write(h, 0, &bytes).unwrap();
        live.push((h, bytes));
    }
    let fronted = live.iter().filter(|(h, b)| has_front(p.block(*h).unwrap().offset, b.len())).count();
    assert!(fronted >= 4, "{fronted} blocks with a front");
    let (kept, before, after) = free_every_nth_and_compact(&p, live, 3);
    assert!(after.largest_free_block > before.largest_free_block, "{before:?} -> {after:?}");
    for (h, _) in kept {
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// Without `run_tails`, no block has a front: a block past a chunk is whole chunks, and one of
/// more than half a chunk a buddy block inside one chunk.
#[test]
fn without_run_tails_no_block_has_a_front() {
    let p = Pool::new(PoolConfig::new(64 * MIB).cores(1).backing(Backing::None).run_tails(false)).unwrap();
    let mut rng = Rng(8);
    let mut placed = 0;
    loop {
        let size = rng.size(MIB, 8 * MIB);
        let Ok(offset) = p.alloc_raw(size, None) else { break };
        assert!(!has_front(offset, size), "{size} bytes at {offset} cross the end of their chunk");
        placed += 1;
    }
    assert!(placed > 8);
    p.check().unwrap();
}
