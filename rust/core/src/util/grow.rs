//! Tables that grow without aborting: the lists a call builds as it walks the pool (its live
//! blocks, free runs, trace events), whose length the pool's contents decide.
//!
//! A `Vec`, `HashMap` or `HashSet` that cannot grow calls `handle_alloc_error`, which aborts
//! the process. [`reserve`] asks for room with `try_reserve` instead and turns a refusal into
//! `Error::HostMemory` naming the table; [`try_push`] and [`try_insert`] add one value that way.
//! The failpoint `host.vec` fires where a table has to grow (not where it has room), so a
//! fault-injection test fails every growth of an operation in turn. [`try_vec`] and
//! [`try_boxed`] make a table of a known size the same way (the failpoint fires for each).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use crate::error::{Error, Result};
use crate::util::failpoint;

/// A table that can ask for room without aborting.
pub(crate) trait Table {
    /// Bytes one value takes.
    const VALUE_BYTES: usize;
    /// Values it holds.
    fn len(&self) -> usize;
    /// Values it can hold without growing.
    fn capacity(&self) -> usize;
    /// Room for `more` values more, or `Err` when the host has no memory for it.
    fn try_reserve(&mut self, more: usize) -> std::result::Result<(), std::collections::TryReserveError>;
}

impl<T> Table for Vec<T> {
    const VALUE_BYTES: usize = std::mem::size_of::<T>();
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
    fn try_reserve(&mut self, more: usize) -> std::result::Result<(), std::collections::TryReserveError> {
        Vec::try_reserve(self, more)
    }
}

impl<T: Eq + Hash> Table for HashSet<T> {
    const VALUE_BYTES: usize = std::mem::size_of::<T>();
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn capacity(&self) -> usize {
        HashSet::capacity(self)
    }
    fn try_reserve(&mut self, more: usize) -> std::result::Result<(), std::collections::TryReserveError> {
        HashSet::try_reserve(self, more)
    }
}

impl<K: Eq + Hash, V> Table for HashMap<K, V> {
    const VALUE_BYTES: usize = std::mem::size_of::<(K, V)>();
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn try_reserve(&mut self, more: usize) -> std::result::Result<(), std::collections::TryReserveError> {
        HashMap::try_reserve(self, more)
    }
}

/// Room in `table` for `more` values more: `Error::HostMemory` naming `what` when the host has
/// no memory for it (the table is unchanged then).
pub(crate) fn reserve<T: Table>(table: &mut T, more: usize, what: &'static str) -> Result<()> {
    if table.capacity() - table.len() >= more {
        return Ok(());
    }
    let bytes = table.len().saturating_add(more).saturating_mul(T::VALUE_BYTES);
    if failpoint::fire("host.vec") || table.try_reserve(more).is_err() {
        return Err(Error::HostMemory { what, bytes });
    }
    Ok(())
}

/// Push `value` onto `values`, growing it without aborting (see [`reserve`]).
pub(crate) fn try_push<T>(values: &mut Vec<T>, value: T, what: &'static str) -> Result<()> {
    reserve(values, 1, what)?;
    values.push(value);
    Ok(())
}

/// Insert `value` into `set`, growing it without aborting (see [`reserve`]); whether it was new.
pub(crate) fn try_insert<T: Eq + Hash>(set: &mut HashSet<T>, value: T, what: &'static str) -> Result<bool> {
    reserve(set, 1, what)?;
    Ok(set.insert(value))
}

/// The values of `values` in a vector that grows without aborting (see [`reserve`]).
pub(crate) fn try_collect<T>(values: impl IntoIterator<Item = T>, what: &'static str) -> Result<Vec<T>> {
    let values = values.into_iter();
    let mut out = Vec::new();
    reserve(&mut out, values.size_hint().0, what)?;
    for value in values {
        try_push(&mut out, value, what)?;
    }
    Ok(out)
}

/// `n` values made by `make(i)`, in a boxed slice whose allocation cannot abort: when the host
/// has no memory for it, `Error::HostMemory` naming `what`.
pub(crate) fn try_boxed<T>(n: usize, what: &'static str, make: impl FnMut(usize) -> T) -> Result<Box<[T]>> {
    let mut values = try_vec(n, what)?;
    values.extend((0..n).map(make));
    Ok(values.into_boxed_slice())
}

/// An empty vector with room for `n` values, whose allocation cannot abort: when the host has
/// no memory for it, `Error::HostMemory` naming `what`.
pub(crate) fn try_vec<T>(n: usize, what: &'static str) -> Result<Vec<T>> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if failpoint::fire("host.vec") {
        return Err(Error::HostMemory { what, bytes });
    }
    let mut values = Vec::new();
    values.try_reserve_exact(n).map_err(|_| Error::HostMemory { what, bytes })?;
    Ok(values)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn growth_fails_cleanly_and_room_needs_no_growth() {
        let mut values: Vec<u64> = Vec::with_capacity(2);
        let (pushed, hits) = failpoint::record(|| {
            try_push(&mut values, 1, "test").unwrap();
            try_push(&mut values, 2, "test").unwrap();
            try_push(&mut values, 3, "test")
        });
        pushed.unwrap();
        assert_eq!(hits, vec!["host.vec"], "only the third push grows the table");
        let (pushed, fired) = failpoint::fail_at("host.vec", 0, || {
            (0..100).try_for_each(|i| try_push(&mut values, i, "the test's values"))
        });
        assert!(fired);
        let err = pushed.unwrap_err();
        assert!(matches!(err, Error::HostMemory { what: "the test's values", bytes } if bytes >= 8), "{err:?}");
        let err = reserve(&mut values, usize::MAX / 2, "huge").unwrap_err();
        assert!(matches!(err, Error::HostMemory { what: "huge", .. }), "{err:?}");
        let mut set = HashSet::new();
        assert!(try_insert(&mut set, 7u32, "set").unwrap());
        assert!(!try_insert(&mut set, 7u32, "set").unwrap());
        let mut map: HashMap<u32, u32> = HashMap::new();
        assert!(reserve(&mut map, usize::MAX / 2, "map").is_err());
        assert_eq!(try_collect(0..5u8, "collect").unwrap(), vec![0, 1, 2, 3, 4]);
        let err = try_boxed::<u64>(usize::MAX / 4, "many", |i| i as u64).err().unwrap();
        assert!(matches!(err, Error::HostMemory { what: "many", .. }), "{err:?}");
    }
}
