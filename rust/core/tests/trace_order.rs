//! A trace recorded by more threads than the pool has rings (and than the machine has CPUs, so
//! that threads are preempted between a free and its event) replays: in the merged stream no
//! allocation takes bytes that a block still holds.

use std::collections::BTreeMap;
use std::sync::Arc;

use npumem_core::{Backing, EventKind, Pool, PoolConfig, TraceEvent};

const MIB: usize = 1 << 20;
/// Allocations or frees per thread.
const OPS: usize = 100_000;

/// Replay `events` over the bytes they name: the first allocation of bytes a live block holds.
fn first_overlap(events: &[TraceEvent], live: &mut BTreeMap<usize, (usize, u128)>) -> Option<String> {
    for e in events {
        match e.kind {
            EventKind::Alloc => {
                let end = e.offset + e.size.max(1);
                if let Some((&start, &(stop, h))) = live.range(..end).next_back() {
                    if stop > e.offset {
                        return Some(format!("{e:?} over block {h} at {start}..{stop}"));
                    }
                }
                live.insert(e.offset, (end, e.handle));
            }
            EventKind::Free => {
                live.remove(&e.offset);
            }
            EventKind::Move | EventKind::Failed => {}
        }
    }
    None
}

#[test]
fn a_trace_of_more_threads_than_rings_never_reuses_bytes_before_their_free() {
    let threads = 6; // on two core pools: two threads share the third ring
    let pool = Arc::new(Pool::new(PoolConfig::new(4 * MIB).cores(2).backing(Backing::None)).unwrap());
    pool.trace_start(1 << 20).unwrap();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut held = Vec::new();
                for _ in 0..OPS {
                    // Work between calls, so that the drains keep up with six threads.
                    for _ in 0..200 {
                        std::hint::spin_loop();
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let size = [64, 256, 4096, 70_000][(x % 4) as usize];
                    if held.len() < 4 {
                        if let Ok(h) = pool.alloc(size, None, 0) {
                            held.push(h);
                        }
                    } else {
                        pool.free(held.swap_remove((x >> 8) as usize % held.len())).unwrap();
                    }
                }
                for h in held {
                    pool.free(h).unwrap();
                }
            })
        })
        .collect();
    // Drained while the threads run, as a monitor does; an event still being written at a
    // drain comes in the next one, so the drains go together by time (as `TraceRecorder` does).
    let mut events: Vec<TraceEvent> = Vec::new();
    while !workers.iter().all(|w| w.is_finished()) {
        std::thread::sleep(std::time::Duration::from_millis(5));
        events.extend(pool.trace_drain().unwrap());
    }
    for w in workers {
        w.join().unwrap();
    }
    events.extend(pool.trace_drain().unwrap());
    assert_eq!(pool.trace_status().dropped, 0, "the rings held every event");
    events.sort_by_key(|e| e.time_ns);
    if let Some(fault) = first_overlap(&events, &mut BTreeMap::new()) {
        panic!("of {} events: {fault}", events.len());
    }
    let count = |kind| events.iter().filter(|e| e.kind == kind).count();
    let allocs = count(EventKind::Alloc);
    assert_eq!(allocs, count(EventKind::Free), "every block allocated was freed");
    assert!(allocs > OPS, "{allocs} allocations");
}
