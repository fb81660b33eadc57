//! Failpoints at every mover call (`mover.wave`, `mover.copy_back`): each compaction and batch
//! is run once to record the calls it makes, then again with each call failing in turn. A
//! failed wave leaves the pool exactly as before: the same blocks at the same places, the same
//! statistics, a clean `check()`, and every byte back at its source. A failed copy back is
//! reported as corruption of the bytes, with the metadata still undone.

use std::cell::RefCell;

use super::types::{CompactionMode, StepReport, Transfer};
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

fn byte(id: usize, i: usize) -> u8 {
    (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8
}

impl Device {
    /// The same device every time (one core).
    fn new() -> Device {
        let capacity = 48 * MIB;
        let pool = Pool::new(PoolConfig::new(capacity).cores(1).backing(Backing::None)).unwrap();
        let mut memory = vec![0u8; capacity];
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
                let b = pool.block(h).unwrap();
                for j in 0..b.size {
                    memory[b.offset + j] = byte(id, j);
                }
                kept.push((h, id));
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
    // The mover fails its last wave; then each copy back of the waves before fails in turn.
    for j in 0..waves - 1 {
        let d = Device::new();
        let before = d.state();
        let (result, fired) = failpoint::fail_at("mover.copy_back", j, || d.run(Op::Full, Some(waves - 1)));
        assert!(fired, "copy back {j}");
        match result {
            Err(Error::Corruption(why)) => assert!(why[0].contains("copying back"), "{why:?}"),
            other => panic!("copy back {j}: {other:?}"),
        }
        assert_eq!(d.state(), before, "copy back {j}: the metadata is undone");
        d.pool.check().unwrap();
    }
}
