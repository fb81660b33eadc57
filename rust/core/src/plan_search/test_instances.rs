//! Test helpers shared by the searches' tests: packing instances written as (lower, upper, size)
//! triples, and a small seeded generator.

use crate::plan_search::instance::PackingInstance;

/// Buffers given as (lower, upper, size) over time steps; sections are the unit steps.
pub(crate) fn instance(buffers: &[(u32, u32, u64)]) -> PackingInstance {
    aligned(buffers, &vec![1; buffers.len()])
}

/// The same with an alignment per buffer.
pub(crate) fn aligned(buffers: &[(u32, u32, u64)], alignments: &[u64]) -> PackingInstance {
    let n_sections = buffers.iter().map(|b| b.1).max().unwrap_or(0) as usize;
    let neighbors: Vec<Vec<u32>> = (0..buffers.len())
        .map(|i| {
            (0..buffers.len())
                .filter(|&j| j != i && buffers[i].0 < buffers[j].1 && buffers[j].0 < buffers[i].1)
                .map(|j| j as u32)
                .collect()
        })
        .collect();
    PackingInstance::new(
        buffers.iter().map(|b| b.2).collect(),
        alignments,
        buffers.iter().map(|b| b.0).collect(),
        buffers.iter().map(|b| b.1).collect(),
        n_sections,
        &neighbors,
        &vec![Vec::new(); buffers.len()],
    )
    .expect("valid instance")
}

/// A small deterministic generator (xorshift64*), so that every run checks the same cases.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }
}

/// `n` random buffers for the searches' tests: each starts at one of the first `starts` steps,
/// lives 1 to 4 steps and takes 1 to 9 bytes.
pub(crate) fn random_buffers(rng: &mut Rng, n: usize, starts: u64) -> Vec<(u32, u32, u64)> {
    (0..n)
        .map(|_| {
            let lo = rng.below(starts) as u32;
            (lo, lo + 1 + rng.below(4) as u32, 1 + rng.below(9))
        })
        .collect()
}
