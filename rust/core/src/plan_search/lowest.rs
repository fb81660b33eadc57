//! A range-minimum tree over the sections `base .. base + len` of a component: `chmin` lowers
//! every section of a range to at most a value, `finish` pushes the minima down to the leaves,
//! `leaf` reads one section's minimum.

/// Range-min over the sections `base .. base + len`.
pub(crate) struct Lowest {
    base: usize,
    width: usize,
    tag: Vec<u64>,
}

impl Lowest {
    /// A tree over `len` sections from `base`, every section at `u64::MAX`.
    pub(crate) fn new(base: usize, len: usize) -> Self {
        let width = len.next_power_of_two().max(1);
        Self { base, width, tag: vec![u64::MAX; 2 * width] }
    }

    /// Every section back to `u64::MAX`.
    pub(crate) fn reset(&mut self) {
        self.tag.fill(u64::MAX);
    }

    /// Lowers the sections `lo .. hi` to at most `value`.
    pub(crate) fn chmin(&mut self, lo: usize, hi: usize, value: u64) {
        let (mut l, mut r) = (lo - self.base + self.width, hi - self.base + self.width);
        while l < r {
            if l & 1 == 1 {
                self.tag[l] = self.tag[l].min(value);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.tag[r] = self.tag[r].min(value);
            }
            l >>= 1;
            r >>= 1;
        }
    }

    /// Pushes the minima to the leaves: call after the last `chmin`, before `leaf`.
    pub(crate) fn finish(&mut self) {
        for i in 1..self.width {
            let t = self.tag[i];
            if t != u64::MAX {
                self.tag[2 * i] = self.tag[2 * i].min(t);
                self.tag[2 * i + 1] = self.tag[2 * i + 1].min(t);
            }
        }
    }

    /// The minimum of section `s`.
    pub(crate) fn leaf(&self, s: usize) -> u64 {
        self.tag[self.width + s - self.base]
    }
}
