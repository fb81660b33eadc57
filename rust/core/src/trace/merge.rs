//! Merging the rings' events into one stream, oldest first, in an order a replay can follow.
//!
//! Each ring holds the events of one thread in that thread's order (the shared ring: of several
//! threads, in ticket order). The merge repeatedly takes the ring whose next event has the
//! smallest time, so the stream is in time order wherever the times are, with two rules that
//! hold whatever the times say:
//!
//! - each ring's events keep their order;
//! - a free or move of a block comes after the block's alloc when both are in the merge (the
//!   counter read of the freeing thread may run ahead of the load that brought it the block, so
//!   its time can be a few nanoseconds before the alloc's).
//!
//! A ring whose next event waits for an alloc in another ring is set aside until that alloc is
//! out. Times are then made non-decreasing: an event that had to wait takes the time of the
//! event before it. (A ring set aside forever would need a cycle of waits, which no execution
//! produces; should one arise from bad data, the earliest waiting event goes out anyway.)

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::event::{EventKind, TraceEvent};
use crate::error::Result;
use crate::util::grow::reserve;
use crate::util::grow::try_vec;

/// What the merge's tables are called when the host has no memory for them.
const WHAT: &str = "the trace's merged events";

/// The tables of a merge of `events` events from `streams` streams, made before the events are
/// taken from the rings (so that a host out of memory leaves them there).
pub(crate) struct MergeRoom {
    out: Vec<TraceEvent>,
    /// Where each alloc of the merge is: (stream, index).
    allocs: HashMap<u128, (usize, usize)>,
    /// Per stream, the index of its next event.
    next: Vec<usize>,
    /// Streams waiting for an alloc: by the stream that holds it, (index of the alloc, waiter).
    waiting: Vec<Vec<(usize, usize)>>,
    set_aside: Vec<usize>,
    /// The streams not waiting, by the time of their next event.
    heads: BinaryHeap<Reverse<(u64, usize)>>,
}

impl MergeRoom {
    /// Room for `events` events from `streams` streams, or `Error::HostMemory`. A table per
    /// stream holds at most one entry per stream (a stream waits for one alloc at a time, and
    /// is in the heap only while it waits for none): those never grow.
    pub(crate) fn new(streams: usize, events: usize) -> Result<MergeRoom> {
        let mut room = MergeRoom {
            out: Vec::new(),
            allocs: HashMap::new(),
            next: Vec::new(),
            waiting: Vec::new(),
            set_aside: Vec::new(),
            heads: BinaryHeap::new(),
        };
        if streams <= 1 {
            return Ok(room); // one stream is the merge itself
        }
        room.out = try_vec(events, WHAT)?;
        reserve(&mut room.allocs, events, WHAT)?;
        room.next = try_vec(streams, WHAT)?;
        room.next.resize(streams, 0);
        room.waiting = try_vec(streams, WHAT)?;
        for _ in 0..streams {
            room.waiting.push(try_vec(streams, WHAT)?);
        }
        room.set_aside = try_vec(streams, WHAT)?;
        room.heads = BinaryHeap::from(try_vec(streams, WHAT)?);
        Ok(room)
    }
}

