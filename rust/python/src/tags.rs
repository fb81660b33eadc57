//! Tags: the strings blocks are labelled with, interned as the small ids the core stores.
//!
//! A tag lives as long as blocks carry it: every block made with a tag holds it, and freeing
//! the block releases it. The last [`IDLE_KEEP`] tags that no block holds stay (a tag used for
//! one block at a time is not interned anew on every allocation); older ones are dropped and
//! their ids reused, so a program that labels every request differently does not grow the
//! table forever. While the pool records a trace (or events wait in it to be drained), tags are
//! not dropped but retired: events name them by id. They go at the first drain after recording
//! stopped.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

/// How many tags no block holds are kept.
const IDLE_KEEP: usize = 1024;

/// What blocks hold of each id, and the ids free to reuse.
#[derive(Default)]
struct Holds {
    /// Blocks holding each id (index 0, "no tag", unused).
    counts: Vec<u64>,
    /// Ids whose tags were dropped, to hand out again.
    free: Vec<u32>,
    /// Ids whose blocks were all freed, oldest first (an id may appear more than once, and may
    /// be held again since).
    idle: VecDeque<u32>,
    /// Ids no block holds any more, kept while trace events may still name them.
    retired: Vec<u32>,
}

/// A pool's tag strings by id (id 0 means no tag), and ids by string.
pub(crate) struct Tags {
    names: Py<PyList>,
    ids: Py<PyDict>,
    holds: Mutex<Holds>,
}

impl Tags {
    pub(crate) fn new(py: Python<'_>) -> PyResult<Tags> {
        Ok(Tags {
            names: PyList::new(py, [py.None()])?.unbind(),
            ids: PyDict::new(py).unbind(),
            holds: Mutex::new(Holds { counts: vec![0], ..Holds::default() }),
        })
    }

    fn holds(&self) -> MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of `tag` (interned on first use), 0 for none. Until [`Tags::hold`] counts a
    /// block for it, a new tag is dropped by the next [`Tags::release`] of 0 blocks.
    pub(crate) fn id(&self, py: Python<'_>, tag: Option<&Bound<'_, PyString>>) -> PyResult<u32> {
        let Some(tag) = tag else { return Ok(0) };
        let ids = self.ids.bind(py);
        if let Some(id) = ids.get_item(tag)? {
            return id.extract();
        }
        let names = self.names.bind(py);
        let mut holds = self.holds();
        let id = match holds.free.pop() {
            Some(id) => {
                names.set_item(id as usize, tag)?;
                id
            }
            None => {
                let id = names.len() as u32;
                names.append(tag)?;
                holds.counts.push(0);
                id
            }
        };
        ids.set_item(tag, id)?;
        Ok(id)
    }

    /// `blocks` new blocks carry tag `id`.
    pub(crate) fn hold(&self, id: u32, blocks: u64) {
        if id != 0 {
            self.holds().counts[id as usize] += blocks;
        }
    }

    /// `blocks` blocks carrying tag `id` were freed (0 after an allocation that failed). A tag
    /// no block holds becomes idle; the oldest idle tags beyond [`IDLE_KEEP`] are dropped, or
    /// retired while `tracing` (events may still name them).
    pub(crate) fn release(&self, py: Python<'_>, id: u32, blocks: u64, tracing: impl FnOnce() -> bool) {
        if id == 0 {
            return;
        }
        let mut holds = self.holds();
        let count = &mut holds.counts[id as usize];
        *count = count.saturating_sub(blocks);
        if *count > 0 {
            return;
        }
        holds.idle.push_back(id);
        if holds.idle.len() <= IDLE_KEEP {
            return;
        }
        let tracing = tracing();
        while holds.idle.len() > IDLE_KEEP / 2 {
            let Some(old) = holds.idle.pop_front() else { break };
            if holds.counts[old as usize] > 0 {
                continue;
            }
            if tracing {
                holds.retired.push(old);
            } else {
                self.drop_id(py, &mut holds, old);
            }
        }
    }

    /// Drop the retired tags that no block took up again (after a drain with recording off).
    pub(crate) fn drop_retired(&self, py: Python<'_>) {
        let mut holds = self.holds();
        for id in std::mem::take(&mut holds.retired) {
            if holds.counts[id as usize] == 0 {
                self.drop_id(py, &mut holds, id);
            }
        }
    }

    fn drop_id(&self, py: Python<'_>, holds: &mut Holds, id: u32) {
        let names = self.names.bind(py);
        if let Ok(name) = names.get_item(id as usize) {
            if !name.is_none() {
                let _ = self.ids.bind(py).del_item(&name);
                let _ = names.set_item(id as usize, py.None());
                holds.free.push(id);
            }
        }
    }

    /// Tags interned now (for tests and the table's size).
    pub(crate) fn len(&self, py: Python<'_>) -> usize {
        self.ids.bind(py).len()
    }

    /// The tag string of an id (None for 0 or unknown ids).
    pub(crate) fn name<'py>(&self, py: Python<'py>, id: u32) -> Option<Bound<'py, PyString>> {
        if id == 0 {
            return None;
        }
        self.names.bind(py).get_item(id as usize).ok().and_then(|t| t.cast_into::<PyString>().ok())
    }

    /// [`Tags::name`] as a Rust string.
    pub(crate) fn name_string(&self, py: Python<'_>, id: u32) -> Option<String> {
        self.name(py, id).map(|t| t.to_string())
    }

    /// [`Tags::name`] as a Python object (`None` without a tag).
    pub(crate) fn name_object<'py>(&self, py: Python<'py>, id: u32) -> Bound<'py, PyAny> {
        match self.name(py, id) {
            Some(t) => t.into_any(),
            None => py.None().into_bound(py),
        }
    }
}
