//! Tags: the names blocks are labelled with, as the small ids the handle table stores, and the
//! counters by tag (`PoolStats.by_tag` in Python, `npumem_tag_stats` in C).
//!
//! **Ids.** Id 0 means "no tag". The first [`NAMED_TAGS`] names a pool sees get ids 1 to
//! [`NAMED_TAGS`] for the pool's life: they are *named* tags, each with counters of its own.
//! Later names get *pooled* ids (above [`NAMED_TAGS`]), which share one set of counters
//! ([`TagLabel::Others`]) and are recycled: a pooled id lives while blocks carry it. Every
//! allocation with a pooled tag takes a hold on its id ([`TagTable::acquire`]) and every free
//! gives it back ([`TagTable::release`]); an id no block holds becomes *idle*, the last
//! [`IDLE_TAGS`] idle names stay interned (a name used for one block at a time is not interned
//! anew on every allocation), and older ones are dropped and their ids reused.
//!
//! **Retired ids.** Trace events name tags by id, so an id must not be dropped (and reused for
//! another name) while an event that names it may still be drained: it is *retired* instead,
//! and dropped once no such event is left. Which retired ids are still named is asked of the
//! trace ([`TraceTags::tags_named`]): a read-only pass over the events every ring holds since
//! its last drain, whether the trace is drained or not (a trace left running as a flight
//! recorder overwrites its oldest events, and a quiet ring keeps its last ones indefinitely).
//! The pass costs O(the rings' capacity), so [`TagTable::release`] makes it only once the
//! retired list has grown by `max(SCAN_EVERY, capacity)` since the last pass: O(1) amortized
//! per retired id, on the pooled tags' slow path (under the table's lock), never on the
//! allocation path. After a drain ([`TagTable::trace_drained`]) the rings hold only what was
//! recorded since, so the pass is short and is made at once.
//!
//! The pass may miss an event being written while it reads (a slot overwritten under it is
//! skipped, as a drain skips it), and that is safe: such an event cannot name a retired id.
//! An id is retired only when no block holds it, and every event naming a block's tag (its
//! alloc, moves and free) is recorded while a hold covers it, before the hold is given back
//! under the table's lock; the pass runs under that lock, so no hold is given back during it,
//! and every event naming an unheld id was written before the lock was taken (the lock orders
//! its words before the pass's reads). Events that a drain has taken from the rings but whose
//! names the drainer has not read yet are covered by a [`TagPin`]: while one is held no id is
//! dropped. A drained event therefore always finds its own name.
//!
//! The table therefore holds the tags that live blocks carry, at most [`IDLE_TAGS`] idle ones,
//! the retired ones that events in the rings name, and fewer than `max(SCAN_EVERY, capacity)`
//! others, however many distinct names a program uses and whether or not the trace is drained.
//!
//! Counters are keyed on ids that never change their name (the named ids, the shared slot of
//! the pooled ones), so recycling a pooled id never mixes the figures of two names: a pooled
//! tag's figures are folded into [`TagLabel::Others`]. Blocks without a tag have no counters
//! here: they are the pool's blocks less the tagged ones, and the pool passes their figures to
//! [`TagTable::figures`] (`pool/tags.rs`).
//!
//! **Cost.** An untagged allocation or free counts nothing here. Named tags never take the
//! table's lock: their counters are updated with relaxed read-modify-write operations, by
//! whoever allocated or freed (the binding and the C ABI; the core's allocation path knows
//! nothing of them). Only pooled tags (a program that labels each request differently) take
//! the lock, once per allocation and once per free, outside the core's lock-free allocation
//! path.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Tags with counters of their own (ids 1 to this); later tags share one set of counters.
pub const NAMED_TAGS: u32 = 63;
/// Pooled tags no block carries that stay interned (the oldest beyond this are dropped).
pub const IDLE_TAGS: usize = 1024;
/// Fewest retired ids between two passes over the trace's rings (see the module documentation).
pub(crate) const SCAN_EVERY: usize = 4096;
/// The label of the counters that pooled tags share.
pub const OTHER_TAGS: &str = "(other tags)";
/// The longest tag, in bytes of UTF-8. A tag is a label: it is written with every event of a
/// trace that names it (in a Perfetto export, once per slice) and kept while idle, so its
/// length bounds those files and the table.
pub const MAX_TAG_BYTES: usize = 256;
/// Counter slots: the named tags, then the pooled ones.
const SLOTS: usize = NAMED_TAGS as usize + 1;

