//! The pause of compaction on a large fragmented pool, printed as a table:
//!
//! * a host-backed pool of `CAPACITY` (default 1 GiB) is filled with blocks of log-uniform
//!   sizes (64 B to 30 KiB), every byte written; a random selection is freed until `LIVE`
//!   blocks (default 100,000) remain: about 50% occupancy, free space in holes everywhere;
//! * **full**: the time the pool stays paused for a full compaction, against one `memmove` of
//!   the live bytes in the same run (target: at most 1.3x). By default the compaction is staged:
//!   planned before the pause (`stage_compaction`), then checked and moved inside it
//!   (`run_staged`); with `STAGED=0` it is planned inside the pause (`compact_step`);
//! * **incremental**: steps of at most `max_bytes` until a step moves nothing; the longest
//!   single pause and the median.
//!
//! `cargo run --release -p npumem-benches --example compaction_pause [CAPACITY_MIB] [LIVE] [RUNS] [INCREMENTAL=1] [STAGED=1]`

use std::time::{Duration, Instant};

use npumem_benches::{cli, Rng};
use npumem_core::{CompactionMode, Handle, Pool, PoolConfig};

const MIB: usize = 1 << 20;

struct Fragmented {
    pool: Pool,
    live: Vec<Handle>,
    live_bytes: usize,
}

/// Blocks of log-uniform sizes (64 B to 30 KiB) until the arena is full, every byte written,
/// then a random selection freed until `live` blocks remain (about half of them: half the
/// arena).
fn fragmented(capacity: usize, live: usize, seed: u64) -> Fragmented {
    let pool = Pool::new(PoolConfig::new(capacity).cores(2)).unwrap();
    let mut rng = Rng::new(seed);
    let hi = 30 << 10;
    let mut blocks = Vec::with_capacity(3 * live);
    let page = vec![0x5Au8; hi];
    while blocks.len() < 3 * live {
        let size = rng.size(64, hi);
        match pool.alloc(size, None, 0) {
            Ok(h) => {
                pool.write(h, 0, &page[..size]).unwrap();
                blocks.push((h, size));
            }
            Err(_) => break,
        }
    }
    // Shuffle, free all but `live`.
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, (rng.next_u64() as usize) % (i + 1));
    }
    let keep = blocks.split_off(blocks.len().saturating_sub(live));
    for (h, _) in blocks {
        pool.free(h).unwrap();
    }
    let live_bytes = keep.iter().map(|&(_, s)| s).sum();
    Fragmented { pool, live: keep.into_iter().map(|(h, _)| h).collect(), live_bytes }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn memmove(bytes: usize) -> Duration {
    let src = vec![0xA5u8; bytes];
    let mut dst = vec![0x5Au8; bytes];
    let runs: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            // SAFETY: both buffers hold `bytes` bytes.
            unsafe { std::ptr::copy(src.as_ptr(), dst.as_mut_ptr(), bytes) };
            std::hint::black_box(&dst);
            t.elapsed()
        })
        .collect();
    median(runs)
}

