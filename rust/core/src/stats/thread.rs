//! Per-thread counters of the slab fast path.
//!
//! A slab allocation costs one CAS; a shared counter would cost as much again and make cores
//! fight over a cache line. So each thread counts its slab allocations, frees and requested
//! bytes per size class in a block of its own, with plain (single-writer) stores, and a snapshot
//! sums the blocks of every thread that ever used the pool. A thread's block is released for
//! reuse when the thread exits (the counts stay: they are cumulative and additive).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One thread's counters of one size class (kept together: one line per class).
#[derive(Default)]
struct ClassCounters {
    allocs: AtomicU64,
    frees: AtomicU64,
    /// Requested bytes of the objects allocated minus those freed (wrapping: a thread that
    /// frees others' objects goes negative).
    requested: AtomicU64,
}

/// One thread's counters for one pool.
pub(crate) struct ThreadCounters {
    in_use: AtomicUsize,
    classes: Box<[ClassCounters]>,
}

impl ThreadCounters {
    fn new(classes: usize) -> ThreadCounters {
        ThreadCounters {
            in_use: AtomicUsize::new(1),
            classes: (0..classes).map(|_| ClassCounters::default()).collect(),
        }
    }

    /// Only the owning thread writes, so load + store is an exact increment.
    #[inline]
    fn bump(cell: &AtomicU64, by: u64) {
        cell.store(cell.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
    }
}

struct Node {
    counters: Arc<ThreadCounters>,
    next: *mut Node,
}

/// Every thread's counters for one pool.
pub(crate) struct ThreadStats {
    id: u64,
    classes: usize,
    head: AtomicPtr<Node>,
}

// SAFETY: the list nodes are only created, read and freed through atomics and `Drop`; the
// counters they hold are atomics behind an `Arc`.
unsafe impl Send for ThreadStats {}
// SAFETY: as above.
unsafe impl Sync for ThreadStats {}

/// Per class: allocations, frees, and requested bytes of the live objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ClassTotals {
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) requested: i64,
}

/// This thread's counter blocks, by registry id; released for reuse when the thread exits.
struct Local(Vec<(u64, Arc<ThreadCounters>)>);

impl Drop for Local {
    fn drop(&mut self) {
        let _ = LAST.try_with(|last| last.set((0, std::ptr::null())));
        for (_, counters) in self.0.drain(..) {
            counters.in_use.store(0, Ordering::Release);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local(Vec::new())) };
    /// The registry this thread used last and its block there: a shortcut past `LOCAL`. The
    /// block stays alive while `LOCAL` holds it, and `LOCAL`'s drop clears the shortcut.
    static LAST: Cell<(u64, *const ThreadCounters)> = const { Cell::new((0, std::ptr::null())) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl ThreadStats {
    pub(crate) fn new(classes: usize) -> ThreadStats {
        ThreadStats { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), classes, head: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// A block for the calling thread: an idle one reused, or a new one pushed.
    fn acquire(&self) -> Arc<ThreadCounters> {
        let mut at = self.head.load(Ordering::Acquire);
        while !at.is_null() {
            // SAFETY: nodes live until `self` drops; we hold `&self`.
            let node = unsafe { &*at };
            if node.counters.in_use.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return node.counters.clone();
            }
            at = node.next;
        }
        let counters = Arc::new(ThreadCounters::new(self.classes));
        let node = Box::into_raw(Box::new(Node { counters: counters.clone(), next: std::ptr::null_mut() }));
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            // SAFETY: `node` is ours until published by the CAS below.
            unsafe { (*node).next = head };
            match self.head.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return counters,
                Err(seen) => head = seen,
            }
        }
    }

    /// Run `f` on the calling thread's block.
    #[inline(always)]
    fn with<R>(&self, f: impl FnOnce(&ThreadCounters) -> R) -> R {
        if let Ok((id, counters)) = LAST.try_with(Cell::get) {
            if id == self.id {
                // SAFETY: `LAST` names a block `LOCAL` still holds (see `LAST`).
                return f(unsafe { &*counters });
            }
        }
        self.with_slow(f)
    }