/// One stream, oldest first: the events of `streams` (each in its own order) merged as the
/// module documentation says. Its tables start from `room` and grow without aborting:
/// `Error::HostMemory` when the host has no memory for them.
pub(crate) fn merge(mut streams: Vec<Vec<TraceEvent>>, mut room: MergeRoom) -> Result<Vec<TraceEvent>> {
    if streams.len() <= 1 {
        let mut out = streams.pop().unwrap_or_default();
        monotone(&mut out);
        return Ok(out);
    }
    if room.next.len() != streams.len() {
        room = MergeRoom::new(streams.len(), 0)?;
    }
    let MergeRoom { mut out, mut allocs, mut next, mut waiting, mut set_aside, mut heads } = room;
    let total: usize = streams.iter().map(Vec::len).sum();
    reserve(&mut out, total, WHAT)?;
    for (s, events) in streams.iter().enumerate() {
        for (i, e) in events.iter().enumerate() {
            if e.kind == EventKind::Alloc {
                reserve(&mut allocs, 1, WHAT)?;
                allocs.insert(e.handle, (s, i));
            }
        }
    }
    heads.extend(streams.iter().enumerate().filter(|(_, e)| !e.is_empty()).map(|(s, e)| Reverse((e[0].time_ns, s))));
    while out.len() < total {
        let s = match heads.pop() {
            Some(Reverse((_, s))) => s,
            None => {
                // Only a cycle of waits gets here: let the earliest waiting event go.
                let (k, &s) = set_aside
                    .iter()
                    .enumerate()
                    .min_by_key(|&(_, &s)| streams[s][next[s]].time_ns)
                    .expect("events left means a stream left");
                set_aside.swap_remove(k);
                for list in waiting.iter_mut() {
                    list.retain(|&(_, w)| w != s);
                }
                emit(&streams, &mut next, &mut out, s, &mut heads, &mut waiting, &mut set_aside);
                continue;
            }
        };
        let e = &streams[s][next[s]];
        if matches!(e.kind, EventKind::Free | EventKind::Move) {
            if let Some(&(a, i)) = allocs.get(&e.handle) {
                if a != s && next[a] <= i {
                    waiting[a].push((i, s));
                    set_aside.push(s);
                    continue;
                }
            }
        }
        emit(&streams, &mut next, &mut out, s, &mut heads, &mut waiting, &mut set_aside);
    }
    streams.clear();
    monotone(&mut out);
    Ok(out)
}

/// Hand out the next event of stream `s`, put the stream's new head in the heap, and wake the
/// streams that waited for this event.
fn emit(
    streams: &[Vec<TraceEvent>],
    next: &mut [usize],
    out: &mut Vec<TraceEvent>,
    s: usize,
    heads: &mut BinaryHeap<Reverse<(u64, usize)>>,
    waiting: &mut [Vec<(usize, usize)>],
    set_aside: &mut Vec<usize>,
) {
    out.push(streams[s][next[s]]);
    next[s] += 1;
    if let Some(e) = streams[s].get(next[s]) {
        heads.push(Reverse((e.time_ns, s)));
    }
    if let Some(list) = waiting.get_mut(s) {
        let done = next[s];
        list.retain(|&(alloc_at, w)| {
            if alloc_at < done {
                set_aside.retain(|&x| x != w);
                heads.push(Reverse((streams[w][next[w]].time_ns, w)));
                false
            } else {
                true
            }
        });
    }
}

