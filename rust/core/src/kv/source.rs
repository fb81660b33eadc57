//! Where pages come from.

use super::error::OutOfPages;

/// A supply of pages, named by numbers: the page table asks for fresh pages, gives back pages no
/// sequence references any more, and asks for page contents to be copied (copy-on-write).
pub trait PageSource {
    /// Why the source could not deliver.
    type Error;

    /// Append `count` fresh pages to `out`: all of them, or none and an error. Fresh means
    /// distinct pages that no sequence holds; a delivery with a page in use, or one page twice,
    /// is refused ([`KvError::PageInUse`](super::error::KvError::PageInUse)) and the other
    /// pages go back.
    fn take(&mut self, count: usize, out: &mut Vec<u32>) -> Result<(), Self::Error>;

    /// Take back a page that no sequence references.
    fn give_back(&mut self, page: u32);

    /// Copy the contents of page `from` to page `to`, for each pair; on an error nothing that a
    /// sequence can see has changed (the destinations are fresh pages).
    fn copy(&mut self, pairs: &[(u32, u32)]) -> Result<(), Self::Error>;

    /// Pages `take` could deliver now (exact for a [`FreeList`], an estimate for a source that
    /// allocates from a shared pool).
    fn available(&self) -> usize;
}

/// A fixed set of pages `0..pages`, reserved up front; the free ones on a stack (the most
/// recently freed page is handed out first, while it is warm).
#[derive(Debug, Clone)]
pub struct FreeList {
    free: Vec<u32>,
    pages: u32,
}

impl FreeList {
    /// All `pages` pages free.
    pub fn new(pages: u32) -> FreeList {
        FreeList { free: (0..pages).rev().collect(), pages }
    }

    /// Pages in the set.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// Pages free now.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// [`PageSource::take`] of a free list.
    #[inline]
    pub fn take(&mut self, count: usize, out: &mut Vec<u32>) -> Result<(), OutOfPages> {
        if count > self.free.len() {
            return Err(OutOfPages { needed: count, free: self.free.len() });
        }
        let from = self.free.len() - count;
        out.extend(self.free.drain(from..).rev());
        Ok(())
    }

    /// [`PageSource::give_back`] of a free list.
    ///
    /// # Panics
    ///
    /// If `page` is not one of the list's pages (it would be handed out later).
    #[inline]
    pub fn give_back(&mut self, page: u32) {
        assert!(page < self.pages, "page {page} is not one of the {} pages of this free list", self.pages);
        self.free.push(page);
    }
}

/// A free list as a page source whose pages have no contents (copies do nothing): for tests and
/// for planning.
impl PageSource for FreeList {
    type Error = OutOfPages;

    fn take(&mut self, count: usize, out: &mut Vec<u32>) -> Result<(), OutOfPages> {
        FreeList::take(self, count, out)
    }

    fn give_back(&mut self, page: u32) {
        FreeList::give_back(self, page)
    }

    fn copy(&mut self, _pairs: &[(u32, u32)]) -> Result<(), OutOfPages> {
        Ok(())
    }

    fn available(&self) -> usize {
        self.free()
    }
}