/// Whose figures a [`TagFigures`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagLabel {
    /// Blocks without a tag.
    Untagged,
    /// One named tag.
    Named(Arc<str>),
    /// Every pooled tag together ([`OTHER_TAGS`]).
    Others,
}

/// One tag's share of a pool: its live blocks, the bytes they asked for, and the peak of those
/// bytes (since the pool was made or [`Pool::reset_tag_peaks`](crate::Pool::reset_tag_peaks)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagFigures {
    pub label: TagLabel,
    pub blocks_in_use: usize,
    pub requested_bytes_in_use: usize,
    pub peak_requested_bytes_in_use: usize,
}

/// The figures of the blocks counted under no tag, which the pool derives from its own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UntaggedFigures {
    pub blocks_in_use: usize,
    pub requested_bytes_in_use: usize,
    pub peak_requested_bytes_in_use: usize,
}

/// Where the trace stands, as far as tag ids are concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceProgress {
    /// Whether events may still name a tag: recording, or events not yet drained.
    pub pending: bool,
    /// Events the rings hold at most.
    pub capacity: usize,
}

/// What the tag table asks of the trace before it drops an idle id (the pool's trace).
pub trait TraceTags {
    /// Where the trace stands.
    fn progress(&self) -> TraceProgress;
    /// Add to `out` the ids that the events still to be drained name, except perhaps those of
    /// events being written meanwhile (whose blocks hold their tags).
    fn tags_named(&self, out: &mut HashSet<u32>);
}

/// No trace: nothing names a tag.
#[cfg(test)]
pub(crate) struct NoTrace;

#[cfg(test)]
impl TraceTags for NoTrace {
    fn progress(&self) -> TraceProgress {
        TraceProgress::default()
    }

    fn tags_named(&self, _: &mut HashSet<u32>) {}
}

#[derive(Default)]
#[repr(align(128))]
struct Counter {
    blocks: AtomicUsize,
    bytes: AtomicUsize,
    peak: AtomicUsize,
}

/// The name table: every interned name by id and back, and the holds on pooled ids.
#[derive(Default)]
struct Names {
    by_name: HashMap<Arc<str>, u32>,
    /// Index = id (index 0, "no tag", stays `None`).
    names: Vec<Option<Arc<str>>>,
    /// Blocks holding each pooled id (indexed by id; named ids are never counted).
    holds: Vec<u64>,
    /// Dropped pooled ids, to hand out again.
    free: Vec<u32>,
    /// Pooled ids whose blocks were all freed, oldest first (an id may appear more than once and
    /// may be held again since).
    idle: VecDeque<u32>,
    /// Pooled ids no block holds that trace events may name (an id may appear more than once
    /// and may be held again since).
    retired: Vec<u32>,
    /// The length of `retired` beyond which the next release asks the trace which it names.
    scan_at: usize,
    /// Drains whose events' names are still being read ([`TagPin`]): no id is dropped meanwhile.
    pins: usize,
}

/// A pool's tags and its counters by tag.
pub struct TagTable {
    counters: [Counter; SLOTS],
    /// Ids handed out so far, at most [`NAMED_TAGS`] + 1 (read without the lock for named ids).
    named: AtomicU32,
    names: Mutex<Names>,
}

/// A drain whose events' names are being read: while one is held no tag id is dropped
/// ([`TagTable::pin`]).
pub struct TagPin<'a>(&'a TagTable);

