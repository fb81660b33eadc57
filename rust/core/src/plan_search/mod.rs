//! Exact search for static memory packing: the inner loop of the Python lifetime planner
//! (`npumem.plan`).
//!
//! A *component* is a set of buffers, each live in a contiguous range of time *sections*, with
//! a size and a power-of-two alignment, plus the byte ranges of pinned buffers each one must
//! avoid. [`search`] runs one depth-first search over *canonical* packings (every buffer at the
//! lowest aligned offset above the buffers placed before it, offsets never decreasing along a
//! branch) with cross-section inference, a push-down dominance rule and symmetry breaking; the
//! Python module `npumem.plan.search` documents why each rule keeps an optimal packing
//! reachable and drives restarts and time limits around this function.
//!
//! [`Timeline`] holds a whole problem (every buffer, not one component) for the passes that
//! must stay fast at millions of buffers: the live-bytes bound, the pairs counted, the overlap
//! check of a packing ([`Timeline::first_overlap`]) and the greedy placements
//! ([`place_in_order`], [`linear_scan`]).
//!
//! Pure Rust, no PyO3: `rust/python/src/plan_search.rs` is the binding.

mod clock;
mod decide;
mod free_ranges;
mod greedy;
mod instance;
mod lowest;
mod search;
#[cfg(test)]
mod test_instances;
mod timeline;

pub use decide::{decide, Decision, Key, Order, Verdict};
pub use greedy::{linear_scan, place_in_order, OverlapIndex, LATE_WALK};
pub use instance::{PackingError, PackingInstance, MAX_SPAN};
pub use search::{search, Limits, Outcome};
pub use timeline::Timeline;
