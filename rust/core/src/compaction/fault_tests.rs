//! Failpoints at every mover call (`mover.wave`, `mover.copy_back`): each compaction and batch
//! is run once to record the calls it makes, then again with each call failing in turn. A
//! failed wave leaves the pool exactly as before: the same blocks at the same places, the same
//! statistics, a clean `check()`, and every byte back at its source. A failed copy back is
//! reported as corruption of the bytes, with the metadata still undone. A host that refuses a
//! compaction its memory (the planning's headroom, `host.headroom`, or a bounce buffer,
//! `host.vec`) gets `Error::HostMemory` and the pool as it was. Copies on host memory that an
//! interrupt ends after any step (`copies.interrupt`) are undone: the pool and every byte as
//! before.

use std::cell::RefCell;

use super::types::{CompactionMode, Move, StepReport, Transfer};
use crate::config::{Backing, PoolConfig};
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::pool::pool::Pool;
use crate::util::failpoint;

const MIB: usize = 1 << 20;
const SIZES: [usize; 8] = [100, 700, 3000, 5000, 20_000, 70_000, 300_000, 3 * MIB];

/// A device pool (`backing="none"`) whose bytes live in `memory`, fragmented, each live block
/// holding its own pattern.
struct Device {
    pool: Pool,
    memory: RefCell<Vec<u8>>,
    kept: Vec<(Handle, usize)>,
}

/// Twelve rounds of blocks of every size in `SIZES` (those that fit), every other one freed:
/// the kept blocks' handles, each with its number for its pattern.
fn fragment(pool: &Pool) -> Vec<(Handle, usize)> {
    let mut all = Vec::new();
    for r in 0..12 {
        for (k, &s) in SIZES.iter().enumerate() {
            if let Ok(h) = pool.alloc(s, None, 0) {
                all.push((h, r * SIZES.len() + k));
            }
        }
    }
    let mut kept = Vec::new();
    for (i, (h, id)) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            pool.free(h).unwrap();
        } else {
            kept.push((h, id));
        }
    }
    kept
}

