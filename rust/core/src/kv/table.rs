//! The page table: each sequence's pages in order, and each page's references.
//!
//! Every operation checks and gathers what it needs first (sequences, fresh pages, copies) and
//! changes the table only once nothing can fail any more: a refusal leaves it as it was.

use super::counts::TableCounts;
use super::error::{KvError, MAX_SEQUENCE_PAGES};
use super::seq_map::SeqMap;
use super::source::PageSource;

/// One sequence: its tokens and its pages in order (`ceil(tokens / page_tokens)` of them).
#[derive(Debug, Clone)]
struct Seq {
    id: i64,
    tokens: u64,
    pages: Vec<u32>,
    /// The batch that last touched the sequence (to refuse a sequence twice in one batch).
    mark: u64,
}

/// How one sequence grows by some tokens.
#[derive(Debug, Clone, Copy)]
struct Growth {
    slot: u32,
    tokens: u64,
    fresh: usize,
    copy: bool,
}

/// Sequences of fixed-size pages with reference-counted sharing.
#[derive(Debug)]
pub struct PageTable {
    page_tokens: u64,
    slots: Vec<Seq>,
    free_slots: Vec<u32>,
    ids: SeqMap,
    /// References of each page number (0: not held).
    refs: Vec<u32>,
    pages_in_use: usize,
    pages_shared: usize,
    pages_logical: usize,
    tokens: u64,
    copies: u64,
    epoch: u64,
    // Scratch space of the batch calls, kept to spare allocations.
    growths: Vec<Growth>,
    taken: Vec<u32>,
    pairs: Vec<(u32, u32)>,
    sorted: Vec<u32>,
}

type Result<T, S> = std::result::Result<T, KvError<<S as PageSource>::Error>>;

impl PageTable {
    /// An empty table of pages that hold `page_tokens` tokens each (at least 1).
    ///
    /// # Panics
    ///
    /// If `page_tokens` is 0.
    pub fn new(page_tokens: u32) -> PageTable {
        assert!(page_tokens > 0, "a page holds at least one token");
        PageTable {
            page_tokens: u64::from(page_tokens),
            slots: Vec::new(),
            free_slots: Vec::new(),
            ids: SeqMap::default(),
            refs: Vec::new(),
            pages_in_use: 0,
            pages_shared: 0,
            pages_logical: 0,
            tokens: 0,
            copies: 0,
            epoch: 0,
            growths: Vec::new(),
            taken: Vec::new(),
            pairs: Vec::new(),
            sorted: Vec::new(),
        }
    }

    /// Tokens a page holds.
    pub fn page_tokens(&self) -> u32 {
        self.page_tokens as u32
    }