/// Make the times non-decreasing: an event earlier than the one before it takes that one's time.
fn monotone(events: &mut [TraceEvent]) {
    let mut last = 0;
    for e in events {
        e.time_ns = e.time_ns.max(last);
        last = e.time_ns;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn merge_all(streams: Vec<Vec<TraceEvent>>) -> Vec<TraceEvent> {
        let room = MergeRoom::new(streams.len(), 0).unwrap();
        merge(streams, room).unwrap()
    }

    fn ev(time_ns: u64, kind: EventKind, handle: u128) -> TraceEvent {
        TraceEvent { time_ns, kind, offset: 0, size: 1, core: 0, tag: 0, handle, aux: 0 }
    }

    #[test]
    fn merges_by_time_and_keeps_each_streams_order() {
        use EventKind::*;
        let a = vec![ev(1, Alloc, 1), ev(5, Alloc, 2), ev(4, Failed, 0)];
        let b = vec![ev(2, Alloc, 3), ev(3, Free, 3), ev(9, Free, 1)];
        let out = merge_all(vec![a, b]);
        let order: Vec<(u64, u128)> = out.iter().map(|e| (e.time_ns, e.handle)).collect();
        // A's failed alloc (time 4) stays after its alloc at 5 and takes that time.
        assert_eq!(order, vec![(1, 1), (2, 3), (3, 3), (5, 2), (5, 0), (9, 1)]);
    }

    #[test]
    fn a_free_read_early_waits_for_its_alloc() {
        use EventKind::*;
        // Thread B frees block 7 at "time" 10, thread A allocated it at 12 (the free's counter
        // read ran ahead), then A goes on.
        let a = vec![ev(3, Alloc, 5), ev(12, Alloc, 7), ev(13, Alloc, 8)];
        let b = vec![ev(10, Free, 7), ev(11, Move, 5)];
        let out = merge_all(vec![a, b]);
        let order: Vec<(EventKind, u128, u64)> = out.iter().map(|e| (e.kind, e.handle, e.time_ns)).collect();
        assert_eq!(
            order,
            vec![(Alloc, 5, 3), (Alloc, 7, 12), (Free, 7, 12), (Move, 5, 12), (Alloc, 8, 13)],
            "the free waits for its alloc, the move behind it keeps its stream's order"
        );
    }

    #[test]
    fn frees_of_blocks_allocated_before_the_merge_go_by_time() {
        use EventKind::*;
        let out = merge_all(vec![vec![ev(5, Free, 1)], vec![ev(2, Free, 2)], vec![]]);
        assert_eq!(out.iter().map(|e| e.handle).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn a_cycle_of_waits_from_bad_data_still_ends() {
        use EventKind::*;
        let a = vec![ev(1, Free, 2), ev(2, Alloc, 1)];
        let b = vec![ev(1, Free, 1), ev(2, Alloc, 2)];
        assert_eq!(merge_all(vec![a, b]).len(), 4);
    }

    /// Random executions: threads allocate, hand blocks to each other and free them; the true
    /// order is known. Each event's time is its true time, read up to `skew` early (the counter
    /// running ahead). The merge keeps each thread's order and every block's alloc before its
    /// free and moves, loses nothing, and its times never go back.
    #[test]
    fn random_executions_with_skewed_times_replay_correctly() {
        let mut state = 0x1234_5678_9ABC_DEF1u64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for round in 0..200 {
            let threads = 1 + rand(5) as usize;
            let skew = [0, 3, 20, 1000][round % 4];
            let mut streams: Vec<Vec<TraceEvent>> = vec![Vec::new(); threads];
            let mut live: Vec<u128> = Vec::new();
            let mut next_handle = 1u128;
            let mut clock = 10_000u64; // above the largest skew: times stay positive
            for _ in 0..rand(400) {
                clock += 1 + rand(10);
                let t = rand(threads as u64) as usize;
                let time = clock - rand(skew + 1);
                let event = match rand(3) {
                    0 if !live.is_empty() => {
                        let h = live.swap_remove(rand(live.len() as u64) as usize);
                        ev(time, EventKind::Free, h)
                    }
                    1 if !live.is_empty() => ev(time, EventKind::Move, live[rand(live.len() as u64) as usize]),
                    _ => {
                        live.push(next_handle);
                        next_handle += 1;
                        ev(time, EventKind::Alloc, next_handle - 1)
                    }
                };
                // The event's true position, to check each stream's order.
                let mut e = event;
                e.offset = clock as usize;
                streams[t].push(e);
            }
            let total: usize = streams.iter().map(Vec::len).sum();
            let out = merge_all(streams.clone());
            assert_eq!(out.len(), total);
            assert!(out.windows(2).all(|w| w[0].time_ns <= w[1].time_ns), "times went back");
            let mut allocated = std::collections::HashSet::new();
            for e in &out {
                match e.kind {
                    EventKind::Alloc => assert!(allocated.insert(e.handle)),
                    _ => assert!(allocated.contains(&e.handle), "{:?} of {} before its alloc", e.kind, e.handle),
                }
            }
            for s in &streams {
                let positions: Vec<usize> = s.iter().map(|e| e.offset).collect();
                let merged: Vec<usize> = out.iter().map(|e| e.offset).filter(|p| positions.contains(p)).collect();
                assert_eq!(merged, positions, "a stream's order changed");
            }
        }
    }
}
