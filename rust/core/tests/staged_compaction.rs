//! Staged compactions: planned while the pool runs (`stage_compaction`), checked and moved on
//! the paused pool (`run_staged`, `compact`). The same moves as a compaction planned inside the
//! pause when nothing changed; stale moves dropped, every byte kept, when something did; and
//! compactions while other threads allocate, write, check and free.
#![cfg(not(loom))]

mod common;

use common::{fill, pool, verify, MIB, SIZES, WAIT};
use npumem_core::{BlockInfo, CompactionMode, Error, Handle, PlannedMove, Pool};
use std::sync::atomic::{AtomicBool, Ordering};

/// Blocks of every kind, every other one freed. Returns the survivors.
fn fragment(p: &Pool, rounds: usize) -> Vec<(Handle, usize)> {
    common::fragment(p, &SIZES, rounds)
}

fn run(p: &Pool, mode: &CompactionMode) -> npumem_core::StepReport {
    let staged = p.stage_compaction(mode, false).unwrap();
    let token = p.pause(WAIT).unwrap();
    let done = p.run_staged(&token, staged, None).unwrap();
    p.resume(&token).unwrap();
    done
}

#[test]
fn nothing_changed_a_staged_compaction_moves_what_compact_step_moves() {
    for mode in [CompactionMode::Full, CompactionMode::Incremental { max_bytes: 2 * MIB }] {
        // One core: both pools are laid out alike.
        let (a, b) = (pool(128 * MIB, 1), pool(128 * MIB, 1));
        let (kept_a, kept_b) = (fragment(&a, 40), fragment(&b, 40));
        let token = a.pause(WAIT).unwrap();
        let inside = a.compact_step(&token, &mode, None).unwrap();
        a.resume(&token).unwrap();
        let staged = run(&b, &mode);
        assert!(inside.blocks > 0);
        assert_eq!((staged.blocks, staged.bytes, staged.stale), (inside.blocks, inside.bytes, 0), "{mode:?}");
        let places =
            |p: &Pool| p.blocks().unwrap().iter().map(|b| (b.handle.slot(), b.offset, b.size)).collect::<Vec<_>>();
        assert!(places(&a) == places(&b), "the same places");
        assert_eq!(a.stats().largest_free_block, b.stats().largest_free_block);
        a.check().unwrap();
        b.check().unwrap();
        kept_b.iter().for_each(|&(h, id)| verify(&b, h, id));
        drop(kept_a);
    }
}

/// Meanwhile, one moved block is freed and another pinned, each where no other move needs its
/// place to come free (a full compaction re-places every block, so a block that stays where
/// the plan expected room strands the moves that needed it, which are dropped as well): those
/// two moves are dropped, every other one runs, and every byte is kept.
#[test]
fn moves_made_stale_meanwhile_are_dropped_and_the_rest_run() {
    let p = pool(128 * MIB, 1);
    let kept = fragment(&p, 40);
    // The moves the staged compaction holds: planning again sees the same pool.
    let plan = p.plan_compaction_with(None, &CompactionMode::Full, false).unwrap();
    let staged = p.stage_compaction(&CompactionMode::Full, false).unwrap();
    assert_eq!(staged.moves(), plan.moves.len());
    let extent = |m: &PlannedMove| m.handle.map_or(m.bytes, |h| p.block(h).unwrap().block_bytes);
    let needed = |b: &BlockInfo| {
        plan.moves.iter().any(|m| {
            let filled = m.to < b.offset + b.block_bytes && b.offset < m.to + extent(m);
            let in_moved_slab = m.handle.is_none() && m.from <= b.offset && b.offset < m.from + m.bytes;
            filled || in_moved_slab
        })
    };
    let moved: Vec<Handle> = plan.moves.iter().filter_map(|m| m.handle).collect();
    let mut loose = kept.iter().filter(|(h, _)| moved.contains(h) && !needed(&p.block(*h).unwrap()));
    let (freed, _) = *loose.next().expect("a moved block whose place no move needs");
    let (pinned, _) = *loose.nth(2).expect("another");
    p.free(freed).unwrap();
    p.try_pin(pinned).unwrap();
    let token = p.pause(WAIT).unwrap();
    let done = p.run_staged(&token, staged, None).unwrap();
    p.resume(&token).unwrap();
    assert_eq!(done.stale, 2, "the moves of the freed and the pinned block");
    assert!(done.blocks > 0 && done.bytes > 0, "the others ran");
    p.check().unwrap();
    for &(h, id) in kept.iter().filter(|(h, _)| *h != freed) {
        verify(&p, h, id);
    }
    p.unpin(pinned).unwrap();
}

/// Meanwhile, a third of the blocks are freed, some pinned, and new blocks fill holes (some of
/// them the places the plan chose): the stale moves are dropped (with a full compaction that
/// re-places every block, most or all of them), and every byte is kept.
#[test]
fn moves_made_stale_meanwhile_are_dropped_and_every_byte_is_kept() {
    let p = pool(128 * MIB, 1);
    let kept = fragment(&p, 40);
    let staged = p.stage_compaction(&CompactionMode::Full, false).unwrap();
    assert!(staged.moves() > 0);
    let mut live = Vec::new();
    let mut pinned = Vec::new();
    for (i, (h, id)) in kept.into_iter().enumerate() {
        match i % 6 {
            0 | 3 => p.free(h).unwrap(),
            1 => {
                p.try_pin(h).unwrap();
                pinned.push(h);
                live.push((h, id));
            }
            _ => live.push((h, id)),
        }
    }
    for k in 0..2000 {
        if let Ok(h) = p.alloc(SIZES[k % 7], None, 0) {
            fill(&p, h, 1_000_000 + k);
            live.push((h, 1_000_000 + k));
        }
    }
    let token = p.pause(WAIT).unwrap();
    let done = p.run_staged(&token, staged, None).unwrap();
    p.resume(&token).unwrap();
    assert!(done.stale > 0, "some planned moves went stale");
    p.check().unwrap();
    for &(h, id) in &live {
        verify(&p, h, id);
    }
    for h in pinned {
        p.unpin(h).unwrap();
    }
}

