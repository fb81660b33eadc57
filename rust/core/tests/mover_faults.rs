//! Mover faults at every prefix: the mover really copies `k` of a compaction's `n` transfers
//! and then fails, for every `k`, on device pools (`Backing::None`, the bytes in a mirror the
//! mover keeps) and on host pools (whose mover keeps a device mirror in step), in full and
//! incremental modes; the fault is an error the mover returns, or a panic. Afterwards every
//! live byte is where its handle says, in the pool and in the mirror.
#![cfg(not(loom))]

use npumem_core::{Backing, CompactionMode, Error, Handle, Pool, PoolConfig, Transfer};
use std::time::Duration;

const MIB: usize = 1 << 20;
const CAPACITY: usize = 16 * MIB;

fn byte(id: usize, i: usize) -> u8 {
    (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8) ^ 0x5a) as u8
}

/// A fragmented pool on one core (mixed sizes, every other block freed) and its mirror, every
/// live block's pattern written into both (the pool's own bytes when it has them).
fn fragmented(backing: Backing) -> (Pool, Vec<u8>, Vec<(Handle, usize)>) {
    let p = Pool::new(PoolConfig::new(CAPACITY).cores(1).backing(backing)).unwrap();
    let sizes = [300, 5000, 40_000, 1200, 70_000, 9000, 600_000, 130_000, 2000, 1_100_000];
    let mut all = Vec::new();
    for r in 0..4 {
        for (k, &s) in sizes.iter().enumerate() {
            if let Ok(h) = p.alloc(s, None, 0) {
                all.push((h, r * sizes.len() + k));
            }
        }
    }
    let mut mirror = vec![0u8; CAPACITY];
    let mut kept = Vec::new();
    for (i, (h, id)) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            p.free(h).unwrap();
            continue;
        }
        let info = p.block(h).unwrap();
        let bytes: Vec<u8> = (0..info.size).map(|j| byte(id, j)).collect();
        mirror[info.offset..info.offset + info.size].copy_from_slice(&bytes);
        if backing == Backing::Host {
            p.write(h, 0, &bytes).unwrap();
        }
        kept.push((h, id));
    }
    (p, mirror, kept)
}

fn verify(p: &Pool, mirror: &[u8], kept: &[(Handle, usize)], what: &str) -> usize {
    let mut damaged = 0;
    for &(h, id) in kept {
        let info = p.block(h).unwrap();
        let ok_mirror = (0..info.size).all(|j| mirror[info.offset + j] == byte(id, j));
        let ok_pool = match p.host_ptr(h) {
            Ok(_) => {
                let mut out = vec![0u8; info.size];
                p.read(h, 0, &mut out).unwrap();
                out.iter().enumerate().all(|(j, &b)| b == byte(id, j))
            }
            Err(_) => true,
        };
        if !(ok_mirror && ok_pool) {
            damaged += 1;
        }
    }
    assert_eq!(damaged, 0, "{what}: {damaged} of {} live blocks damaged", kept.len());
    damaged
}

/// How the mover fails.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Error,
    Panic,
}

/// Run `mode` with a mover that copies `budget` transfers into the mirror and then fails once
/// (`Pool::compact_step` under the caller's pause, or `Pool::compact`, which pauses and
/// resumes on its own). Returns how many transfers it copied and whether the compaction went
/// through.
fn run(
    p: &Pool,
    mirror: &mut [u8],
    mode: &CompactionMode,
    budget: usize,
    fault: Fault,
    own_pause: bool,
) -> (usize, bool) {
    let mut done = 0;
    let mut failed = false;
    // The fault is transient: the reverse copies that undo the batch go through.
    let mut mover = |batch: &[Transfer]| {
        for t in batch {
            if done == budget && !failed {
                failed = true;
                match fault {
                    Fault::Error => return Err(format!("device fault after {done} transfers")),
                    Fault::Panic => panic!("device fault after {done} transfers"),
                }
            }
            mirror.copy_within(t.src..t.src + t.len, t.dst);
            done += 1;
        }
        Ok(())
    };
    let result = if own_pause {
        p.compact(mode, Some(&mut mover), Duration::from_secs(5))
    } else {
        let token = p.pause(Duration::from_secs(5)).unwrap();
        let result = p.compact_step(&token, mode, Some(&mut mover));
        p.resume(&token).unwrap();
        result
    };
    assert!(!p.is_paused(), "the pool runs again after the compaction");
    match result {
        Ok(_) => (done, true),
        Err(Error::MoverFailed(why)) => {
            let expected = match fault {
                Fault::Error => "device fault after",
                Fault::Panic => "the mover panicked: device fault after",
            };
            assert!(why.starts_with(expected), "{why}");
            (done, false)
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
}

fn every_prefix(backing: Backing, mode: CompactionMode, after_full: bool) {
    every_prefix_with(backing, mode, after_full, Fault::Error, false);
}

fn every_prefix_with(backing: Backing, mode: CompactionMode, after_full: bool, fault: Fault, own_pause: bool) {
    let mut budget = 0;
    loop {
        let (p, mut mirror, kept) = fragmented(backing);
        if after_full {
            let (_, ok) = run(&p, &mut mirror, &CompactionMode::Full, usize::MAX, fault, own_pause);
            assert!(ok);
        }
        let (copied, ok) = run(&p, &mut mirror, &mode, budget, fault, own_pause);
        p.check().unwrap();
        verify(&p, &mirror, &kept, &format!("{backing:?} {mode:?}, mover failed ({fault:?}) at transfer {budget}"));
        for &(h, _) in &kept {
            p.try_block(h).unwrap();
        }
        if ok {
            assert!(budget >= copied, "a mover that did not fail copies every transfer");
            assert!(budget > 0, "the pool needs moves for this test");
            break;
        }
        // The pool is usable afterwards: the same compaction goes through.
        let (_, ok) = run(&p, &mut mirror, &mode, usize::MAX, fault, own_pause);
        assert!(ok);
        verify(&p, &mirror, &kept, "after the retry");
        budget += 1;
    }
}

#[test]
fn a_device_mover_panicking_at_every_prefix_of_a_full_compaction_loses_nothing() {
    every_prefix_with(Backing::None, CompactionMode::Full, false, Fault::Panic, false);
}

#[test]
fn a_host_mirror_panicking_at_every_prefix_of_a_compaction_that_pauses_on_its_own_loses_nothing() {
    every_prefix_with(Backing::Host, CompactionMode::Incremental { max_bytes: 4 * MIB }, false, Fault::Panic, true);
}

#[test]
fn a_device_mover_failing_at_every_prefix_of_a_full_compaction_loses_nothing() {
    every_prefix(Backing::None, CompactionMode::Full, false);
}

#[test]
fn a_device_mover_failing_at_every_prefix_of_an_incremental_step_loses_nothing() {
    every_prefix(Backing::None, CompactionMode::Incremental { max_bytes: 4 * MIB }, false);
}

#[test]
fn a_host_mirror_failing_at_every_prefix_of_a_full_compaction_loses_nothing() {
    every_prefix(Backing::Host, CompactionMode::Full, false);
}

#[test]
fn a_host_mirror_failing_at_every_prefix_of_an_incremental_step_loses_nothing() {
    every_prefix(Backing::Host, CompactionMode::Incremental { max_bytes: 4 * MIB }, false);
}
