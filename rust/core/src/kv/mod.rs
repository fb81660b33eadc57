//! The paged KV cache's bookkeeping: sequences of fixed-size pages, shared between sequences by
//! reference count, with copy-on-write of a shared last page.
//!
//! Pure bookkeeping over page numbers: where a page's memory comes from (one reservation, or a
//! block of the pool per page) and how its bytes are copied is a [`PageSource`]'s business. The
//! Python binding supplies both kinds of source and exposes the table as `npumem.kv.KVCache`.
//!
//! | type | file | what it is |
//! |---|---|---|
//! | [`PageTable`] | `table.rs` | sequences, their pages in order, the references of each page |
//! | [`PageSource`], [`FreeList`] | `source.rs` | where pages come from; a fixed set of pages reserved up front |
//! | [`TableCounts`] | `counts.rs` | pages in use, shared, tokens, waste: what `stats()` reports |
//! | [`KvError`], [`OutOfPages`] | `error.rs` | refusals; each leaves the table as it was |
//! | `SeqMap` | `seq_map.rs` | sequence ids to table slots, with a hash made for integer keys |

mod counts;
mod error;
mod seq_map;
mod source;
mod table;

pub use counts::TableCounts;
pub use error::{KvError, OutOfPages, MAX_SEQUENCE_PAGES};
pub use source::{FreeList, PageSource};
pub use table::PageTable;