    #[cold]
    fn with_slow<R>(&self, f: impl FnOnce(&ThreadCounters) -> R) -> R {
        let mut f = Some(f);
        let hit = LOCAL.try_with(|local| {
            let local = local.borrow();
            let (_, counters) = local.0.iter().find(|(id, _)| *id == self.id)?;
            let _ = LAST.try_with(|last| last.set((self.id, Arc::as_ptr(counters))));
            Some((f.take().expect("called once"))(counters))
        });
        let f = match hit {
            Ok(Some(out)) => return out,
            _ => f.take().expect("not called yet"),
        };
        let counters = self.acquire();
        let out = f(&counters);
        let kept = LOCAL.try_with(|local| {
            let mut local = local.borrow_mut();
            // Forget blocks of pools that are gone (only we hold them now).
            local.0.retain(|(_, c)| Arc::strong_count(c) > 1);
            local.0.push((self.id, counters.clone()));
            let _ = LAST.try_with(|last| last.set((self.id, Arc::as_ptr(&counters))));
        });
        if kept.is_err() {
            // The thread is exiting (its local storage is gone): release the block at once.
            counters.in_use.store(0, Ordering::Release);
        }
        out
    }

    #[inline(always)]
    pub(crate) fn on_alloc(&self, class: usize, requested: usize) {
        self.with(|c| {
            let c = &c.classes[class];
            ThreadCounters::bump(&c.allocs, 1);
            ThreadCounters::bump(&c.requested, requested as u64);
        });
    }

    #[inline(always)]
    pub(crate) fn on_free(&self, class: usize, requested: usize) {
        self.with(|c| {
            let c = &c.classes[class];
            ThreadCounters::bump(&c.frees, 1);
            ThreadCounters::bump(&c.requested, (requested as u64).wrapping_neg());
        });
    }

    /// The sums over every thread, per class.
    pub(crate) fn totals(&self) -> Vec<ClassTotals> {
        let mut totals = vec![ClassTotals::default(); self.classes];
        let mut at = self.head.load(Ordering::Acquire);
        while !at.is_null() {
            // SAFETY: nodes live until `self` drops; we hold `&self`.
            let node = unsafe { &*at };
            for (t, c) in totals.iter_mut().zip(node.counters.classes.iter()) {
                t.allocs += c.allocs.load(Ordering::Relaxed);
                t.frees += c.frees.load(Ordering::Relaxed);
                t.requested = t.requested.wrapping_add(c.requested.load(Ordering::Relaxed) as i64);
            }
            at = node.next;
        }
        totals
    }
}

impl Drop for ThreadStats {
    fn drop(&mut self) {
        let mut at = *self.head.get_mut();
        while !at.is_null() {
            // SAFETY: every node came from Box::into_raw in `acquire` and is freed once, here.
            let node = unsafe { Box::from_raw(at) };
            at = node.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_add_up_and_blocks_are_reused() {
        let stats = Arc::new(ThreadStats::new(3));
        for round in 0..3 {
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let stats = stats.clone();
                    std::thread::spawn(move || {
                        for i in 0..1000 {
                            stats.on_alloc(t % 3, 100 + i % 7);
                        }
                        for i in 0..1000 {
                            stats.on_free(t % 3, 100 + i % 7);
                        }
                    })
                })
                .collect();
            for th in threads {
                th.join().unwrap();
            }
            let totals = stats.totals();
            let allocs: u64 = totals.iter().map(|t| t.allocs).sum();
            assert_eq!(allocs, 4000 * (round + 1));
            assert!(totals.iter().all(|t| t.requested == 0));
        }
        let mut blocks = 0;
        let mut at = stats.head.load(Ordering::Acquire);
        while !at.is_null() {
            blocks += 1;
            // SAFETY: test-only walk of live nodes.
            at = unsafe { (*at).next };
        }
        assert!(blocks <= 8, "exited threads' blocks are reused ({blocks} blocks)");
    }
}
