//! What the page table counts, for `stats()`.

/// The page table at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounts {
    /// Sequences in the table.
    pub sequences: usize,
    /// Pages referenced by at least one sequence.
    pub pages_in_use: usize,
    /// Pages referenced by more than one sequence.
    pub pages_shared: usize,
    /// Pages the sequences would hold without sharing (the sum of their page counts).
    pub pages_logical: usize,
    /// Tokens of all sequences (a shared prompt counts once per sequence).
    pub tokens: u64,
    /// Token slots allocated but unused: the empty tail of each partly filled page, once per page.
    pub waste_tokens: u64,
    /// Pages copied because a sequence appended to a shared, partly filled last page.
    pub copies: u64,
}