impl Drop for TagPin<'_> {
    fn drop(&mut self) {
        self.0.lock().pins -= 1;
    }
}

impl Default for TagTable {
    fn default() -> TagTable {
        TagTable::new()
    }
}

fn host(what: &'static str) -> Error {
    Error::HostMemory { what, bytes: 0 }
}

impl Names {
    /// The id of `name`, interned if new (`NAMED_TAGS` first ids for the first names).
    fn intern(&mut self, name: &str, named: &AtomicU32) -> Result<u32> {
        if let Some(&id) = self.by_name.get(name) {
            return Ok(id);
        }
        self.by_name.try_reserve(1).map_err(|_| host("the tag table"))?;
        self.names.try_reserve(1).map_err(|_| host("the tag table"))?;
        self.holds.try_reserve(1).map_err(|_| host("the tag table"))?;
        if self.names.is_empty() {
            self.names.push(None);
            self.holds.push(0);
        }
        let name: Arc<str> = Arc::from(name);
        let id = match self.free.pop() {
            Some(id) => {
                self.names[id as usize] = Some(name.clone());
                id
            }
            None => {
                let id = u32::try_from(self.names.len()).map_err(|_| host("the tag table"))?;
                self.names.push(Some(name.clone()));
                self.holds.push(0);
                if id <= NAMED_TAGS {
                    named.store(id + 1, Ordering::Release);
                }
                id
            }
        };
        self.by_name.insert(name, id);
        Ok(id)
    }

    fn drop_id(&mut self, id: u32) {
        if let Some(name) = self.names[id as usize].take() {
            self.by_name.remove(&name);
            self.free.push(id);
        }
    }

    /// Drop the retired ids that no event to be drained names and no block holds: all of them
    /// when the trace has no such events; otherwise, when `force` or when `retired` has grown
    /// past `scan_at`, those the trace's events do not name. Nothing while a drain is pinned.
    fn drop_retired(&mut self, trace: &dyn TraceTags, progress: TraceProgress, force: bool) {
        if self.pins > 0 || self.retired.is_empty() {
            return;
        }
        let mut named = HashSet::new();
        if progress.pending {
            if !force && self.retired.len() <= self.scan_at {
                return;
            }
            trace.tags_named(&mut named);
        }
        let mut retired = std::mem::take(&mut self.retired);
        retired.retain(|&id| {
            if self.holds[id as usize] > 0 || self.names[id as usize].is_none() {
                return false; // held again (idle again when released), or already dropped
            }
            if named.contains(&id) {
                return true;
            }
            self.drop_id(id);
            false
        });
        retired.sort_unstable();
        retired.dedup();
        self.retired = retired;
        self.scan_at = self.retired.len() + SCAN_EVERY.max(progress.capacity);
    }
}

