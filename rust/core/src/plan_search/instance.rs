//! One component of a lifetime-planning problem, checked and in compressed-sparse-row form:
//! the input of `search`.

use std::fmt;

/// Why a [`PackingInstance`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackingError(pub String);

impl fmt::Display for PackingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PackingError {}

/// The most bytes a packing may span, as many as a plan can address (`npumem.plan`'s
/// `MAX_PLAN_BYTES`). [`PackingInstance::new`] refuses a buffer larger than this, an obstacle
/// that ends beyond it and a section whose buffers add up to more; the searches cut every
/// capacity to it. So every floor is at most the span, an aligned offset above one at most
/// 2^63 (a multiple of every power-of-two alignment of 64 bits) and an offset plus a size below
/// 2^64; the searches' lower bounds that add more than one such value saturate, and
/// `capacity + 1` fits.
pub const MAX_SPAN: u64 = (1 << 63) - 1;

/// One component to pack, in compressed-sparse-row form.
#[derive(Debug, Clone)]
pub struct PackingInstance {
    pub(crate) sizes: Vec<u64>,
    pub(crate) align_mask: Vec<u64>,
    pub(crate) sec_lo: Vec<u32>,
    pub(crate) sec_hi: Vec<u32>,
    pub(crate) n_sections: usize,
    pub(crate) nbr_start: Vec<u32>,
    pub(crate) nbr: Vec<u32>,
    pub(crate) obs_start: Vec<u32>,
    pub(crate) obs: Vec<(u64, u64)>,
    /// Every size and alignment padding plus the highest obstacle end, or [`MAX_SPAN`] when
    /// that is less: no canonical packing ends above the first, and none beyond the second is
    /// asked for, so a capacity above it is as good as it.
    pub(crate) span: u64,
}

/// `x` rounded up to a multiple of `mask + 1` (a power of two), or `u64::MAX` when that is
/// beyond 64 bits (then above every capacity).
#[inline]
pub(crate) fn align_up(x: u64, mask: u64) -> u64 {
    x.checked_add(mask).map_or(u64::MAX, |v| v & !mask)
}

