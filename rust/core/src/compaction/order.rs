//! In which order a batch copies its blocks so that no copy overwrites bytes another one has
//! still to read.
//!
//! Move `b` must come after move `a` when `b`'s destination overlaps `a`'s source (a move
//! overlapping only its own source is a `memmove`, fine in any order). When every destination
//! lies at or below its source (a slide towards the start, what the compaction planner makes),
//! ascending source order is such an order: a destination can only overlap sources below its
//! own, which moved first. Otherwise the dependency graph is sorted (Kahn); what is left is a
//! cycle, broken by saving one source elsewhere (a host bounce buffer, or free space of the
//! arena that the executor finds when the caller copies the bytes).

/// One copy of a batch: `len` bytes from `src` to `dst` (offsets in the arena).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Where the bytes are now.
    pub src: usize,
    /// Where they go.
    pub dst: usize,
    /// How many bytes.
    pub len: usize,
}

/// One step of a copy order (indices into the batch's transfers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Copy transfer `i` (source to destination).
    Copy(usize),
    /// Save transfer `i`'s source bytes in a bounce buffer (breaks a cycle).
    Save(usize),
    /// Write transfer `i`'s saved bytes to its destination.
    Restore(usize),
}

/// The steps that perform `transfers` without overwriting unread bytes. `Err(n)`: `n` moves
/// sit on cycles and `bounce` is false.
pub(crate) fn order(transfers: &[Transfer], bounce: bool) -> Result<Vec<Step>, usize> {
    let n = transfers.len();
    let mut by_src: Vec<usize> = (0..n).collect();
    by_src.sort_unstable_by_key(|&i| transfers[i].src);
    if transfers.iter().all(|t| t.dst <= t.src) {
        return Ok(by_src.into_iter().map(Step::Copy).collect());
    }
    if transfers.iter().all(|t| t.dst >= t.src) {
        return Ok(by_src.into_iter().rev().map(Step::Copy).collect());
    }
    // Edges a -> b: b's destination overlaps a's source (a != b). Sources are disjoint, so a
    // binary search finds the first source that could overlap and a short walk the rest.
    let starts: Vec<usize> = by_src.iter().map(|&i| transfers[i].src).collect();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut into: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (b, t) in transfers.iter().enumerate() {
        let end = t.dst + t.len;
        // The last source starting before `t.dst` may reach into it.
        let mut k = starts.partition_point(|&s| s < t.dst).saturating_sub(1);
        while k < n && starts[k] < end {
            let a = by_src[k];
            let s = &transfers[a];
            if a != b && s.src < end && t.dst < s.src + s.len {
                out[a].push(b);
                into[b].push(a);
            }
            k += 1;
        }
    }
    let mut indegree: Vec<usize> = into.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    ready.reverse();
    let mut saved = vec![false; n];
    let mut done = vec![false; n];
    let mut steps = Vec::with_capacity(n);
    let mut finished = 0;
    while finished < n {
        if let Some(i) = ready.pop() {
            done[i] = true;
            finished += 1;
            steps.push(if saved[i] { Step::Restore(i) } else { Step::Copy(i) });
            if !saved[i] {
                for &b in &out[i] {
                    indegree[b] -= 1;
                    if indegree[b] == 0 {
                        ready.push(b);
                    }
                }
            }
            continue;
        }
        // Stuck: every move left waits on another one. Walk predecessors until one repeats: it
        // sits on a cycle.
        if !bounce {
            return Err(n - finished);
        }
        let start = (0..n).find(|&i| !done[i] && !saved[i]).expect("a move is left that is not saved");
        let mut seen = vec![false; n];
        let mut at = start;
        while !seen[at] {
            seen[at] = true;
            at = *into[at].iter().find(|&&p| !done[p] && !saved[p]).expect("a waiting move has a waiting predecessor");
        }
        saved[at] = true;
        steps.push(Step::Save(at));
        for &b in &out[at] {
            indegree[b] -= 1;
            if indegree[b] == 0 {
                ready.push(b);
            }
        }
    }
    Ok(steps)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn t(src: usize, dst: usize, len: usize) -> Transfer {
        Transfer { src, dst, len }
    }

    /// Run the steps on a byte array and check every block landed with its own bytes.
    fn simulate(transfers: &[Transfer], steps: &[Step]) {
        let size = transfers.iter().map(|t| (t.src + t.len).max(t.dst + t.len)).max().unwrap_or(0);
        let mut mem = vec![0u16; size];
        for (i, t) in transfers.iter().enumerate() {
            for (k, cell) in mem[t.src..t.src + t.len].iter_mut().enumerate() {
                *cell = ((i as u16) << 8) | k as u16;
            }
        }
        let mut bounce: Vec<Option<Vec<u16>>> = vec![None; transfers.len()];
        for &step in steps {
            match step {
                Step::Copy(i) => {
                    let t = transfers[i];
                    mem.copy_within(t.src..t.src + t.len, t.dst);
                }
                Step::Save(i) => {
                    let t = transfers[i];
                    bounce[i] = Some(mem[t.src..t.src + t.len].to_vec());
                }
                Step::Restore(i) => {
                    let t = transfers[i];
                    mem[t.dst..t.dst + t.len].copy_from_slice(bounce[i].as_ref().unwrap());
                }
            }
        }
        for (i, t) in transfers.iter().enumerate() {
            for k in 0..t.len {
                assert_eq!(mem[t.dst + k], ((i as u16) << 8) | k as u16, "move {i} byte {k}");
            }
        }
    }

    #[test]
    fn slides_down_in_source_order() {
        let ts = [t(40, 30, 10), t(10, 0, 10), t(25, 10, 15)];
        let steps = order(&ts, false).unwrap();
        assert_eq!(steps, vec![Step::Copy(1), Step::Copy(2), Step::Copy(0)]);
        simulate(&ts, &steps);
    }

    #[test]
    fn slides_up_in_reverse_source_order() {
        let ts = [t(0, 5, 10), t(10, 15, 10)];
        let steps = order(&ts, false).unwrap();
        simulate(&ts, &steps);
    }

    #[test]
    fn mixed_directions_follow_dependencies() {
        // 0 moves right into 1's source; 1 moves left into free space.
        let ts = [t(0, 12, 8), t(10, 30, 8), t(40, 2, 4)];
        let steps = order(&ts, false).unwrap();
        simulate(&ts, &steps);
        let pos = |i| steps.iter().position(|&s| s == Step::Copy(i)).unwrap();
        assert!(pos(1) < pos(0));
    }

    #[test]
    fn a_swap_is_a_cycle_refused_without_bounce_and_broken_with_it() {
        let ts = [t(0, 16, 16), t(16, 0, 16)];
        assert_eq!(order(&ts, false), Err(2));
        let steps = order(&ts, true).unwrap();
        assert_eq!(steps.iter().filter(|s| matches!(s, Step::Save(_))).count(), 1);
        simulate(&ts, &steps);
    }

    #[test]
    fn a_three_cycle_with_a_tail_needs_one_bounce() {
        let ts = [t(0, 10, 10), t(10, 20, 10), t(20, 0, 10), t(30, 45, 5), t(50, 31, 5)];
        let steps = order(&ts, true).unwrap();
        assert_eq!(steps.iter().filter(|s| matches!(s, Step::Save(_))).count(), 1);
        simulate(&ts, &steps);
    }

    #[test]
    fn random_permutations_always_land() {
        let mut rng = 12345u64;
        for round in 0..300 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = 1 + (rng >> 59) as usize;
            // n slots of 8 bytes; move a random subset to a random permutation of slots.
            let mut slots: Vec<usize> = (0..n + 2).collect();
            for i in (1..slots.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                slots.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let ts: Vec<Transfer> = (0..n).map(|i| t(i * 8, slots[i] * 8, 8)).filter(|x| x.src != x.dst).collect();
            let steps = order(&ts, true).unwrap_or_else(|e| panic!("round {round}: {e}"));
            simulate(&ts, &steps);
        }
    }
}