fn byte(id: usize, i: usize) -> u8 {
    (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8
}

impl Device {
    /// The same device every time (one core).
    fn new() -> Device {
        let capacity = 48 * MIB;
        let pool = Pool::new(PoolConfig::new(capacity).cores(1).backing(Backing::None)).unwrap();
        let mut memory = vec![0u8; capacity];
        let kept = fragment(&pool);
        for &(h, id) in &kept {
            let b = pool.block(h).unwrap();
            for j in 0..b.size {
                memory[b.offset + j] = byte(id, j);
            }
        }
        Device { pool, memory: RefCell::new(memory), kept }
    }

    /// Copy as a device would.
    fn copy(&self, transfers: &[Transfer]) {
        let mut memory = self.memory.borrow_mut();
        for t in transfers {
            memory.copy_within(t.src..t.src + t.len, t.dst);
        }
    }

    fn intact(&self) -> bool {
        let memory = self.memory.borrow();
        self.kept.iter().all(|&(h, id)| {
            let b = self.pool.block(h).unwrap();
            (0..b.size).all(|j| memory[b.offset + j] == byte(id, j))
        })
    }

    /// Everything a failed batch must leave as it was.
    fn state(&self) -> (Vec<(u32, usize, usize)>, usize, usize) {
        let s = self.pool.stats();
        let places = self.pool.blocks().unwrap().iter().map(|b| (b.handle.slot(), b.offset, b.size)).collect();
        (places, s.bytes_in_use, s.largest_free_block)
    }

    /// Run `op` with a mover that copies, failing its own call `fail_call` (if any).
    fn run(&self, op: Op, fail_call: Option<usize>) -> Result<StepReport> {
        let mut calls = 0;
        let mut mover = |ts: &[Transfer]| -> std::result::Result<(), String> {
            calls += 1;
            if fail_call == Some(calls - 1) {
                return Err("the device failed".into());
            }
            self.copy(ts);
            Ok(())
        };
        let p = &self.pool;
        let token = p.pause(std::time::Duration::from_secs(5)).unwrap();
        let done = match op {
            Op::Full => p.compact_step(&token, &CompactionMode::Full, Some(&mut mover)),
            Op::Incremental => {
                p.compact_step(&token, &CompactionMode::Incremental { max_bytes: 4 * MIB }, Some(&mut mover))
            }
            Op::Staged => {
                let staged = p.stage_compaction(&CompactionMode::Full, true).unwrap();
                p.run_staged(&token, staged, Some(&mut mover))
            }
        };
        p.resume(&token).unwrap();
        done
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Full,
    Incremental,
    Staged,
}

#[test]
fn a_failure_at_each_mover_call_leaves_the_pool_exactly_as_before() {
    for op in [Op::Full, Op::Incremental, Op::Staged] {
        let (done, hits) = failpoint::record(|| {
            let d = Device::new();
            let done = d.run(op, None).unwrap();
            assert!(d.intact(), "{op:?}: a working mover keeps every byte");
            done
        });
        let waves = hits.iter().filter(|&&h| h == "mover.wave").count();
        assert!(done.blocks > 0 && waves > 0, "{op:?} moves something, wave by wave");
        for k in 0..waves {
            let d = Device::new();
            let before = d.state();
            let (result, fired) = failpoint::fail_at("mover.wave", k, || d.run(op, None));
            assert!(fired, "{op:?} wave {k}");
            assert!(matches!(result, Err(Error::MoverFailed(_))), "{op:?} wave {k}: {result:?}");
            assert_eq!(d.state(), before, "{op:?} wave {k}: the pool is as it was");
            d.pool.check().unwrap();
            assert!(d.intact(), "{op:?} wave {k}: every byte is back at its source");
        }
    }
}

#[test]
fn a_failed_copy_back_is_reported_and_the_metadata_is_still_undone() {
    let (_, hits) = failpoint::record(|| Device::new().run(Op::Full, None).unwrap());
    let waves = hits.iter().filter(|&&h| h == "mover.wave").count();
    assert!(waves >= 2, "a full compaction of this device takes several waves");
    // The mover fails its last wave; then each copy back of the waves before fails in turn,
    // at every try.
    for j in 0..waves - 1 {
        let d = Device::new();
        let before = d.state();
        let (result, fired) = failpoint::fail_from("mover.copy_back", j, || d.run(Op::Full, Some(waves - 1)));
        assert!(fired, "copy back {j}");
        match result {
            Err(err @ Error::CopyBackFailed { tries: 3, .. }) => {
                let text = err.to_string();
                assert!(text.contains("3 times copying back") && !text.contains("inconsistent"), "{text}");
            }
            other => panic!("copy back {j}: {other:?}"),
        }
        assert_eq!(d.state(), before, "copy back {j}: the metadata is undone");
        d.pool.check().unwrap();
    }
}

#[test]
fn a_copy_back_that_fails_once_is_tried_again_and_every_byte_comes_back() {
    let (_, hits) = failpoint::record(|| Device::new().run(Op::Full, None).unwrap());
    let waves = hits.iter().filter(|&&h| h == "mover.wave").count();
    for j in 0..waves - 1 {
        let d = Device::new();
        let before = d.state();
        let (result, fired) = failpoint::fail_at("mover.copy_back", j, || d.run(Op::Full, Some(waves - 1)));
        assert!(fired, "copy back {j}");
        assert!(matches!(result, Err(Error::MoverFailed(_))), "copy back {j}: {result:?}");
        assert_eq!(d.state(), before, "copy back {j}: the pool is as it was");
        d.pool.check().unwrap();
        assert!(d.intact(), "copy back {j}: every byte is back at its source");
    }
}

#[test]
fn a_host_that_refuses_the_planning_its_memory_leaves_the_pool_as_it_was() {
    type Plan = fn(&Pool) -> Result<()>;
    let full = CompactionMode::Full;
    let wait = std::time::Duration::from_secs(5);
    let plans: [(&str, Plan); 4] = [
        ("plan_compaction", |p| p.plan_compaction(None, &CompactionMode::Full).map(drop)),
        ("stage_compaction", |p| p.stage_compaction(&CompactionMode::Full, true).map(drop)),
        ("compact", |p| p.compact(&CompactionMode::Full, None, std::time::Duration::from_secs(5)).map(drop)),
        ("compact_step", |p| {
            let token = p.pause(std::time::Duration::from_secs(5)).unwrap();
            let done = p.compact_step(&token, &CompactionMode::Incremental { max_bytes: 4 * MIB }, None);
            p.resume(&token).unwrap();
            done.map(drop)
        }),
    ];
    for (name, plan) in plans {
        let d = Device::new();
        let before = d.state();
        let (result, fired) = failpoint::fail_at("host.headroom", 0, || plan(&d.pool));
        assert!(fired, "{name} asks for its headroom");
        match result {
            Err(Error::HostMemory { what, bytes }) => {
                assert_eq!(what, "planning a compaction", "{name}");
                assert_eq!(bytes, d.pool.compaction_host_bytes(), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(d.state(), before, "{name}: the pool is as it was");
        d.pool.check().unwrap();
        assert!(d.intact(), "{name}: every byte is where it was");
        // Not left paused, and the compaction runs once the host has the memory.
        let h = d.pool.alloc(1000, None, 0).unwrap();
        d.pool.free(h).unwrap();
        let token = d.pool.pause(wait).unwrap();
        let mut copy = |ts: &[Transfer]| -> std::result::Result<(), String> {
            d.copy(ts);
            Ok(())
        };
        let done = d.pool.compact_step(&token, &full, Some(&mut copy)).unwrap();
        d.pool.resume(&token).unwrap();
        assert!(done.blocks > 0, "{name}: the compaction moves blocks afterwards");
        d.pool.check().unwrap();
        assert!(d.intact(), "{name}: and keeps every byte");
    }
}

#[test]
fn a_host_that_refuses_a_bounce_buffer_leaves_the_batch_undone() {
    /// A host memory pool holding two blocks with their patterns, and the moves that make them
    /// trade places: a cycle broken through a bounce buffer.
    fn swapped_pair() -> (Pool, [(Handle, usize, usize); 2], [Move; 2]) {
        let pool = Pool::new(PoolConfig::new(16 * MIB).cores(1)).unwrap();
        let mut blocks = [(Handle::from_bits(0), 0, 0); 2];
        for (id, block) in blocks.iter_mut().enumerate() {
            let h = pool.alloc(64 << 10, None, 0).unwrap();
            let bytes: Vec<u8> = (0..64 << 10).map(|i| byte(id, i)).collect();
            pool.write(h, 0, &bytes).unwrap();
            *block = (h, id, pool.block(h).unwrap().offset);
        }
        let moves = [Move { handle: blocks[0].0, to: blocks[1].2 }, Move { handle: blocks[1].0, to: blocks[0].2 }];
        (pool, blocks, moves)
    }
    fn swap(pool: &Pool, moves: &[Move]) -> Result<super::types::MovedBlocks> {
        let token = pool.pause(std::time::Duration::from_secs(5)).unwrap();
        let done = pool.move_blocks(&token, moves, None);
        pool.resume(&token).unwrap();
        done
    }
    /// Each block holds its pattern, at its own place or (`swapped`) at the other's.
    fn intact(pool: &Pool, blocks: &[(Handle, usize, usize); 2], swapped: bool) -> bool {
        (0..2).all(|k| {
            let (h, id, _) = blocks[k];
            let mut out = vec![0u8; 64 << 10];
            pool.read(h, 0, &mut out).unwrap();
            let expected_at = blocks[if swapped { 1 - k } else { k }].2;
            pool.block(h).unwrap().offset == expected_at && out.iter().enumerate().all(|(i, &x)| x == byte(id, i))
        })
    }
    let (pool, blocks, moves) = swapped_pair();
    let (done, hits) = failpoint::record(|| swap(&pool, &moves).unwrap());
    assert_eq!(done.bounced, 1, "the swap bounces once");
    assert!(intact(&pool, &blocks, true), "with the memory, the swap is made");
    pool.check().unwrap();
    let growths = hits.iter().filter(|&&h| h == "host.vec").count();
    assert!(growths >= 2, "the bounce buffers are asked for: {hits:?}");
    for k in 0..growths {
        let (pool, blocks, moves) = swapped_pair();
        let (result, fired) = failpoint::fail_at("host.vec", k, || swap(&pool, &moves));
        assert!(fired, "growth {k}");
        assert!(matches!(result, Err(Error::HostMemory { .. })), "growth {k}: {result:?}");
        assert!(intact(&pool, &blocks, false), "growth {k}: both blocks as they were");
        pool.check().unwrap();
        let done = swap(&pool, &moves).unwrap();
        assert!(done.bounced == 1 && intact(&pool, &blocks, true), "growth {k}: then the swap is made");
    }
}

/// A host memory pool, fragmented, each live block holding its pattern (in the pool's own
/// bytes), with every live block's handle, pattern and offset.
fn host_fragmented() -> (Pool, Vec<(Handle, usize, usize)>) {
    let pool = Pool::new(PoolConfig::new(48 * MIB).cores(1)).unwrap();
    let kept = fragment(&pool)
        .into_iter()
        .map(|(h, id)| {
            let b = pool.block(h).unwrap();
            let bytes: Vec<u8> = (0..b.size).map(|j| byte(id, j)).collect();
            pool.write(h, 0, &bytes).unwrap();
            (h, id, b.offset)
        })
        .collect();
    (pool, kept)
}

/// Whether every kept block is at `offset` (when `in_place`) and holds its pattern.
fn host_intact(pool: &Pool, kept: &[(Handle, usize, usize)], in_place: bool) -> bool {
    kept.iter().all(|&(h, id, offset)| {
        let b = pool.block(h).unwrap();
        let mut out = vec![0u8; b.size];
        pool.read(h, 0, &mut out).unwrap();
        (!in_place || b.offset == offset) && out.iter().enumerate().all(|(j, &x)| x == byte(id, j))
    })
}

#[test]
fn host_copies_ended_after_any_step_are_undone() {
    let modes = [CompactionMode::Full, CompactionMode::Incremental { max_bytes: 4 * MIB }];
    for mode in modes {
        let step = |pool: &Pool| {
            let token = pool.pause(std::time::Duration::from_secs(5)).unwrap();
            let done = pool.compact_step(&token, &mode, None);
            pool.resume(&token).unwrap();
            done
        };
        let (pool, kept) = host_fragmented();
        let (done, hits) = failpoint::record(|| step(&pool).unwrap());
        let steps = hits.iter().filter(|&&h| h == "copies.interrupt").count();
        assert!(done.blocks > 0 && steps > 1, "{mode:?}: the compaction copies in several steps");
        assert!(host_intact(&pool, &kept, false));
        for k in 0..steps {
            let (pool, kept) = host_fragmented();
            let stats = pool.stats();
            let (result, fired) = failpoint::fail_at("copies.interrupt", k, || step(&pool));
            assert!(fired, "{mode:?}: step {k}");
            assert!(matches!(result, Err(Error::CopiesInterrupted { .. })), "{mode:?}, step {k}: {result:?}");
            assert!(host_intact(&pool, &kept, true), "{mode:?}, step {k}: every block where it was");
            assert_eq!(pool.stats().bytes_in_use, stats.bytes_in_use);
            pool.check().unwrap();
            step(&pool).unwrap();
            assert!(host_intact(&pool, &kept, false), "{mode:?}, step {k}: then the compaction is made");
            pool.check().unwrap();
        }
    }
}

#[test]
fn host_copies_of_a_swap_ended_after_any_step_are_undone() {
    // Two blocks trade places: one goes through a bounce buffer (saved, then restored).
    let pair = || {
        let pool = Pool::new(PoolConfig::new(16 * MIB).cores(1)).unwrap();
        let mut kept = Vec::new();
        for id in 0..2 {
            let h = pool.alloc(64 << 10, None, 0).unwrap();
            let bytes: Vec<u8> = (0..64 << 10).map(|i| byte(id, i)).collect();
            pool.write(h, 0, &bytes).unwrap();
            kept.push((h, id, pool.block(h).unwrap().offset));
        }
        let moves = [Move { handle: kept[0].0, to: kept[1].2 }, Move { handle: kept[1].0, to: kept[0].2 }];
        (pool, kept, moves)
    };
    let swap = |pool: &Pool, moves: &[Move]| {
        let token = pool.pause(std::time::Duration::from_secs(5)).unwrap();
        let done = pool.move_blocks(&token, moves, None);
        pool.resume(&token).unwrap();
        done
    };
    let (pool, _, moves) = pair();
    let (done, hits) = failpoint::record(|| swap(&pool, &moves).unwrap());
    let steps = hits.iter().filter(|&&h| h == "copies.interrupt").count();
    assert_eq!((done.bounced, steps), (1, 3), "save, copy, restore");
    for k in 0..steps {
        let (pool, kept, moves) = pair();
        let (result, fired) = failpoint::fail_at("copies.interrupt", k, || swap(&pool, &moves));
        assert!(fired && matches!(result, Err(Error::CopiesInterrupted { .. })), "step {k}: {result:?}");
        assert!(host_intact(&pool, &kept, true), "step {k}: both blocks as they were");
        pool.check().unwrap();
    }
}