impl TagTable {
    pub fn new() -> TagTable {
        TagTable {
            counters: std::array::from_fn(|_| Counter::default()),
            named: AtomicU32::new(1),
            names: Mutex::new(Names::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The tag a block asked for with id `id` is stored and counted under: `id` when it is 0, a
    /// named tag handed out, or a pooled id (the caller holds it); 0 for an id of the named
    /// range that no name has yet, so that such a block counts with the untagged ones for its
    /// whole life (its free reads the id its slot stored), even if a name takes the id later.
    #[inline]
    pub(crate) fn stored(&self, id: u32) -> u32 {
        if id > NAMED_TAGS || self.is_named(id) {
            id
        } else {
            0
        }
    }

    /// Whether `id` is 0 or a named tag already handed out: ids that need no hold.
    #[inline]
    pub fn is_named(&self, id: u32) -> bool {
        id < self.named.load(Ordering::Acquire)
    }

    /// The id of `name` (interned on first use), with `blocks` holds taken on it when it is
    /// pooled; refused for the empty name, [`OTHER_TAGS`] and names longer than
    /// [`MAX_TAG_BYTES`]. Give the holds back with
    /// [`TagTable::release`] as the blocks are freed (or at once, with the same count, when the
    /// allocation fails).
    pub fn acquire(&self, name: &str, blocks: u64) -> Result<u32> {
        if name.is_empty() {
            // Untagged blocks are reported with an empty tag (Prometheus labels, JSON).
            return Err(Error::Config {
                field: "tag",
                reason: "must not be empty (an empty tag reads as no tag)".to_string(),
            });
        }
        if name == OTHER_TAGS {
            // That row is every pooled tag's: a tag of this name would list a second one.
            return Err(Error::Config {
                field: "tag",
                reason: format!("{OTHER_TAGS:?} names the row of the pooled tags; choose another name"),
            });
        }
        if name.len() > MAX_TAG_BYTES {
            return Err(Error::Config {
                field: "tag",
                reason: format!("is {} bytes long; a tag is at most {MAX_TAG_BYTES} bytes of UTF-8", name.len()),
            });
        }
        let mut names = self.lock();
        let id = names.intern(name, &self.named)?;
        if id > NAMED_TAGS {
            names.holds[id as usize] += blocks;
        }
        Ok(id)
    }

    /// Take `blocks` holds on `id`, an id this table handed out and that is held now (a block
    /// carries it, or an earlier hold is not given back yet). Named ids need none.
    pub fn hold(&self, id: u32, blocks: u64) -> Result<()> {
        if self.is_named(id) {
            return Ok(());
        }
        let mut names = self.lock();
        match names.names.get(id as usize) {
            Some(Some(_)) => {
                names.holds[id as usize] += blocks;
                Ok(())
            }
            _ => Err(Error::Config { field: "tag", reason: format!("{id} is not a tag id of this pool") }),
        }
    }

    /// Give back `blocks` holds on `id` (freed blocks, or an allocation that failed). A pooled id
    /// no block holds becomes idle; the oldest idle ids beyond [`IDLE_TAGS`] are dropped, or
    /// retired while `trace` may still name them (see the module documentation). Refused, with
    /// nothing changed, for more holds than `id` has: the id could be dropped while blocks still
    /// carry it, and their figures would count under another tag.
    pub fn release(&self, id: u32, blocks: u64, trace: &dyn TraceTags) -> Result<()> {
        if id <= NAMED_TAGS || blocks == 0 {
            return Ok(());
        }
        let mut names = self.lock();
        let held = names.holds.get(id as usize).copied().unwrap_or(0);
        if blocks > held {
            return Err(Error::Config {
                field: "tag",
                reason: format!("{blocks} holds given back on tag id {id}, which has {held}"),
            });
        }
        let count = &mut names.holds[id as usize];
        *count -= blocks;
        if *count > 0 {
            return Ok(());
        }
        names.idle.push_back(id);
        if names.idle.len() <= IDLE_TAGS {
            return Ok(());
        }
        let progress = trace.progress();
        names.drop_retired(trace, progress, false);
        let retire = progress.pending || names.pins > 0;
        while names.idle.len() > IDLE_TAGS / 2 {
            let Some(old) = names.idle.pop_front() else { break };
            if names.holds[old as usize] > 0 || names.names[old as usize].is_none() {
                continue;
            }
            if retire {
                names.retired.push(old);
            } else {
                names.drop_id(old);
            }
        }
        Ok(())
    }

    /// Keep every id while the events of a drain are named: take this before the drain and
    /// give it up once their names are read, then call [`TagTable::trace_drained`].
    pub fn pin(&self) -> TagPin<'_> {
        self.lock().pins += 1;
        TagPin(self)
    }

    /// Drop the retired ids the trace no longer names (after a drain, once its events' names
    /// are read): the rings hold only what was recorded since the drain, so the pass is short.
    pub fn trace_drained(&self, trace: &dyn TraceTags) {
        let mut names = self.lock();
        if !names.retired.is_empty() {
            names.drop_retired(trace, trace.progress(), true);
        }
    }

    /// Retired ids kept now (whose names events in the trace may carry).
    #[cfg(test)]
    pub(crate) fn retired(&self) -> usize {
        self.lock().retired.len()
    }

    /// The name of `id` (None for 0 or an id not interned now).
    pub fn name(&self, id: u32) -> Option<Arc<str>> {
        if id == 0 {
            return None;
        }
        self.lock().names.get(id as usize).cloned().flatten()
    }

    /// Names interned now (the table's size).
    pub fn interned(&self) -> usize {
        self.lock().by_name.len()
    }

    /// The counters of tag `id` (not 0): its own for a named id, the shared ones for a pooled id.
    #[inline]
    fn counter(&self, id: u32) -> &Counter {
        debug_assert_ne!(id, 0, "untagged blocks have no counters by tag");
        &self.counters[(id as usize).saturating_sub(1).min(SLOTS - 1)]
    }

    /// `blocks` blocks of `nbytes` bytes in all, tagged `id` (not 0), were allocated.
    #[inline]
    pub(crate) fn on_alloc(&self, id: u32, blocks: usize, nbytes: usize) {
        let c = self.counter(id);
        c.blocks.fetch_add(blocks, Ordering::Relaxed);
        c.bytes.fetch_add(nbytes, Ordering::Relaxed);
    }

    /// Blocks counted under tag `id` (not 0) with [`TagTable::on_alloc`] were allocated: the
    /// tag's peak rises to its bytes in use now. (An allocation that fails raises no peak.)
    #[inline]
    pub(crate) fn on_allocated(&self, id: u32) {
        let c = self.counter(id);
        let bytes = c.bytes.load(Ordering::Relaxed);
        if bytes > c.peak.load(Ordering::Relaxed) {
            c.peak.fetch_max(bytes, Ordering::Relaxed);
        }
    }

    /// `blocks` blocks of `nbytes` bytes in all, tagged `id` (not 0), were freed.
    #[inline]
    pub(crate) fn on_free(&self, id: u32, blocks: usize, nbytes: usize) {
        let c = self.counter(id);
        c.blocks.fetch_sub(blocks, Ordering::Relaxed);
        c.bytes.fetch_sub(nbytes, Ordering::Relaxed);
    }

    /// Blocks counted under every tag together.
    pub(crate) fn tagged_blocks(&self) -> usize {
        self.counters.iter().fold(0usize, |blocks, c| blocks.wrapping_add(c.blocks.load(Ordering::Relaxed)))
    }

    /// Every tag's peak back to its bytes in use now.
    pub(crate) fn reset_peaks(&self) {
        for c in &self.counters {
            c.peak.store(c.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// The figures of every tag that has had a block, and `untagged`'s if any block has been
    /// counted there, largest bytes in use first.
    pub(crate) fn figures(&self, untagged: UntaggedFigures) -> Vec<TagFigures> {
        let names = self.lock();
        let mut out: Vec<TagFigures> = self
            .counters
            .iter()
            .enumerate()
            .filter(|(_, c)| c.peak.load(Ordering::Relaxed) > 0 || c.blocks.load(Ordering::Relaxed) > 0)
            .filter_map(|(i, c)| {
                let label = match i + 1 {
                    id if id < SLOTS => TagLabel::Named(names.names.get(id).cloned().flatten()?),
                    _ => TagLabel::Others,
                };
                // Counters updated by racing threads may be read half-way: never report a count
                // below zero (a free counted before its allocation).
                let blocks = c.blocks.load(Ordering::Relaxed);
                let bytes = c.bytes.load(Ordering::Relaxed);
                Some(TagFigures {
                    label,
                    blocks_in_use: if blocks > isize::MAX as usize { 0 } else { blocks },
                    requested_bytes_in_use: if bytes > isize::MAX as usize { 0 } else { bytes },
                    peak_requested_bytes_in_use: c.peak.load(Ordering::Relaxed),
                })
            })
            .collect();
        if untagged.blocks_in_use > 0 || untagged.peak_requested_bytes_in_use > 0 {
            out.push(TagFigures {
                label: TagLabel::Untagged,
                blocks_in_use: untagged.blocks_in_use,
                requested_bytes_in_use: untagged.requested_bytes_in_use,
                peak_requested_bytes_in_use: untagged.peak_requested_bytes_in_use,
            });
        }
        out.sort_by(|a, b| {
            b.requested_bytes_in_use
                .cmp(&a.requested_bytes_in_use)
                .then_with(|| label_key(&a.label).cmp(&label_key(&b.label)))
        });
        out
    }
}

fn label_key(label: &TagLabel) -> (u8, &str) {
    match label {
        TagLabel::Untagged => (0, ""),
        TagLabel::Named(name) => (1, name),
        TagLabel::Others => (1, OTHER_TAGS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::{Cell, RefCell};

    const NO_TRACE: &NoTrace = &NoTrace;

    /// A trace that records, names the ids in `named`, and counts the passes asked of it.
    struct FakeTrace {
        pending: Cell<bool>,
        named: RefCell<HashSet<u32>>,
        passes: Cell<usize>,
    }

    impl FakeTrace {
        fn new() -> FakeTrace {
            FakeTrace { pending: Cell::new(true), named: RefCell::default(), passes: Cell::new(0) }
        }
    }

    impl TraceTags for FakeTrace {
        fn progress(&self) -> TraceProgress {
            TraceProgress { pending: self.pending.get(), capacity: 64 }
        }

        fn tags_named(&self, out: &mut HashSet<u32>) {
            self.passes.set(self.passes.get() + 1);
            out.extend(self.named.borrow().iter().copied());
        }
    }

    #[test]
    fn giving_back_more_holds_than_taken_or_an_empty_name_is_refused() {
        let t = TagTable::new();
        for i in 0..NAMED_TAGS {
            t.acquire(&format!("named-{i}"), 0).unwrap();
        }
        assert!(matches!(t.acquire("", 1), Err(Error::Config { field: "tag", .. })));
        let id = t.acquire("pooled", 2).unwrap();
        assert!(id > NAMED_TAGS);
        let err = t.release(id, 3, NO_TRACE).unwrap_err();
        assert!(err.to_string().contains("3 holds given back on tag id"), "{err}");
        // Nothing changed: both holds are still there, and the name stays while they are.
        t.release(id, 1, NO_TRACE).unwrap();
        assert!(t.release(id, 2, NO_TRACE).is_err());
        t.release(id, 1, NO_TRACE).unwrap();
        assert!(t.release(id, 1, NO_TRACE).is_err());
        assert_eq!(t.name(id).as_deref(), Some("pooled"));
        assert!(t.release(u32::MAX, 1, NO_TRACE).is_err());
        t.release(id, 0, NO_TRACE).unwrap();
    }

    #[test]
    fn a_tag_longer_than_the_limit_is_refused_and_interns_nothing() {
        let t = TagTable::new();
        // A two-byte character: the limit counts bytes, not characters.
        let longest = "\u{e9}".repeat(MAX_TAG_BYTES / 2);
        let too_long = format!("{longest}x");
        let err = t.acquire(&too_long, 1).unwrap_err();
        assert!(matches!(err, Error::Config { field: "tag", .. }), "{err}");
        assert!(err.to_string().contains(&format!("is {} bytes long", MAX_TAG_BYTES + 1)), "{err}");
        assert_eq!(t.interned(), 0, "a refused tag takes no id");
        let id = t.acquire(&longest, 1).unwrap();
        assert_eq!(t.name(id).as_deref(), Some(longest.as_str()));
    }

    #[test]
    fn an_allocation_that_failed_raises_no_peak() {
        let t = TagTable::new();
        let a = t.acquire("a", 2).unwrap();
        t.on_alloc(a, 1, 100);
        t.on_allocated(a);
        // Counted before it was tried, then counted back: the peak stays at what was allocated.
        t.on_alloc(a, 1, 4096);
        t.on_free(a, 1, 4096);
        let untagged = UntaggedFigures { blocks_in_use: 0, requested_bytes_in_use: 0, peak_requested_bytes_in_use: 0 };
        let f = t.figures(untagged);
        assert_eq!((f[0].blocks_in_use, f[0].requested_bytes_in_use, f[0].peak_requested_bytes_in_use), (1, 100, 100));
    }

    #[test]
    fn the_first_names_keep_their_ids_and_counters() {
        let t = TagTable::new();
        let a = t.acquire("a", 1).unwrap();
        assert_eq!(a, 1);
        assert!(t.is_named(a));
        t.on_alloc(a, 1, 100);
        t.on_allocated(a);
        assert_eq!(t.acquire("a", 1).unwrap(), a);
        t.on_alloc(a, 1, 50);
        t.on_allocated(a);
        t.on_free(a, 1, 100);
        let untagged = UntaggedFigures { blocks_in_use: 1, requested_bytes_in_use: 7, peak_requested_bytes_in_use: 9 };
        let f = t.figures(untagged);
        assert_eq!(f[0].label, TagLabel::Named(Arc::from("a")));
        assert_eq!((f[0].blocks_in_use, f[0].requested_bytes_in_use, f[0].peak_requested_bytes_in_use), (1, 50, 150));
        assert_eq!(f[1].label, TagLabel::Untagged);
        assert_eq!((f[1].blocks_in_use, f[1].requested_bytes_in_use, f[1].peak_requested_bytes_in_use), (1, 7, 9));
        assert_eq!(t.tagged_blocks(), 1);
        t.reset_peaks();
        assert_eq!(t.figures(UntaggedFigures::default())[0].peak_requested_bytes_in_use, 50);
        assert_eq!(t.figures(UntaggedFigures::default()).len(), 1, "no untagged row without untagged blocks");
    }

    #[test]
    fn pooled_tags_are_dropped_when_no_block_holds_them() {
        let t = TagTable::new();
        for i in 0..NAMED_TAGS {
            t.acquire(&format!("named-{i}"), 1).unwrap();
        }
        let kept = t.acquire("kept", 1).unwrap();
        assert!(kept > NAMED_TAGS);
        t.on_alloc(kept, 1, 10);
        t.on_allocated(kept);
        for i in 0..1_000_000u32 {
            let id = t.acquire(&format!("request-{i}"), 1).unwrap();
            t.on_alloc(id, 1, 64);
            t.on_allocated(id);
            t.on_free(id, 1, 64);
            t.release(id, 1, NO_TRACE).unwrap();
        }
        assert!(t.interned() <= NAMED_TAGS as usize + 1 + IDLE_TAGS + 1, "{} names interned", t.interned());
        assert_eq!(t.name(kept).as_deref(), Some("kept"));
        let others = t.figures(UntaggedFigures::default()).into_iter().find(|f| f.label == TagLabel::Others).unwrap();
        assert_eq!(
            (others.blocks_in_use, others.requested_bytes_in_use, others.peak_requested_bytes_in_use),
            (1, 10, 74)
        );
        // A dropped name comes back under a recycled id.
        let again = t.acquire("request-0", 0).unwrap();
        assert_eq!(t.name(again).as_deref(), Some("request-0"));
    }

    #[test]
    fn retired_tags_stay_named_while_the_trace_names_them() {
        let t = TagTable::new();
        for i in 0..NAMED_TAGS {
            t.acquire(&format!("named-{i}"), 0).unwrap();
        }
        let trace = FakeTrace::new();
        let first = t.acquire("first", 1).unwrap();
        trace.named.borrow_mut().insert(first);
        t.release(first, 1, &trace).unwrap();
        for i in 0..100_000 {
            let id = t.acquire(&format!("r{i}"), 1).unwrap();
            t.release(id, 1, &trace).unwrap();
        }
        assert_eq!(t.name(first).as_deref(), Some("first"), "dropped while an event names it");
        assert!(t.interned() <= NAMED_TAGS as usize + IDLE_TAGS + 2 * SCAN_EVERY, "{} interned", t.interned());
        let passes = trace.passes.get();
        assert!(passes <= 100_000 / SCAN_EVERY + 2, "{passes} passes over the rings");
        // Once no event names it, a drain lets it go.
        trace.named.borrow_mut().clear();
        t.trace_drained(&trace);
        assert_eq!(t.name(first), None);
        assert_eq!(t.retired(), 0);
        // With no event left at all, retired ids go without a pass.
        let id = t.acquire("last", 1).unwrap();
        trace.pending.set(false);
        t.release(id, 1, &trace).unwrap();
        t.trace_drained(&trace);
        assert!(t.interned() <= NAMED_TAGS as usize + IDLE_TAGS + 1);
    }

    #[test]
    fn a_pinned_drain_keeps_every_name() {
        let t = TagTable::new();
        for i in 0..NAMED_TAGS {
            t.acquire(&format!("named-{i}"), 0).unwrap();
        }
        let trace = FakeTrace::new();
        let first = t.acquire("first", 1).unwrap();
        let pin = t.pin();
        // The drain took the events naming `first` out of the rings: the trace names it no more.
        t.release(first, 1, &trace).unwrap();
        for i in 0..3 * SCAN_EVERY {
            let id = t.acquire(&format!("r{i}"), 1).unwrap();
            t.release(id, 1, &trace).unwrap();
        }
        assert_eq!(t.name(first).as_deref(), Some("first"), "dropped while a drain reads names");
        assert_eq!(trace.passes.get(), 0);
        drop(pin);
        t.trace_drained(&trace);
        assert_eq!(t.name(first), None);
        // Without a trace, an idle id goes without retiring while a drain is pinned too.
        let pin = t.pin();
        trace.pending.set(false);
        let id = t.acquire("second", 1).unwrap();
        t.release(id, 1, &trace).unwrap();
        for i in 0..2 * IDLE_TAGS {
            let id = t.acquire(&format!("s{i}"), 1).unwrap();
            t.release(id, 1, &trace).unwrap();
        }
        assert_eq!(t.name(id).as_deref(), Some("second"));
        drop(pin);
        t.trace_drained(&trace);
        assert_eq!(t.name(id), None);
    }

    #[test]
    fn threads_count_exactly_and_the_table_stays_bounded() {
        let t = Arc::new(TagTable::new());
        let shared = t.acquire("shared", 0).unwrap();
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for i in 0..50_000u32 {
                        let id = t.acquire(&format!("w{w}-{i}"), 1).unwrap();
                        t.on_alloc(id, 1, 8);
                        t.on_allocated(id);
                        t.on_alloc(shared, 1, 1);
                        t.on_allocated(shared);
                        t.on_free(id, 1, 8);
                        t.release(id, 1, NO_TRACE).unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert!(t.interned() <= NAMED_TAGS as usize + IDLE_TAGS + 8, "{} names interned", t.interned());
        let shared = t
            .figures(UntaggedFigures::default())
            .into_iter()
            .find(|f| f.label == TagLabel::Named(Arc::from("shared")))
            .unwrap();
        assert_eq!((shared.blocks_in_use, shared.requested_bytes_in_use), (200_000, 200_000));
        let others = t.figures(UntaggedFigures::default()).into_iter().find(|f| f.label == TagLabel::Others);
        assert_eq!(others.map(|o| (o.blocks_in_use, o.requested_bytes_in_use)), Some((0, 0)));
    }

    #[test]
    fn a_hold_on_an_unknown_id_is_refused() {
        let t = TagTable::new();
        assert!(t.hold(0, 1).is_ok());
        assert!(t.hold(5000, 1).is_err());
    }
}