    /// Pages that hold `tokens` tokens.
    #[inline]
    pub fn pages_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.page_tokens)
    }

    /// The most tokens one sequence can hold: [`MAX_SEQUENCE_PAGES`] full pages.
    pub fn max_tokens(&self) -> u64 {
        MAX_SEQUENCE_PAGES * self.page_tokens
    }

    #[inline]
    fn slot<E>(&self, seq: i64) -> std::result::Result<u32, KvError<E>> {
        self.ids.get(&seq).copied().ok_or(KvError::UnknownSequence(seq))
    }

    /// Whether sequence `seq` is in the table.
    pub fn contains(&self, seq: i64) -> bool {
        self.ids.contains_key(&seq)
    }

    /// Sequences in the table.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the table holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids of the sequences, in no particular order.
    pub fn sequences(&self) -> impl Iterator<Item = i64> + '_ {
        self.ids.keys().copied()
    }

    /// Tokens of sequence `seq`.
    pub fn num_tokens<E>(&self, seq: i64) -> std::result::Result<u64, KvError<E>> {
        Ok(self.slots[self.slot(seq)? as usize].tokens)
    }

    /// The pages of sequence `seq`, in order.
    pub fn pages<E>(&self, seq: i64) -> std::result::Result<&[u32], KvError<E>> {
        Ok(&self.slots[self.slot(seq)? as usize].pages)
    }

    /// References of page `page` (0 when no sequence holds it).
    pub fn refs(&self, page: u32) -> u32 {
        self.refs.get(page as usize).copied().unwrap_or(0)
    }

    /// Every held page with its references, by page number.
    pub fn held_pages(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.refs.iter().enumerate().filter(|(_, &r)| r > 0).map(|(p, &r)| (p as u32, r))
    }

    /// How sequence `slot` grows by `tokens`: fresh pages, and whether its shared, partly filled
    /// last page must be copied first.
    #[inline]
    fn growth<E>(&self, slot: u32, tokens: u64) -> std::result::Result<Growth, KvError<E>> {
        let s = &self.slots[slot as usize];
        if tokens == 0 {
            return Ok(Growth { slot, tokens, fresh: 0, copy: false });
        }
        let total = u128::from(s.tokens) + u128::from(tokens);
        if total > u128::from(self.max_tokens()) {
            return Err(KvError::TooManyTokens { seq: s.id, tokens: total, max: self.max_tokens() });
        }
        let want = self.pages_for(total as u64);
        let fresh = (want as usize).saturating_sub(s.pages.len());
        // The page the next token goes to, when it is partly filled and shared.
        let next = (s.tokens / self.page_tokens) as usize;
        let copy = s.tokens % self.page_tokens != 0 && s.pages.get(next).is_some_and(|&p| self.refs[p as usize] > 1);
        Ok(Growth { slot, tokens, fresh, copy })
    }

    /// Pages that growing `seq` by `tokens` takes from the source (fresh ones and a copy).
    pub fn pages_to_append<E>(&self, seq: i64, tokens: u64) -> std::result::Result<usize, KvError<E>> {
        let g = self.growth(self.slot(seq)?, tokens)?;
        Ok(g.fresh + usize::from(g.copy))
    }

    /// Pages that growing each sequence of `seqs` by `tokens(i)` tokens takes from the source,
    /// counted as [`PageTable::append_many`] counts them (the last holder of a shared page in
    /// the batch appends in place). A sequence the table does not hold, or one that could not
    /// grow that much, counts nothing: this sizes a request, it does not check one.
    pub fn pages_to_append_many(&self, seqs: impl Iterator<Item = i64>, mut tokens: impl FnMut(usize) -> u64) -> usize {
        let mut needed = 0;
        let mut copying: Vec<u32> = Vec::new();
        for (index, seq) in seqs.enumerate() {
            let Ok(slot) = self.slot::<()>(seq) else { continue };
            let Ok(g) = self.growth::<()>(slot, tokens(index)) else { continue };
            needed += g.fresh;
            if g.copy {
                let s = &self.slots[slot as usize];
                copying.push(s.pages[(s.tokens / self.page_tokens) as usize]);
            }
        }
        copying.sort_unstable();
        for group in copying.chunk_by(|a, b| a == b) {
            needed += group.len() - usize::from(group.len() as u32 == self.refs[group[0] as usize]);
        }
        needed
    }

    #[inline]
    fn hold_fresh(&mut self, page: u32) {
        let i = page as usize;
        if i >= self.refs.len() {
            self.refs.resize(i + 1, 0);
        }
        debug_assert_eq!(self.refs[i], 0, "a fresh page is not held");
        self.refs[i] = 1;
        self.pages_in_use += 1;
    }

    #[inline]
    fn share(&mut self, page: u32) {
        let r = &mut self.refs[page as usize];
        *r += 1;
        if *r == 2 {
            self.pages_shared += 1;
        }
    }

    #[inline]
    fn release<S: PageSource>(&mut self, page: u32, source: &mut S) {
        let r = &mut self.refs[page as usize];
        *r -= 1;
        match *r {
            0 => {
                self.pages_in_use -= 1;
                source.give_back(page);
            }
            1 => self.pages_shared -= 1,
            _ => {}
        }
    }

    /// Apply a growth with its pages: the copy's destination first (when it copies), then the
    /// fresh ones.
    #[inline]
    fn grow<S: PageSource>(&mut self, g: Growth, pages: &[u32], source: &mut S) {
        let mut pages = pages.iter().copied();
        if g.copy {
            let to = pages.next().expect("a page for the copy");
            let s = &self.slots[g.slot as usize];
            let at = (s.tokens / self.page_tokens) as usize;
            let from = s.pages[at];
            self.hold_fresh(to);
            self.slots[g.slot as usize].pages[at] = to;
            self.release(from, source);
            self.copies += 1;
        }
        for page in pages {
            self.hold_fresh(page);
            self.slots[g.slot as usize].pages.push(page);
            self.pages_logical += 1;
        }
        self.slots[g.slot as usize].tokens += g.tokens;
        self.tokens += g.tokens;
    }

    /// Copy the shared pages of the growths (destinations are the first taken page of each).
    fn copy_shared<S: PageSource>(&mut self, source: &mut S) -> std::result::Result<(), S::Error> {
        self.pairs.clear();
        let mut next = 0;
        for g in &self.growths {
            if g.copy {
                let s = &self.slots[g.slot as usize];
                let from = s.pages[(s.tokens / self.page_tokens) as usize];
                self.pairs.push((from, self.taken[next]));
            }
            next += g.fresh + usize::from(g.copy);
        }
        if self.pairs.is_empty() {
            return Ok(());
        }
        let pairs = std::mem::take(&mut self.pairs);
        let copied = source.copy(&pairs);
        self.pairs = pairs;
        copied
    }

    /// Take `count` pages into `self.taken` (emptied first). A source that says it delivered
    /// but did not deliver `count` pages gets back what it gave: [`KvError::BrokenSource`]; one
    /// that delivered a page in use gets back the others ([`KvError::PageInUse`]).
    fn take<S: PageSource>(&mut self, count: usize, source: &mut S) -> Result<(), S> {
        self.taken.clear();
        if count == 0 {
            return Ok(());
        }
        let mut taken = std::mem::take(&mut self.taken);
        let got = source.take(count, &mut taken);
        self.taken = taken;
        got.map_err(KvError::Source)?;
        if self.taken.len() != count {
            let delivered = self.taken.len();
            self.give_back_taken(source);
            return Err(KvError::BrokenSource { asked: count, delivered });
        }
        if let Some(page) = self.first_in_use() {
            // Each distinct page the table does not hold goes back once.
            self.taken.sort_unstable();
            self.taken.dedup();
            let refs = &self.refs;
            self.taken.retain(|&p| refs.get(p as usize).is_none_or(|&r| r == 0));
            self.give_back_taken(source);
            return Err(KvError::PageInUse { page });
        }
        Ok(())
    }

    /// The first page of `self.taken` that a sequence holds or that comes in it twice.
    fn first_in_use(&mut self) -> Option<u32> {
        let refs = &self.refs;
        if let Some(&page) = self.taken.iter().find(|&&p| refs.get(p as usize).is_some_and(|&r| r > 0)) {
            return Some(page);
        }
        if self.taken.len() < 2 {
            return None;
        }
        let mut sorted = std::mem::take(&mut self.sorted);
        sorted.clear();
        sorted.extend_from_slice(&self.taken);
        sorted.sort_unstable();
        let twice = sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        self.sorted = sorted;
        twice
    }

    fn give_back_taken<S: PageSource>(&mut self, source: &mut S) {
        for &page in &self.taken {
            source.give_back(page);
        }
        self.taken.clear();
    }

    /// Add sequence `seq` with room for `tokens` tokens (its prompt).
    pub fn add<S: PageSource>(&mut self, seq: i64, tokens: u64, source: &mut S) -> Result<(), S> {
        if self.contains(seq) {
            return Err(KvError::SequenceExists(seq));
        }
        if tokens > self.max_tokens() {
            return Err(KvError::TooManyTokens { seq, tokens: u128::from(tokens), max: self.max_tokens() });
        }
        let pages = self.pages_for(tokens);
        self.take(pages as usize, source)?;
        let taken = std::mem::take(&mut self.taken);
        for &page in &taken {
            self.hold_fresh(page);
        }
        self.pages_logical += taken.len();
        self.tokens += tokens;
        self.insert(Seq { id: seq, tokens, pages: taken.clone(), mark: 0 });
        self.taken = taken;
        Ok(())
    }

    fn insert(&mut self, seq: Seq) {
        let id = seq.id;
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = seq;
                slot
            }
            None => {
                self.slots.push(seq);
                (self.slots.len() - 1) as u32
            }
        };
        self.ids.insert(id, slot);
    }

    /// Grow sequence `seq` by `tokens` tokens: a fresh page whenever the last one is full, and a
    /// copy of the last page first when it is partly filled and shared.
    #[inline]
    pub fn append<S: PageSource>(&mut self, seq: i64, tokens: u64, source: &mut S) -> Result<(), S> {
        let slot = self.slot(seq)?;
        let g = self.growth(slot, tokens)?;
        if g.fresh == 0 && !g.copy {
            self.slots[slot as usize].tokens += tokens;
            self.tokens += tokens;
            return Ok(());
        }
        self.growths.clear();
        self.growths.push(g);
        self.take(g.fresh + usize::from(g.copy), source)?;
        self.commit_growths(source)
    }

    /// Copy what the growths in `self.growths` copy, then apply them with `self.taken`; on a
    /// failed copy, give the pages back.
    fn commit_growths<S: PageSource>(&mut self, source: &mut S) -> Result<(), S> {
        if let Err(err) = self.copy_shared(source) {
            self.give_back_taken(source);
            return Err(KvError::Source(err));
        }
        let growths = std::mem::take(&mut self.growths);
        let taken = std::mem::take(&mut self.taken);
        let mut next = 0;
        for &g in &growths {
            let n = g.fresh + usize::from(g.copy);
            self.grow(g, &taken[next..next + n], source);
            next += n;
        }
        self.growths = growths;
        self.taken = taken;
        self.taken.clear();
        Ok(())
    }

    /// Grow each sequence of `seqs` by `tokens(i)` tokens, all or none: every sequence is looked up
    /// and every page taken before any sequence changes. A sequence may appear once.
    pub fn append_many<S: PageSource>(
        &mut self,
        seqs: impl ExactSizeIterator<Item = i64>,
        mut tokens: impl FnMut(usize) -> u64,
        source: &mut S,
    ) -> Result<(), S> {
        self.epoch += 1;
        let epoch = self.epoch;
        self.growths.clear();
        let mut needed = 0;
        let mut growths = std::mem::take(&mut self.growths);
        let checked = || -> Result<(), S> {
            for (index, seq) in seqs.enumerate() {
                let slot = self.slot(seq)?;
                let s = &mut self.slots[slot as usize];
                if s.mark == epoch {
                    return Err(KvError::Repeated { index, seq });
                }
                s.mark = epoch;
                let g = self.growth(slot, tokens(index))?;
                needed += g.fresh + usize::from(g.copy);
                growths.push(g);
            }
            Ok(())
        };
        let checked = checked();
        self.growths = growths;
        checked?;
        needed -= self.spare_last_copies();
        if needed == 0 {
            for g in &self.growths {
                self.slots[g.slot as usize].tokens += g.tokens;
                self.tokens += g.tokens;
            }
            return Ok(());
        }
        self.take(needed, source)?;
        self.commit_growths(source)
    }

    /// When every holder of a shared, partly filled page is in the batch, the last of them in
    /// batch order finds the page its own by then: it appends in place instead of copying.
    /// Returns how many copies that spares.
    fn spare_last_copies(&mut self) -> usize {
        let mut copying: Vec<(u32, usize)> = Vec::new();
        for (i, g) in self.growths.iter().enumerate() {
            if g.copy {
                let s = &self.slots[g.slot as usize];
                copying.push((s.pages[(s.tokens / self.page_tokens) as usize], i));
            }
        }
        if copying.is_empty() {
            return 0;
        }
        copying.sort_unstable();
        let mut spared = 0;
        for group in copying.chunk_by(|a, b| a.0 == b.0) {
            let (page, last) = group[group.len() - 1];
            if group.len() as u32 == self.refs[page as usize] {
                self.growths[last].copy = false;
                spared += 1;
            }
        }
        spared
    }

    /// Add sequence `child` sharing every page of `parent` (its prompt, a beam).
    pub fn fork<E>(&mut self, parent: i64, child: i64) -> std::result::Result<(), KvError<E>> {
        let slot = self.slot(parent)?;
        if self.contains(child) {
            return Err(KvError::SequenceExists(child));
        }
        let s = &self.slots[slot as usize];
        let (tokens, pages) = (s.tokens, s.pages.clone());
        for &page in &pages {
            self.share(page);
        }
        self.pages_logical += pages.len();
        self.tokens += tokens;
        self.insert(Seq { id: child, tokens, pages, mark: 0 });
        Ok(())
    }

    /// Remove sequence `seq`: each of its pages loses a reference and goes back to the source
    /// when none is left.
    pub fn free<S: PageSource>(&mut self, seq: i64, source: &mut S) -> Result<(), S> {
        let slot = self.ids.remove(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let s = std::mem::replace(&mut self.slots[slot as usize], Seq { id: 0, tokens: 0, pages: Vec::new(), mark: 0 });
        for &page in s.pages.iter().rev() {
            self.release(page, source);
        }
        self.pages_logical -= s.pages.len();
        self.tokens -= s.tokens;
        self.free_slots.push(slot);
        Ok(())
    }

    /// Remove every sequence.
    pub fn clear<S: PageSource>(&mut self, source: &mut S) {
        let ids: Vec<i64> = self.ids.keys().copied().collect();
        for seq in ids {
            let _ = self.free(seq, source);
        }
    }

    /// The counts of the table; the waste walks the sequences.
    pub fn counts(&self) -> TableCounts {
        let mut waste = 0;
        let mut shared_tails = Vec::new();
        for &slot in self.ids.values() {
            let s = &self.slots[slot as usize];
            let room = s.pages.len() as u64 * self.page_tokens - s.tokens;
            if room == 0 {
                continue;
            }
            // The partly filled page and any pages reserved past it.
            let next = (s.tokens / self.page_tokens) as usize;
            if s.pages.get(next).is_some_and(|&p| self.refs[p as usize] > 1) {
                shared_tails.push((s.pages[next], s.tokens % self.page_tokens));
                waste += room - (self.page_tokens - s.tokens % self.page_tokens);
            } else {
                waste += room;
            }
        }
        shared_tails.sort_unstable();
        shared_tails.dedup_by_key(|t| t.0);
        waste += shared_tails.iter().map(|&(_, fill)| self.page_tokens - fill).sum::<u64>();
        TableCounts {
            sequences: self.ids.len(),
            pages_in_use: self.pages_in_use,
            pages_shared: self.pages_shared,
            pages_logical: self.pages_logical,
            tokens: self.tokens,
            waste_tokens: waste,
            copies: self.copies,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::error::{KvError, OutOfPages};
    use super::super::source::{FreeList, PageSource};
    use super::PageTable;

    /// `pages_to_append_many` counts what `append_many` then takes, for random batches over
    /// sequences that fork from each other (shared half-full pages, some holders in the batch).
    #[test]
    fn the_count_of_a_batch_is_what_the_batch_takes() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..200 {
            let mut src = FreeList::new(4096);
            let mut t = PageTable::new(1 + next(5) as u32);
            let mut ids: Vec<i64> = vec![0];
            t.add(0, next(12), &mut src).unwrap();
            for round in 0..30 {
                if next(3) == 0 {
                    let parent = ids[next(ids.len() as u64) as usize];
                    let child = 1000 + round;
                    t.fork::<()>(parent, child).unwrap();
                    ids.push(child);
                    continue;
                }
                let batch: Vec<i64> = ids.iter().copied().filter(|_| next(2) == 0).collect();
                let tokens: Vec<u64> = batch.iter().map(|_| next(6)).collect();
                let counted = t.pages_to_append_many(batch.iter().copied(), |i| tokens[i]);
                let free = src.free();
                t.append_many(batch.iter().copied(), |i| tokens[i], &mut src).unwrap();
                assert_eq!(free - src.free(), counted, "batch {batch:?} of {tokens:?}");
            }
        }
    }

    #[test]
    fn append_takes_a_page_only_when_the_last_is_full() {
        let mut src = FreeList::new(8);
        let mut t = PageTable::new(4);
        t.add(1, 0, &mut src).unwrap();
        assert_eq!(t.pages::<()>(1).unwrap().len(), 0);
        for n in 1..=9u64 {
            t.append(1, 1, &mut src).unwrap();
            assert_eq!(t.pages::<()>(1).unwrap().len() as u64, n.div_ceil(4));
        }
        assert_eq!(src.free(), 5);
        assert_eq!(t.counts().waste_tokens, 3);
        t.free(1, &mut src).unwrap();
        assert_eq!(src.free(), 8);
        assert_eq!(t.counts(), Default::default());
    }

    #[test]
    fn fork_shares_and_copies_a_partly_filled_last_page() {
        let mut src = FreeList::new(8);
        let mut t = PageTable::new(4);
        t.add(1, 6, &mut src).unwrap();
        t.fork::<()>(1, 2).unwrap();
        let c = t.counts();
        assert_eq!((c.pages_in_use, c.pages_shared, c.pages_logical, c.tokens), (2, 2, 4, 12));
        assert_eq!(c.waste_tokens, 2, "the shared tail counts once");
        t.append(2, 1, &mut src).unwrap();
        let (p1, p2) = (t.pages::<()>(1).unwrap().to_vec(), t.pages::<()>(2).unwrap().to_vec());
        assert_eq!(p1[0], p2[0]);
        assert_ne!(p1[1], p2[1]);
        let c = t.counts();
        assert_eq!((c.pages_in_use, c.pages_shared, c.copies), (3, 1, 1));
        t.free(1, &mut src).unwrap();
        t.free(2, &mut src).unwrap();
        assert_eq!(src.free(), 8);
    }

    /// A free list that delivers one page fewer than asked, from its `short`-th take on.
    struct ShortSource {
        list: FreeList,
        takes: usize,
        short: usize,
    }

    impl PageSource for ShortSource {
        type Error = OutOfPages;

        fn take(&mut self, count: usize, out: &mut Vec<u32>) -> std::result::Result<(), OutOfPages> {
            self.takes += 1;
            let count = if self.takes >= self.short { count - 1 } else { count };
            self.list.take(count, out)
        }

        fn give_back(&mut self, page: u32) {
            self.list.give_back(page)
        }

        fn copy(&mut self, _: &[(u32, u32)]) -> std::result::Result<(), OutOfPages> {
            Ok(())
        }

        fn available(&self) -> usize {
            self.list.free()
        }
    }

    #[test]
    fn a_source_that_delivers_too_few_pages_is_refused_and_gets_them_back() {
        let mut src = ShortSource { list: FreeList::new(16), takes: 0, short: 2 };
        let mut t = PageTable::new(4);
        t.add(1, 8, &mut src).unwrap();
        let (before, free) = (t.counts(), src.list.free());
        assert_eq!(t.append(1, 9, &mut src), Err(KvError::BrokenSource { asked: 3, delivered: 2 }));
        assert_eq!(t.add(2, 12, &mut src), Err(KvError::BrokenSource { asked: 3, delivered: 2 }));
        assert_eq!((t.counts(), src.list.free()), (before, free));
        assert!(!t.contains(2));
        t.free(1, &mut src).unwrap();
        assert_eq!(src.list.free(), 16);
    }

    /// A source that hands out the pages of `script` in turn, whatever it holds; it counts the
    /// pages it got back.
    struct ScriptedSource {
        script: Vec<u32>,
        given_back: Vec<u32>,
    }

    impl PageSource for ScriptedSource {
        type Error = OutOfPages;

        fn take(&mut self, count: usize, out: &mut Vec<u32>) -> std::result::Result<(), OutOfPages> {
            out.extend(self.script.drain(..count));
            Ok(())
        }

        fn give_back(&mut self, page: u32) {
            self.given_back.push(page)
        }

        fn copy(&mut self, _: &[(u32, u32)]) -> std::result::Result<(), OutOfPages> {
            Ok(())
        }

        fn available(&self) -> usize {
            self.script.len()
        }
    }

    #[test]
    fn a_source_that_delivers_a_page_in_use_is_refused_and_gets_the_others_back() {
        let mut src = ScriptedSource { script: vec![0, 1, 2, 1, 3, 4, 0, 5, 6, 6, 7], given_back: vec![] };
        let mut t = PageTable::new(4);
        t.add(1, 8, &mut src).unwrap(); // pages 0 and 1
        let before = t.counts();
        // Page 1 is held by sequence 1: 2 goes back, not 1.
        assert_eq!(t.add(2, 8, &mut src), Err(KvError::PageInUse { page: 1 }));
        assert_eq!(src.given_back, vec![2]);
        // Page 0 is held: 3 and 4 go back.
        assert_eq!(t.append(1, 12, &mut src), Err(KvError::PageInUse { page: 0 }));
        assert_eq!(src.given_back, vec![2, 3, 4]);
        // Page 6 twice in one delivery: 5 and 6 go back once each.
        assert_eq!(t.add(3, 12, &mut src), Err(KvError::PageInUse { page: 6 }));
        assert_eq!(src.given_back, vec![2, 3, 4, 5, 6]);
        assert_eq!(t.counts(), before);
        assert!(!t.contains(2) && !t.contains(3));
        assert_eq!(t.num_tokens::<OutOfPages>(1).unwrap(), 8);
        t.add(4, 4, &mut src).unwrap();
        t.free(1, &mut src).unwrap();
        t.free(4, &mut src).unwrap();
        src.given_back[5..].sort_unstable();
        assert_eq!(src.given_back, vec![2, 3, 4, 5, 6, 0, 1, 7]);
    }

    #[test]
    #[should_panic(expected = "page 5 is not one of the 2 pages of this free list")]
    fn a_free_list_refuses_a_page_it_never_had() {
        FreeList::new(2).give_back(5);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut src = FreeList::new(2);
        let mut t = PageTable::new(4);
        t.add(1, 4, &mut src).unwrap();
        assert_eq!(t.add(2, 9, &mut src), Err(KvError::Source(OutOfPages { needed: 3, free: 1 })));
        assert_eq!(t.add(1, 1, &mut src), Err(KvError::SequenceExists(1)));
        assert_eq!(t.append(1, 5, &mut src), Err(KvError::Source(OutOfPages { needed: 2, free: 1 })));
        t.add(3, 0, &mut src).unwrap();
        let before = t.counts();
        assert_eq!(
            t.append_many([3, 1].into_iter(), |_| 5, &mut src),
            Err(KvError::Source(OutOfPages { needed: 4, free: 1 }))
        );
        assert_eq!(t.append_many([3, 3].into_iter(), |_| 1, &mut src), Err(KvError::Repeated { index: 1, seq: 3 }));
        assert_eq!(t.append_many([3, 7].into_iter(), |_| 1, &mut src), Err(KvError::UnknownSequence(7)));
        assert_eq!(t.counts(), before);
        assert_eq!(t.num_tokens::<()>(3).unwrap(), 0);
        assert_eq!(src.free(), 1);
        t.append_many([3, 1].into_iter(), |_| 0, &mut src).unwrap();
        t.append_many([3].into_iter(), |_| 4, &mut src).unwrap();
        assert_eq!(src.free(), 0);
    }

    #[test]
    fn a_sequence_past_the_most_pages_is_refused_with_its_exact_tokens() {
        let mut src = FreeList::new(4);
        let mut t = PageTable::new(3);
        let max = t.max_tokens();
        assert_eq!(max, u64::from(u32::MAX) * 3);
        assert_eq!(
            t.add(1, max + 1, &mut src),
            Err(KvError::TooManyTokens { seq: 1, tokens: u128::from(max) + 1, max })
        );
        t.add(1, 5, &mut src).unwrap();
        let before = t.counts();
        let past_u64 = 5 + u128::from(u64::MAX);
        assert_eq!(t.append(1, u64::MAX, &mut src), Err(KvError::TooManyTokens { seq: 1, tokens: past_u64, max }));
        assert_eq!(
            t.pages_to_append::<()>(1, max - 4),
            Err(KvError::TooManyTokens { seq: 1, tokens: u128::from(max) + 1, max })
        );
        assert_eq!(t.counts(), before);
        let message = KvError::<String>::TooManyTokens { seq: 1, tokens: past_u64, max }.to_string();
        assert_eq!(
            message,
            format!("sequence 1 would hold {past_u64} tokens; a sequence holds at most {max} (4294967295 pages)")
        );
    }
}
