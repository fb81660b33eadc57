//! A lock-free stack of `u32` indices (a Treiber stack), with the links kept by the caller in
//! entries that are never freed (see `segments`).
//!
//! The head packs `tag (bits 32..64) | index + 1 (bits 0..32)`, 0 meaning empty; every successful
//! CAS increments the tag, so the ABA schedule (pop reads top A with next B; others pop A, pop B,
//! push A; the first pop's CAS would install the freed B) fails on the tag. Reading the `next`
//! link of an entry someone else popped meanwhile is harmless: the CAS then fails.

use crate::util::sync::{AtomicU32, AtomicU64, Ordering};

/// The link value of the last entry.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Default)]
pub(crate) struct IndexStack {
    head: AtomicU64,
}

impl IndexStack {
    pub(crate) fn new() -> IndexStack {
        IndexStack { head: AtomicU64::new(0) }
    }

    /// Pop the top index; `next_of(i)` is entry `i`'s link.
    pub(crate) fn pop<'a>(&self, next_of: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
        let mut current = self.head.load(Ordering::Acquire);
        loop {
            let top = current as u32;
            if top == 0 {
                return None;
            }
            let index = top - 1;
            let next = next_of(index).load(Ordering::Acquire);
            let tag = (current >> 32).wrapping_add(1);
            let new = tag << 32 | next.wrapping_add(1) as u64;
            match self.head.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(index),
                Err(seen) => current = seen,
            }
        }
    }

    /// Push `index` (which must not be on any stack).
    pub(crate) fn push<'a>(&self, index: u32, next_of: impl Fn(u32) -> &'a AtomicU32) {
        let link = next_of(index);
        let mut current = self.head.load(Ordering::Acquire);
        loop {
            link.store((current as u32).wrapping_sub(1), Ordering::Relaxed); // NIL when empty
            let tag = (current >> 32).wrapping_add(1);
            let new = tag << 32 | (index as u64 + 1);
            match self.head.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// The indices on the stack, top first (at most `limit`: a cycle would be a bug, and is
    /// reported by the caller as a length mismatch). Meant for a quiescent stack.
    pub(crate) fn snapshot<'a>(&self, limit: usize, next_of: impl Fn(u32) -> &'a AtomicU32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = self.head.load(Ordering::Acquire) as u32;
        while at != 0 && out.len() < limit {
            out.push(at - 1);
            at = next_of(at - 1).load(Ordering::Acquire).wrapping_add(1);
        }
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_every_entry_without_taking_it() {
        let links: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(NIL)).collect();
        let stack = IndexStack::new();
        assert!(stack.snapshot(8, |i| &links[i as usize]).is_empty(), "empty");
        for i in [3, 5, 7] {
            stack.push(i, |i| &links[i as usize]);
        }
        assert_eq!(stack.snapshot(2, |i| &links[i as usize]), vec![7, 5], "at most the limit");
        assert_eq!(stack.snapshot(8, |i| &links[i as usize]), vec![7, 5, 3], "nothing taken");
    }

    #[test]
    fn lifo_order_and_empty() {
        let links: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(NIL)).collect();
        let stack = IndexStack::new();
        assert_eq!(stack.pop(|i| &links[i as usize]), None);
        for i in [3, 5, 7] {
            stack.push(i, |i| &links[i as usize]);
        }
        assert_eq!(stack.snapshot(10, |i| &links[i as usize]), vec![7, 5, 3]);
        assert_eq!(stack.pop(|i| &links[i as usize]), Some(7));
        assert_eq!(stack.pop(|i| &links[i as usize]), Some(5));
        assert_eq!(stack.pop(|i| &links[i as usize]), Some(3));
        assert_eq!(stack.pop(|i| &links[i as usize]), None);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// The ABA schedule: one thread pops while another pops twice and pushes the first index
    /// back. Every index must come out exactly once, and the stack must stay a stack.
    #[test]
    fn survives_aba() {
        loom::model(|| {
            let links: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(NIL)).collect());
            let stack = Arc::new(IndexStack::new());
            for i in 0..3 {
                stack.push(i, |i| &links[i as usize]);
            }
            let (s2, l2) = (stack.clone(), links.clone());
            let other = thread::spawn(move || {
                let a = s2.pop(|i| &l2[i as usize]).unwrap();
                let b = s2.pop(|i| &l2[i as usize]).unwrap();
                s2.push(a, |i| &l2[i as usize]);
                b
            });
            let mine = stack.pop(|i| &links[i as usize]).unwrap();
            let b = other.join().unwrap();
            let mut all = vec![mine, b];
            while let Some(i) = stack.pop(|i| &links[i as usize]) {
                all.push(i);
            }
            all.sort();
            assert_eq!(all, vec![0, 1, 2], "an index was lost or handed out twice");
        });
    }
}