impl PackingInstance {
    /// Builds and checks a component.
    ///
    /// * `sizes[i] > 0`, `alignments[i]` a power of two;
    /// * buffer `i` is live in sections `sec_lo[i] .. sec_hi[i]` (non-empty, below `n_sections`);
    /// * `neighbors[i]`: the buffers live at the same time as `i`, that is those whose sections
    ///   meet `i`'s, each once (so the lists are symmetric);
    /// * `obstacles[i]`: sorted, disjoint byte ranges `[start, end)` of pinned buffers live at
    ///   the same time as `i`;
    /// * every size, every obstacle end and the sizes of the buffers live in each section
    ///   added up are at most [`MAX_SPAN`] bytes (more could never be packed within it).
    pub fn new(
        sizes: Vec<u64>,
        alignments: &[u64],
        sec_lo: Vec<u32>,
        sec_hi: Vec<u32>,
        n_sections: usize,
        neighbors: &[Vec<u32>],
        obstacles: &[Vec<(u64, u64)>],
    ) -> Result<Self, PackingError> {
        let n = sizes.len();
        for (what, len) in [
            ("alignments", alignments.len()),
            ("sec_lo", sec_lo.len()),
            ("sec_hi", sec_hi.len()),
            ("neighbors", neighbors.len()),
            ("obstacles", obstacles.len()),
        ] {
            if len != n {
                return Err(PackingError(format!("{what} has {len} entries for {n} buffers")));
            }
        }
        let mut nbr_start = Vec::with_capacity(n + 1);
        let mut nbr = Vec::new();
        let mut obs_start = Vec::with_capacity(n + 1);
        let mut obs = Vec::new();
        let mut span: u128 = 0;
        nbr_start.push(0);
        obs_start.push(0);
        for i in 0..n {
            if sizes[i] == 0 {
                return Err(PackingError(format!("buffer {i} has size 0")));
            }
            if !alignments[i].is_power_of_two() {
                return Err(PackingError(format!("buffer {i}: alignment {} is not a power of two", alignments[i])));
            }
            if sizes[i] > MAX_SPAN {
                return Err(PackingError(format!(
                    "buffer {i}: size {} is more than the {MAX_SPAN} bytes (2^63 - 1) a packing may span",
                    sizes[i]
                )));
            }
            span += u128::from(sizes[i]) + u128::from(alignments[i] - 1);
            if sec_lo[i] >= sec_hi[i] || sec_hi[i] as usize > n_sections {
                return Err(PackingError(format!(
                    "buffer {i}: sections {}..{} are empty or beyond {n_sections}",
                    sec_lo[i], sec_hi[i]
                )));
            }
            for &j in &neighbors[i] {
                if j as usize >= n || j as usize == i {
                    return Err(PackingError(format!("buffer {i}: bad neighbor {j}")));
                }
                let j = j as usize;
                if sec_lo[j] >= sec_hi[i] || sec_lo[i] >= sec_hi[j] {
                    return Err(PackingError(format!("buffer {i}: neighbor {j} is not live in any of its sections")));
                }
            }
            let mut by_size = neighbors[i].clone();
            by_size.sort_unstable_by_key(|&j| (sizes[j as usize], j));
            if let Some(twice) = by_size.windows(2).find(|w| w[0] == w[1]) {
                return Err(PackingError(format!("buffer {i}: neighbor {} is listed twice", twice[0])));
            }
            nbr.extend_from_slice(&by_size);
            nbr_start.push(
                u32::try_from(nbr.len())
                    .map_err(|_| PackingError("too many neighbor pairs (more than 2^32)".to_string()))?,
            );
            let mut prev_end = 0;
            for &(start, end) in &obstacles[i] {
                if start >= end || start < prev_end {
                    return Err(PackingError(format!("buffer {i}: obstacles must be sorted, disjoint and non-empty")));
                }
                if end > MAX_SPAN {
                    return Err(PackingError(format!(
                        "buffer {i}: an obstacle ends at {end}, beyond the {MAX_SPAN} bytes (2^63 - 1) a packing \
                         may span"
                    )));
                }
                prev_end = end;
            }
            obs.extend_from_slice(&obstacles[i]);
            obs_start.push(
                u32::try_from(obs.len())
                    .map_err(|_| PackingError("too many obstacles (more than 2^32)".to_string()))?,
            );
        }
        // Every pair of buffers whose sections meet is listed: the valid distinct entries are
        // as many as the ordered pairs that meet (all pairs, less those where one ends before
        // the other starts).
        let mut ends = sec_hi.clone();
        ends.sort_unstable();
        let apart: u64 = sec_lo.iter().map(|&lo| ends.partition_point(|&hi| hi <= lo) as u64).sum();
        let meeting = (n as u64) * (n as u64).saturating_sub(1) - 2 * apart;
        if nbr.len() as u64 != meeting {
            return Err(PackingError(format!(
                "the neighbor lists name {} pairs, but {} pairs of buffers share a section",
                nbr.len() / 2,
                meeting / 2
            )));
        }
        span += u128::from(obs.iter().map(|&(_, end)| end).max().unwrap_or(0));
        // The bytes live in each section (differences along the sections, in 128 bits).
        let mut live = vec![0i128; n_sections.min(sec_hi.iter().max().map_or(0, |&hi| hi as usize)) + 1];
        for i in 0..n {
            live[sec_lo[i] as usize] += i128::from(sizes[i]);
            live[sec_hi[i] as usize] -= i128::from(sizes[i]);
        }
        let mut bytes = 0i128;
        for (s, change) in live.iter().enumerate() {
            bytes += change;
            if bytes > i128::from(MAX_SPAN) {
                return Err(PackingError(format!(
                    "the buffers live in section {s} add up to {bytes} bytes, more than the {MAX_SPAN} \
                     (2^63 - 1) a packing may span"
                )));
            }
        }
        // Sections after the last buffer's are empty: the search keeps none of them.
        let n_sections = n_sections.min(sec_hi.iter().max().map_or(0, |&hi| hi as usize));
        Ok(Self {
            span: span.min(u128::from(MAX_SPAN)) as u64,
            align_mask: alignments.iter().map(|a| a - 1).collect(),
            sizes,
            sec_lo,
            sec_hi,
            n_sections,
            nbr_start,
            nbr,
            obs_start,
            obs,
        })
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether there is no buffer.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The buffers live at the same time as `i`, smallest first.
    pub(crate) fn neighbors(&self, i: usize) -> &[u32] {
        &self.nbr[self.nbr_start[i] as usize..self.nbr_start[i + 1] as usize]
    }

    /// Size of the smallest buffer live at the same time as `i` that is not `placed`.
    #[inline]
    pub(crate) fn smallest_unplaced_neighbor(&self, i: usize, placed: &[bool]) -> Option<u64> {
        self.neighbors(i).iter().find(|&&x| !placed[x as usize]).map(|&x| self.sizes[x as usize])
    }

    /// Lowest offset at or above `floor` for buffer `i`: aligned and clear of pinned buffers.
    pub(crate) fn raw_offset(&self, i: usize, floor: u64) -> u64 {
        let mask = self.align_mask[i];
        let mut offset = (floor + mask) & !mask;
        let size = self.sizes[i];
        for &(start, end) in &self.obs[self.obs_start[i] as usize..self.obs_start[i + 1] as usize] {
            if offset + size <= start {
                break;
            }
            if end > offset {
                offset = (end + mask) & !mask;
            }
        }
        offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two buffers live together, of `a` and `b` bytes with alignments 1 and `align`.
    fn pair(a: u64, b: u64, align: u64) -> Result<PackingInstance, PackingError> {
        PackingInstance::new(vec![a, b], &[1, align], vec![0, 0], vec![1, 1], 1, &[vec![1], vec![0]], &[vec![], vec![]])
    }

    #[test]
    fn an_instance_that_no_packing_within_the_bound_can_hold_is_refused() {
        let err = pair(1 << 63, 8, 1).unwrap_err(); // one buffer too large
        assert!(err.0.contains("size 9223372036854775808 is more than the"), "{err}");
        let err = pair(1 << 62, 1 << 62, 1).unwrap_err(); // two live together: 2^63 bytes
        assert!(err.0.contains("section 0 add up to 9223372036854775808 bytes"), "{err}");
        let obstacles = [vec![(0, MAX_SPAN + 1)], vec![]];
        let err = PackingInstance::new(vec![1], &[1], vec![0], vec![1], 1, &[vec![]], &obstacles[..1]).unwrap_err();
        assert!(err.0.contains("obstacle ends at"), "{err}");
    }

    #[test]
    fn an_instance_whose_sizes_and_padding_add_up_beyond_the_bound_is_kept() {
        // Everything added up passes 2^63 - 1, but each buffer fits, and so may a packing.
        let inst = pair(1, 8, 1 << 63).unwrap();
        assert_eq!(inst.span, MAX_SPAN);
        let inst = pair(1 << 62, (1 << 62) - 1, 1 << 62).unwrap();
        assert_eq!(inst.span, MAX_SPAN);
        let obstacles = [vec![(0, MAX_SPAN)], vec![]];
        PackingInstance::new(vec![1], &[1], vec![0], vec![1], 1, &[vec![]], &obstacles[..1]).unwrap();
    }

    /// Three buffers: 0 and 1 share section 0, 2 lives alone in section 2.
    fn three(neighbors: &[Vec<u32>]) -> Result<PackingInstance, PackingError> {
        PackingInstance::new(
            vec![8, 8, 8],
            &[1, 1, 1],
            vec![0, 0, 2],
            vec![1, 2, 3],
            3,
            neighbors,
            &[vec![], vec![], vec![]],
        )
    }

    #[test]
    fn neighbor_lists_must_be_exactly_the_buffers_whose_sections_meet() {
        three(&[vec![1], vec![0], vec![]]).unwrap();
        let missing = three(&[vec![], vec![], vec![]]).unwrap_err();
        assert!(missing.0.contains("1 pairs of buffers share a section"), "{missing}");
        let one_way = three(&[vec![1], vec![], vec![]]).unwrap_err();
        assert!(one_way.0.contains("share a section"), "{one_way}");
        let apart = three(&[vec![1, 2], vec![0], vec![0]]).unwrap_err();
        assert!(apart.0.contains("neighbor 2 is not live in any of its sections"), "{apart}");
        let twice = three(&[vec![1, 1], vec![0], vec![]]).unwrap_err();
        assert!(twice.0.contains("listed twice"), "{twice}");
    }

    #[test]
    fn sections_after_the_last_buffer_s_are_not_kept() {
        let inst = PackingInstance::new(vec![8], &[1], vec![0], vec![1], usize::MAX, &[vec![]], &[vec![]]).unwrap();
        assert_eq!(inst.n_sections, 1);
    }
}