#[test]
fn staged_incremental_steps_run_out_and_gather_the_free_space() {
    let p = pool(128 * MIB, 2);
    let kept = fragment(&p, 40);
    let before = p.stats().largest_free_block;
    let mut steps = 0;
    loop {
        let done = p.compact(&CompactionMode::Incremental { max_bytes: MIB }, None, WAIT).unwrap();
        steps += 1;
        assert!(done.bytes <= MIB + 3 * MIB, "a step keeps to its budget (a run may slide whole)");
        if done.blocks == 0 || steps > 500 {
            break;
        }
    }
    assert!(steps <= 500, "steps run out");
    assert!(p.stats().largest_free_block > before);
    p.check().unwrap();
    kept.iter().for_each(|&(h, id)| verify(&p, h, id));
}

#[test]
fn a_staged_compaction_runs_only_as_it_was_staged() {
    let (p, other) = (pool(64 * MIB, 1), pool(64 * MIB, 1));
    let _kept = fragment(&p, 20);
    let before = p.blocks().unwrap();
    let token = p.pause(WAIT).unwrap();
    let staged = p.stage_compaction(&CompactionMode::Full, false).unwrap();
    let mut mover = |_: &[npumem_core::Transfer]| -> Result<(), String> { Ok(()) };
    let e = p.run_staged(&token, staged, Some(&mut mover)).unwrap_err();
    assert!(matches!(e, Error::InvalidMove { .. }), "{e:?}");
    let foreign = other.stage_compaction(&CompactionMode::Full, false).unwrap();
    assert!(matches!(p.run_staged(&token, foreign, None), Err(Error::InvalidMove { .. })));
    p.resume(&token).unwrap();
    let staged = p.stage_compaction(&CompactionMode::Full, false).unwrap();
    assert!(matches!(p.run_staged(&token, staged, None), Err(Error::NotPaused)));
    assert_eq!(p.blocks().unwrap(), before, "refused runs change nothing");
    p.check().unwrap();
}

#[test]
fn staged_compactions_under_load_lose_nothing() {
    let p = pool(96 * MIB, 2);
    let kept = fragment(&p, 30);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (p, stop) = (&p, &stop);
            s.spawn(move || {
                let mut mine: Vec<(Handle, usize)> = Vec::new();
                let mut k = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let id = 10_000_000 * (t + 1) + k;
                    match p.alloc(SIZES[k % 8], None, 0) {
                        Ok(h) => {
                            fill(p, h, id);
                            mine.push((h, id));
                        }
                        Err(Error::OutOfMemory { .. }) | Err(Error::PausedTooLong { .. }) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                    if mine.len() > 40 || k % 3 == 0 {
                        if let Some((h, id)) = mine.pop() {
                            verify(p, h, id);
                            p.free(h).unwrap();
                        }
                    }
                }
                for (h, id) in mine {
                    verify(p, h, id);
                    p.free(h).unwrap();
                }
            });
        }
        // The workers stop when this scope's thread is done, also when a compaction fails
        // (a panic here must fail the test, not leave the workers running forever).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        for round in 0..12 {
            let mode =
                if round % 3 == 0 { CompactionMode::Full } else { CompactionMode::Incremental { max_bytes: MIB } };
            p.compact(&mode, None, WAIT).unwrap();
        }
    });
    p.check().unwrap();
    kept.iter().for_each(|&(h, id)| verify(&p, h, id));
}

#[test]
fn a_check_never_finds_the_staging_half_done() {
    // Staging gives the cores' cached freed blocks back to their trees while the pool runs; a
    // `check()` pauses the pool and must find every drain done or not begun.
    let p = Pool::new(npumem_core::PoolConfig::new(32 * MIB).cores(2).core_reserve(0)).unwrap();
    let stop = AtomicBool::new(false);
    let mode = CompactionMode::Incremental { max_bytes: MIB };
    std::thread::scope(|s| {
        for seed in 1..=3u64 {
            let (p, stop) = (&p, &stop);
            s.spawn(move || {
                // Blocks of more than a bank and up to half a chunk go to the caches when freed.
                let mut x = seed;
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if let Ok(h) = p.alloc(1 + (x % (256 << 10)) as usize, None, 0) {
                        held.push(h);
                    }
                    if held.len() > 40 || (!held.is_empty() && x % 5 < 2) {
                        p.free(held.swap_remove((x >> 8) as usize % held.len())).unwrap();
                    }
                }
                held.into_iter().for_each(|h| p.free(h).unwrap());
            });
        }
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                match p.stage_compaction(&mode, false) {
                    Ok(_) | Err(Error::Paused) | Err(Error::PausedTooLong { .. }) => {}
                    Err(e) => panic!("staging: {e}"),
                }
            }
        });
        let started = std::time::Instant::now();
        let mut checks = 0;
        while started.elapsed() < std::time::Duration::from_secs(3) {
            let checked = p.check();
            if checked.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            checked.unwrap_or_else(|e| panic!("after {checks} good checks: {e}"));
            checks += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    p.check().unwrap();
    assert_eq!(p.stats().blocks_in_use, 0);
}