fn main() {
    const USAGE: &str = "compaction_pause [MIB] [LIVE] [RUNS] [INCREMENTAL 0|1] [STAGED 0|1]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 5);
    let capacity = cli::positional(USAGE, &args, 0, "MIB", 16..=1 << 20, 1024) * MIB;
    let live = cli::positional(USAGE, &args, 1, "LIVE", 1..=100_000_000, 100_000);
    let runs = cli::positional(USAGE, &args, 2, "RUNS", 1..=1000, 3);
    let incremental = cli::positional(USAGE, &args, 3, "INCREMENTAL", 0..=1, 1) != 0;
    let staged = cli::positional(USAGE, &args, 4, "STAGED", 0..=1, 1) != 0;
    println!(
        "pool {} MiB, target {live} live blocks, {runs} run(s), {}",
        capacity / MIB,
        if staged { "planned before the pause (staged)" } else { "planned inside the pause" }
    );

    let mut pauses = Vec::new();
    let mut baseline = Vec::new();
    for run in 0..runs {
        let f = fragmented(capacity, live, 1 + run as u64);
        let before = f.pool.stats();
        let move_live = memmove(f.live_bytes);
        let (done, paused) = if staged {
            let plan = f.pool.stage_compaction(&CompactionMode::Full, false).unwrap();
            let started = Instant::now();
            let token = f.pool.pause(Duration::from_secs(10)).unwrap();
            let done = f.pool.run_staged(&token, plan, None).unwrap();
            f.pool.resume(&token).unwrap();
            (done, started.elapsed())
        } else {
            let started = Instant::now();
            let token = f.pool.pause(Duration::from_secs(10)).unwrap();
            let done = f.pool.compact_step(&token, &CompactionMode::Full, None).unwrap();
            f.pool.resume(&token).unwrap();
            (done, started.elapsed())
        };
        let after = f.pool.stats();
        f.pool.check().unwrap();
        println!(
            "full run {run}: {} live blocks, {} MiB live ({:.0}% of usable in blocks), fragmentation {:.3} -> {:.3}, \
             largest free {} -> {} MiB; moved {} blocks, {} MiB in {} batches ({} stale); pause {} (planning {}, \
             checking {}, moving {}); memmove of the live bytes {}; ratio {:.2}",
            f.live.len(),
            f.live_bytes / MIB,
            100.0 * before.bytes_in_use as f64 / before.usable_capacity as f64,
            before.external_fragmentation,
            after.external_fragmentation,
            before.largest_free_block / MIB,
            after.largest_free_block / MIB,
            done.blocks,
            done.bytes / MIB,
            done.batches,
            done.stale,
            ms(paused),
            ms(done.planning),
            ms(done.checking),
            ms(done.moving),
            ms(move_live),
            paused.as_secs_f64() / move_live.as_secs_f64(),
        );
        // Free bytes no live block can use: a buddy block larger than a bank starts on a bank
        // boundary, so the rest of its last bank stays free between packed blocks (only blocks
        // of at most a bank fit there, and those live in slabs).
        let bank = f.pool.config().bank_size;
        let gaps: usize = f
            .pool
            .blocks()
            .expect("host memory for the list of blocks")
            .iter()
            .filter(|b| b.block_bytes > bank && b.block_bytes <= f.pool.config().chunk_size / 2)
            .map(|b| b.block_bytes.next_multiple_of(bank) - b.block_bytes)
            .sum();
        println!(
            "  after: {} MiB free, {} MiB of it in the largest block; bank-rule gaps {} MiB ({:.0}% of the free bytes)",
            after.bytes_free / MIB,
            after.largest_free_block / MIB,
            gaps / MIB,
            100.0 * gaps as f64 / after.bytes_free as f64
        );
        pauses.push(paused);
        baseline.push(move_live);
    }
    let (p, b) = (median(pauses), median(baseline));
    println!(
        "full: median pause {} vs median memmove of the live bytes {}: {:.2}x (target <= 1.3x)",
        ms(p),
        ms(b),
        p.as_secs_f64() / b.as_secs_f64()
    );

    for max_bytes in [MIB, 4 * MIB, 16 * MIB].into_iter().filter(|_| incremental) {
        let f = fragmented(capacity, live, 7);
        let before = f.pool.stats();
        let mut steps = Vec::new();
        let (mut blocks, mut bytes) = (0, 0);
        for _ in 0..5000 {
            let mode = CompactionMode::Incremental { max_bytes };
            let plan = staged.then(|| f.pool.stage_compaction(&mode, false).unwrap());
            let started = Instant::now();
            let token = f.pool.pause(Duration::from_secs(10)).unwrap();
            let done = match plan {
                Some(plan) => f.pool.run_staged(&token, plan, None).unwrap(),
                None => f.pool.compact_step(&token, &mode, None).unwrap(),
            };
            f.pool.resume(&token).unwrap();
            steps.push(started.elapsed());
            blocks += done.blocks;
            bytes += done.bytes;
            if done.blocks == 0 {
                break;
            }
        }
        let after = f.pool.stats();
        f.pool.check().unwrap();
        let longest = *steps.iter().max().unwrap();
        println!(
            "incremental max_bytes {} MiB: {} steps, longest pause {}, median {}; moved {} blocks, {} MiB; \
             fragmentation {:.3} -> {:.3}, largest free {} -> {} MiB",
            max_bytes / MIB,
            steps.len(),
            ms(longest),
            ms(median(steps.clone())),
            blocks,
            bytes / MIB,
            before.external_fragmentation,
            after.external_fragmentation,
            before.largest_free_block / MIB,
            after.largest_free_block / MIB,
        );
    }
}
