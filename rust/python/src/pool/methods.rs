//! The Python API of `Pool`.

use std::sync::Arc;

use npumem_core::{Backing, EventKind, Move, Placement};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::config::{config_error, growth_config, pool_config};
use super::deferred::{self, Deferred};
use super::detached::{Detached, DetachedBlock};
use super::pending::{Pending, PendingFrees};
use super::state::Pool;
use crate::args;
use crate::block::Block;
use crate::block_info::BlockInfo;
use crate::c_pool;
use crate::compaction_plan::CompactionPlan;
use crate::errors::{error, to_py, with_figures, ErrorClass};
use crate::gil::{detached, without_gil};
use crate::growth;
use crate::measure::Measurement;
use crate::mover;
use crate::oom::OomHandler;
use crate::pause::Pause;
use crate::pinned::read_block;
use crate::py_alloc;
use crate::snapshot::RawSnapshot;
use crate::stacks::Stacks;
use crate::staged_compaction::StagedCompaction;
use crate::stats::PoolStats;
use crate::step_report::StepReport;
use crate::tag_stats::TagStats;
use crate::tags::Tags;
use crate::trace::{event_tuple, TraceStatus};
use crate::user_code;
use crate::views;

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(
        signature = (
            capacity, *, cores = None, chunk_size = None, min_block = None, bank_size = None,
            alignment = None, slab_sizes = None, backing = None, placement = None,
            run_tails = None, core_reserve = None, name = None, base_address = None, device = None,
            max_capacity = None, grow_by = None, on_grow = None, on_trim = None,
        ),
        text_signature = "(capacity, *, cores=None, chunk_size=2097152, min_block=256, bank_size=4096, \
            alignment=64, slab_sizes=None, backing='host', \
            placement='best-fit', run_tails=True, core_reserve=1, name=None, base_address=None, device=None, \
            max_capacity=None, grow_by=None, on_grow=None, on_trim=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: &Bound<'_, PyAny>,
        cores: Option<&Bound<'_, PyAny>>,
        chunk_size: Option<&Bound<'_, PyAny>>,
        min_block: Option<&Bound<'_, PyAny>>,
        bank_size: Option<&Bound<'_, PyAny>>,
        alignment: Option<&Bound<'_, PyAny>>,
        slab_sizes: Option<&Bound<'_, PyAny>>,
        backing: Option<&Bound<'_, PyAny>>,
        placement: Option<&Bound<'_, PyAny>>,
        run_tails: Option<&Bound<'_, PyAny>>,
        core_reserve: Option<&Bound<'_, PyAny>>,
        name: Option<&Bound<'_, PyAny>>,
        base_address: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
        max_capacity: Option<&Bound<'_, PyAny>>,
        grow_by: Option<&Bound<'_, PyAny>>,
        on_grow: Option<&Bound<'_, PyAny>>,
        on_trim: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Pool> {
        let hooks = growth::Hooks::default();
        let [on_grow, on_trim] = hooks.set(on_grow, on_trim)?;
        let config = pool_config(
            py,
            capacity,
            cores,
            chunk_size,
            min_block,
            bank_size,
            alignment,
            slab_sizes,
            backing,
            placement,
            run_tails,
            core_reserve,
            base_address,
            device,
        )?;
        let config = growth_config(config, max_capacity, grow_by)?;
        let grows = config.max_capacity.is_some_and(|most| most > config.capacity);
        if !grows && (on_grow.is_some() || on_trim.is_some()) {
            let named = if on_grow.is_some() { "on_grow" } else { "on_trim" };
            return Err(config_error(format!(
                "{named} is called only when the pool adds or gives back a region, and this pool never \
                 does: give a max_capacity above capacity ({} bytes), or leave {named} out",
                config.capacity
            )));
        }
        let core = without_gil(py, || npumem_core::Pool::new(config))?;
        core.set_on_grow(on_grow);
        core.set_on_trim(on_trim);
        let name = match name.filter(|n| !n.is_none()) {
            Some(n) => {
                let name = n
                    .cast::<PyString>()
                    .map_err(|_| config_error(format!("name must be a str, got {}", args::type_name(n))))?;
                args::text(name, "name", ErrorClass::Config).map_err(|e| config_error(e.value(py).to_string()))?;
                name.clone()
            }
            None => PyString::new(py, &format!("pool-{}", core.id())),
        };
        let core = Arc::new(core);
        Ok(Pool {
            pending: Arc::new(PendingFrees::new(Arc::clone(&core))),
            detached: Detached::default(),
            core,
            name: name.unbind(),
            tags: Tags::new(py)?,
            oom: OomHandler::default(),
            hooks,
            stacks: Stacks::default(),
        })
    }

    /// Allocate a block of `nbytes` bytes. `align` (a power of two) overrides the pool's default
    /// alignment; `tag` is a free-form label shown in stats and snapshots.
    #[pyo3(signature = (nbytes, *, align = None, tag = None))]
    fn alloc<'py>(
        slf: &Bound<'py, Self>,
        nbytes: &Bound<'py, PyAny>,
        align: Option<&Bound<'py, PyAny>>,
        tag: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Block>> {
        let py = slf.py();
        let this = slf.get();
        let capacity = this.core.max_capacity();
        let size = match args::size(nbytes, "nbytes", args::Largest::of(&this.core)) {
            Ok(size) => size,
            Err(err) => return Err(this.refused(py, err, nbytes, align, tag)),
        };
        let core = &this.core;
        let recording = this.stacks.begin(py)?;
        // Neither alignment nor tag (the common call): nothing more to check, no tag to hold.
        let (align, tag, tag_id) = if align.is_none() && tag.is_none() {
            (None, None, 0)
        } else {
            let align = args::alignment(align, capacity)?;
            let tag = args::tag(tag)?;
            let tag_id = this.tags.acquire(py, core, tag.as_ref(), 1)?;
            (align, tag, tag_id)
        };
        let handle = match core.try_alloc_fast(size, align, tag_id) {
            Ok(Some(handle)) => handle,
            quick => {
                let made = match quick {
                    Ok(_) => this.oom.alloc(py, core, size, align, tag_id),
                    Err(err) => Err(to_py(err)),
                };
                made.inspect_err(|_| this.tags.release(core, tag_id, 1))?
            }
        };
        if let Some(recording) = recording {
            recording.finish([handle.to_bits()]);
        }
        Block::into_object(py, Block::new(slf.clone().unbind(), handle, size, tag.map(Bound::unbind), tag_id))
    }

    /// Allocate one block per size in `sizes` (all with the same `align` and `tag`), or none:
    /// if one allocation fails, the blocks already made are freed and the error says which
    /// one failed and why. In a pool that grows, the regions the failed batch added are given
    /// back when they are entirely free again (`on_trim` is called for each; `grow_events`
    /// keeps counting them), and a batch gives back no region that was there before it.
    #[pyo3(signature = (sizes, *, align = None, tag = None))]
    fn alloc_many<'py>(
        slf: &Bound<'py, Self>,
        sizes: &Bound<'py, PyAny>,
        align: Option<&Bound<'py, PyAny>>,
        tag: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let this = slf.get();
        let capacity = this.core.max_capacity();
        let items = sizes.try_iter().map_err(|_| {
            error(
                ErrorClass::ArgumentType,
                format!("sizes must be an iterable of ints, got {}", args::type_name(sizes)),
            )
        })?;
        let mut wanted = Vec::new();
        let largest = args::Largest::of(&this.core);
        for (i, item) in user_code::each(items).enumerate() {
            let item = item?;
            match args::size_named(&item, || format!("sizes[{i}]"), largest) {
                Ok(size) => args::push_fallibly(&mut wanted, size, "the batch's sizes")?,
                Err(err) => return Err(this.refused(py, err, &item, align, tag)),
            }
        }
        let align = args::alignment(align, capacity)?;
        let tag = args::tag(tag)?;
        let recording = this.stacks.begin(py)?;
        let blocks = wanted.len() as u64;
        let tag_id = this.tags.acquire(py, &this.core, tag.as_ref(), blocks)?;
        let handles = this.oom.alloc_many(py, &this.core, &wanted, align, tag_id).inspect_err(|_| {
            this.tags.release(&this.core, tag_id, blocks);
        })?;
        // The blocks become Python objects with signals checked now and then: a Ctrl-C raised
        // before the list reaches the caller drops it. A block made into a `Block` frees itself
        // as its object goes (its object failed to be made, or the list went); the rest are
        // freed here, or, while another thread's pause holds the pool past its timeout, wait
        // in the stranded frees as a collected block's free does.
        let mut made = 0;
        let list = (|| -> PyResult<Bound<'py, PyList>> {
            let list = PyList::empty(py);
            for (i, (&handle, &size)) in handles.iter().zip(&wanted).enumerate() {
                if i % 65536 == 65535 {
                    py.check_signals()?;
                }
                let tag = tag.as_ref().map(|t| t.clone().unbind());
                let block = Block::new(slf.clone().unbind(), handle, size, tag, tag_id);
                made = i + 1;
                list.append(Block::into_object(py, block)?)?;
            }
            py.check_signals()?;
            Ok(list)
        })()
        .inspect_err(|_| {
            let core = &this.core;
            let rest = &handles[made..];
            if detached(py, || core.free_many(rest)).is_ok() {
                this.tags.release(core, tag_id, rest.len() as u64);
            } else {
                for &handle in rest {
                    this.pending.strand(Pending { handle, tag_id });
                }
            }
        })?;
        if let Some(recording) = recording {
            recording.finish(handles.iter().map(|h| h.to_bits()));
        }
        Ok(list)
    }

    /// Free every block of `blocks`, or none: all are checked first (blocks of this pool,
    /// alive, not pinned, no block twice) and the error names the first that is not (both
    /// places of a block named twice).
    fn free_many(slf: &Bound<'_, Self>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let items = blocks.try_iter().map_err(|_| {
            error(
                ErrorClass::ArgumentType,
                format!("blocks must be an iterable of npumem.Block, got {}", args::type_name(blocks)),
            )
        })?;
        let mut handles = Vec::new();
        let mut freed = Vec::new();
        let mut blocks = Vec::new();
        for (i, item) in user_code::each(items).enumerate() {
            // A long list is read with signals checked now and then (Ctrl-C): nothing is freed
            // before every block is read, claimed and checked, so a handler that raises here
            // leaves the batch undone. The frees themselves run to the end once begun (all or
            // none).
            if i % 65536 == 65535 {
                py.check_signals()?;
            }
            let item = item?;
            let block = item.cast::<Block>().map_err(|_| {
                error(
                    ErrorClass::ArgumentType,
                    format!("blocks[{i}] must be an npumem.Block, got {}", args::type_name(&item)),
                )
            })?;
            args::push_fallibly(&mut handles, block.get().handle_to_free(slf.get(), i)?, "the batch's handles")?;
            args::push_fallibly(&mut freed, block.get().tag_and_size(), "the batch's sizes")?;
            args::push_fallibly(&mut blocks, block.clone(), "the batch's blocks")?;
        }
        if let Some((first, again)) = npumem_core::Handle::named_twice(&handles) {
            return Err(to_py(npumem_core::Error::NamedTwice { first, again }));
        }
        let this = slf.get();
        if deferred::deferring(&this.pending) {
            return defer_all(this, &blocks);
        }
        let core = &this.core;
        // Each block is claimed first, as `Block.free` claims it: while the batch is freed
        // without the GIL, no other call can detach a block of it or queue its free.
        let mut claims = Vec::new();
        let unclaim = |claims: &[Option<u64>]| {
            for (block, &claim) in blocks.iter().zip(claims) {
                block.get().unclaim_free(claim);
            }
        };
        for (i, block) in blocks.iter().enumerate() {
            let claimed = block.get().claim_free(Some(i)).and_then(|claim| {
                args::push_fallibly(&mut claims, claim, "the batch's claims")
                    .inspect_err(|_| block.get().unclaim_free(claim))
            });
            if let Err(err) = claimed {
                unclaim(&claims);
                return Err(err);
            }
        }
        if let Err(err) = without_gil(py, || core.free_many(&handles)) {
            unclaim(&claims);
            return Err(err);
        }
        for block in &blocks {
            block.get().mark_freed();
        }
        freed.sort_unstable();
        for run in freed.chunk_by(|a, b| a.0 == b.0) {
            let tag = run[0].0;
            this.tags.release(core, tag, run.len() as u64);
        }
        Ok(())
    }

    /// A context manager under which every free of this pool's blocks made by this thread
    /// (`free()`, `free_many()`, a `with` block's exit, a block whose last reference goes) is
    /// queued; the queue is freed as one batch when the outermost such scope exits, also when
    /// its body raises. The blocks are unusable from the moment their free is queued.
    fn deferred(slf: &Bound<'_, Self>) -> Deferred {
        Deferred::new(slf.clone().unbind())
    }

    /// Queue the free of `block` until `flush_deferred()` (or, inside a `with pool.deferred():`
    /// scope of this thread, until the scope exits). The block is unusable at once; a freed,
    /// deferred or pinned block is refused as `free()` would refuse it.
    fn defer_free(slf: &Bound<'_, Self>, block: &Bound<'_, PyAny>) -> PyResult<()> {
        let block = block.cast::<Block>().map_err(|_| {
            error(
                ErrorClass::ArgumentType,
                format!("defer_free() takes an npumem.Block, got {}", args::type_name(block)),
            )
        })?;
        block.get().defer_in(slf.get())
    }

    /// Free every queued free of `defer_free()` as one batch, and retry the frees of collected
    /// blocks that waited for the pool. Returns the blocks freed. A block pinned meanwhile (by
    /// C code) stays queued; a handle freed meanwhile through its raw handle raises
    /// `InvalidHandleError` after every other free was made; a pause of another thread that
    /// outlasts the wait raises its `PoolBusyError`, the frees not made still queued.
    fn flush_deferred(&self, py: Python<'_>) -> PyResult<usize> {
        let batch = self.pending.take(true);
        let (freed, failed) = self.pending.flush(py, batch);
        match failed {
            Some(err) => Err(err),
            None => Ok(freed),
        }
    }

    /// Take back ownership of a block given up by `Block.detach()`: a new `Block` for `handle`.
    /// Raises `InvalidHandleError` for a handle that is freed, stale or of another pool, for a
    /// value that no pool handed out as a handle, and for one that is not detached (a `Block`
    /// owns it, or it was adopted already). The new object holds the pins that `pin()` took
    /// through the detached one.
    fn adopt<'py>(slf: &Bound<'py, Self>, handle: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Block>> {
        let this = slf.get();
        let not_a_handle = |bits: &str| {
            error(ErrorClass::InvalidHandle, format!("{bits} is not a block's handle (Block.handle, Block.detach())"))
        };
        let bits = args::int_value(handle, "handle", ErrorClass::ArgumentType)?.map_err(|text| not_a_handle(&text))?;
        let bits = u128::try_from(bits).ok().filter(|&b| b < 1 << 96).ok_or_else(|| not_a_handle(&bits.to_string()))?;
        let raw = npumem_core::Handle::from_bits(bits);
        read_block(slf.py(), &this.core, raw).map_err(|err| match err {
            // Bits that name no block any pool handed out (a made-up pool id or generation).
            npumem_core::Error::InvalidHandle(npumem_core::HandleFault::Unknown) => not_a_handle(&bits.to_string()),
            err => to_py(err),
        })?;
        let Some(found) = this.detached.take(bits) else {
            return Err(error(
                ErrorClass::InvalidHandle,
                "the handle is not detached: a Block owns it, or it was adopted already (only \
                 handles given by Block.detach() can be adopted)",
            ));
        };
        let DetachedBlock { nbytes, tag, tag_id, pins } = found;
        Block::into_object(slf.py(), Block::adopted(slf.clone().unbind(), raw, nbytes, tag, tag_id, pins))
    }

    /// Free `block` (the same as `block.free()`).
    fn free(slf: &Bound<'_, Self>, block: &Bound<'_, PyAny>) -> PyResult<()> {
        let block = block.cast::<Block>().map_err(|_| {
            error(ErrorClass::ArgumentType, format!("free() takes an npumem.Block, got {}", args::type_name(block)))
        })?;
        block.get().free_in(slf.py(), slf.get())
    }

    /// A snapshot of the pool's state and counters.
    fn stats(&self, py: Python<'_>) -> PyResult<PoolStats> {
        self.retry_stranded(py);
        let core = &self.core;
        let stats = without_gil(py, || Ok(core.stats()))?;
        let stats = PoolStats::from_core(stats, self.core.config().capacity, TagStats::read(core));
        Ok(stats.with_frees(self.pending.count() as u64, self.pending.collected()))
    }

    /// Start a new peak: `peak_bytes_in_use` becomes the bytes in use now, and every tag's peak
    /// its bytes in use now (like `torch.cuda.reset_peak_memory_stats`).
    fn reset_peak(&self) {
        self.core.reset_peak();
        self.core.reset_tag_peaks();
    }

    /// The statistics of a scope: `with pool.measure() as m:` gives `m.peak_bytes_in_use`, the
    /// allocations, frees and failed allocations made in it, and the bytes in use when it began
    /// and ended. Scopes nest; the pool's own peak is kept (the larger of the two). The figures
    /// cover every thread of the pool.
    fn measure(slf: &Bound<'_, Self>) -> Measurement {
        Measurement::new(slf.clone().unbind())
    }

    /// Pause the pool and prove its metadata consistent; raises `CorruptionError` with the
    /// findings otherwise. Returns the number of live blocks checked.
    fn check(&self, py: Python<'_>) -> PyResult<usize> {
        let core = &self.core;
        // The walk of a large arena takes seconds: between steps, the signals that came (Ctrl-C,
        // SIGTERM) run their handlers, and an exception they raise ends the check.
        let mut raised: Option<PyErr> = None;
        let mut go_on = || user_code::attach(|py| py.check_signals().map_err(|err| raised = Some(err)).is_ok());
        match without_gil(py, || core.check_until(&mut go_on))? {
            Some(live) => Ok(live),
            None => Err(raised.take().unwrap_or_else(|| error(ErrorClass::Corruption, "the check was stopped"))),
        }
    }

    /// Every live block, in offset order, at one moment: the pool pauses (without the GIL)
    /// while its handles are read, as for a snapshot.
    fn blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let core = &self.core;
        // No tag id is dropped (and reused) until the blocks' names are read.
        let _pin = core.tags().pin();
        let blocks = without_gil(py, || core.blocks())?;
        py_alloc::list(
            py,
            blocks.iter().map(|b| Ok(Bound::new(py, BlockInfo::from_core(py, b, &self.tags, core))?.into_any())),
        )
    }

    /// Pause the pool (without the GIL) and record every live block, every maximal free run,
    /// and the stats, all at one moment.
    fn raw_snapshot(&self, py: Python<'_>) -> PyResult<RawSnapshot> {
        let core = &self.core;
        // As for `check()`: between steps of the walk of a large arena the signals that came
        // run their handlers, and an exception they raise ends the snapshot (the pool resumed).
        let mut raised: Option<PyErr> = None;
        let mut go_on = || user_code::attach(|py| py.check_signals().map_err(|err| raised = Some(err)).is_ok());
        // No tag id is dropped (and reused) until the blocks' names are read, after the pause:
        // the last block of a pooled tag freed meanwhile would take its name along otherwise.
        let _pin = core.tags().pin();
        let snap = match without_gil(py, || core.snapshot_until(&mut go_on))? {
            Some(snap) => snap,
            None => {
                return Err(raised.take().unwrap_or_else(|| error(ErrorClass::PoolBusy, "the snapshot was stopped")))
            }
        };
        RawSnapshot::from_core(py, snap, &self.tags, core)
    }

    /// Pause the pool and return an `npumem.monitor.Snapshot`: every live block, every maximal
    /// free run, and the stats, all at one moment.
    fn snapshot<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let raw = slf.get().raw_snapshot(slf.py())?;
        views::present_snapshot(slf.as_any(), raw)
    }

    /// Start a fresh event trace; events of an earlier trace that were not drained are
    /// discarded. Pauses the pool briefly. The events go to `cores + 1` rings: one per core
    /// pool, each taken by the first thread that records into it and kept by that thread until
    /// it exits, and one that every further thread shares. Every ring holds `capacity / cores`
    /// events rounded up to a power of two, at least 16, and overwrites its oldest events when
    /// full (counted as dropped). So the rings hold `cores + 1` times that in all
    /// (`trace_status().capacity`), and one thread keeps at most one ring's worth between
    /// drains: with `cores=4`, `trace_start(1000)` makes rings of 256 events, 1280 in all, and
    /// a single thread keeps its latest 256. The rings take 64 bytes per event. With
    /// `stacks=True` every allocation made through Python also records the Python call stack
    /// of its caller (at most 32 frames, most recent call first), which `trace_drain` attaches
    /// to its `alloc` event; this costs a few microseconds per allocation. The pool keeps the
    /// stacks of the latest allocations only, as many as the rings hold events: the stack of an
    /// event the rings overwrote is let go.
    #[pyo3(signature = (capacity = None, *, stacks = None), text_signature = "(self, capacity=65536, *, stacks=False)")]
    fn trace_start(
        &self,
        py: Python<'_>,
        capacity: Option<&Bound<'_, PyAny>>,
        stacks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let n = args::trace_capacity(capacity)?;
        let stacks = args::flag(stacks, "stacks")?;
        let core = &self.core;
        without_gil(py, || core.trace_start(n))?;
        self.stacks.start(stacks, core.trace_status().capacity);
        Ok(())
    }

    /// Stop recording; events recorded so far (and their stacks) stay until drained.
    fn trace_stop(&self, py: Python<'_>) -> PyResult<()> {
        self.stacks.stop();
        let core = &self.core;
        without_gil(py, || core.trace_stop())
    }

    /// The events recorded since the last drain, oldest first, as tuples
    /// `(time_ns, kind, offset, size, core, tag, handle, aux, stack)`; `stack` is a tuple of
    /// `(file, line, function)` for allocations traced with `stacks=True`, else None.
    fn trace_drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let core = &self.core;
        // No tag id is dropped (and reused) until the drained events' names are read.
        let pin = core.tags().pin();
        let stacks = &self.stacks;
        let events = without_gil(py, || {
            let events = core.trace_drain()?;
            stacks.settle(core.paused_by_caller());
            Ok(events)
        })?;
        let tuples = py_alloc::list(
            py,
            events.iter().map(|e| {
                let stack = if e.kind == EventKind::Alloc { self.stacks.take(py, e.handle)? } else { None };
                Ok(event_tuple(py, e, &self.tags, core, stack)?.into_any())
            }),
        );
        drop(pin);
        core.trace_drained_tags();
        tuples
    }

    /// How many tag names the pool keeps now: those live blocks carry, a bounded number of idle
    /// ones, and those undrained trace events may name.
    fn _tags_interned(&self) -> usize {
        self.core.tags().interned()
    }

    /// Where the trace stands: enabled, capacity, recorded, drained, dropped.
    fn trace_status(&self) -> TraceStatus {
        self.core.trace_status().into()
    }

    /// Pause the pool: wait (at most `timeout` seconds) for alloc and free calls in flight, then
    /// hold other threads' calls until the returned `Pause` is resumed, each at most `timeout`
    /// seconds (then it raises `PoolBusyError`, having done nothing). The calling thread may
    /// still use the pool. `timeout` is a finite number of seconds >= 0 (at most an hour is
    /// used).
    #[pyo3(signature = (timeout = None), text_signature = "(self, timeout=10.0)")]
    fn pause(slf: &Bound<'_, Self>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Pause> {
        Pause::take(slf, timeout)
    }

    /// Whether the calling thread holds this pool's pause now (`pause()`, not yet resumed).
    fn paused_by_caller(&self) -> bool {
        self.core.paused_by_caller()
    }

    /// Move blocks while `pause` holds the pool: `moves` are `(block, offset)` pairs, validated
    /// before anything moves; `mover(transfers)` copies the bytes of `backing="none"` pools.
    /// Returns the copies made, in order, as `(src, dst, nbytes)`.
    #[pyo3(signature = (pause, moves, *, mover = None))]
    fn move_blocks<'py>(
        slf: &Bound<'py, Self>,
        pause: &Bound<'py, PyAny>,
        moves: &Bound<'py, PyAny>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let pool = slf.get();
        let pause = Pause::of(pool, pause)?;
        let mover = args::callable(mover, "mover")?;
        let items = moves.try_iter().map_err(|_| {
            error(
                ErrorClass::ArgumentType,
                format!("moves must be an iterable of (Block, offset), got {}", args::type_name(moves)),
            )
        })?;
        let mut batch = Vec::new();
        for (i, item) in user_code::each(items).enumerate() {
            let item = item?;
            let pair = item.cast::<PyTuple>().ok().filter(|t| t.len() == 2).ok_or_else(|| {
                error(
                    ErrorClass::ArgumentType,
                    format!("moves[{i}] must be a (Block, offset) pair, got {}", args::type_name(&item)),
                )
            })?;
            let block = pair.get_item(0)?;
            let block = block.cast::<Block>().map_err(|_| {
                error(
                    ErrorClass::ArgumentType,
                    format!("moves[{i}][0] must be an npumem.Block, got {}", args::type_name(&block)),
                )
            })?;
            let handle = block.get().handle_in(pool, i)?;
            let to = args::int_value(&pair.get_item(1)?, &format!("moves[{i}][1]"), ErrorClass::ArgumentType)?;
            let to = match to.as_ref().map(|&n| usize::try_from(n)) {
                Ok(Ok(to)) => to,
                Ok(Err(_)) | Err(_) => {
                    let text = to.map_or_else(|text| text, |n| n.to_string());
                    if text.starts_with('-') {
                        return Err(error(
                            ErrorClass::InvalidArgument,
                            format!("moves[{i}][1] must be an offset >= 0, got {text}"),
                        ));
                    }
                    // Past every offset: refused as the core refuses a destination outside the
                    // arena.
                    let reason = format!("destination {text} lies outside the arena ({} bytes)", pool.core.capacity());
                    return Err(to_py(npumem_core::Error::batch(i, npumem_core::Error::InvalidMove { reason })));
                }
            };
            batch.push(Move { handle, to });
        }
        let core = &pool.core;
        let done = pause.with_token(|token| {
            mover::run_with(py, mover.as_ref(), core.base_address(), |m| core.move_blocks(token, &batch, m))
        })?;
        PyList::new(py, done.transfers.iter().map(|t| (t.src, t.dst, t.len)))
    }

    /// One compaction while `pause` holds the pool: `mode` is `"full"`, `"incremental"` (with
    /// `max_bytes`) or `"evacuate"` (with `chunks`). Returns what it did.
    #[pyo3(
        signature = (pause, mode = None, *, max_bytes = None, chunks = None, mover = None),
        text_signature = "(self, pause, mode='full', *, max_bytes=None, chunks=None, mover=None)"
    )]
    fn compact_step<'py>(
        slf: &Bound<'py, Self>,
        pause: &Bound<'py, PyAny>,
        mode: Option<&Bound<'py, PyAny>>,
        max_bytes: Option<&Bound<'py, PyAny>>,
        chunks: Option<&Bound<'py, PyAny>>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<StepReport> {
        let py = slf.py();
        let pool = slf.get();
        let pause = Pause::of(pool, pause)?;
        let mode = args::compaction_mode(&args::mode_name(mode)?, max_bytes, chunks)?;
        let mover = args::callable(mover, "mover")?;
        let core = &pool.core;
        let done = pause.with_token(|token| {
            mover::run_with(py, mover.as_ref(), core.base_address(), |m| core.compact_step(token, &mode, m))
        })?;
        Ok(StepReport::from_core(&done))
    }

    /// Plan a compaction without stopping the pool (other threads go on allocating and freeing;
    /// the plan may be stale by the time it runs): `run_staged` makes it on the paused pool.
    /// `mode`, `max_bytes`, `chunks` as for `compact_step`; `mover`: it will run with one.
    #[pyo3(
        signature = (mode = None, *, max_bytes = None, chunks = None, mover = None),
        text_signature = "(self, mode='full', *, max_bytes=None, chunks=None, mover=None)"
    )]
    fn stage_compaction<'py>(
        slf: &Bound<'py, Self>,
        mode: Option<&Bound<'py, PyAny>>,
        max_bytes: Option<&Bound<'py, PyAny>>,
        chunks: Option<&Bound<'py, PyAny>>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<StagedCompaction> {
        let py = slf.py();
        let mode = args::compaction_mode(&args::mode_name(mode)?, max_bytes, chunks)?;
        let with_mover = args::callable(mover, "mover")?.is_some();
        let core = &slf.get().core;
        Ok(StagedCompaction::new(without_gil(py, || core.stage_compaction(&mode, with_mover))?))
    }

    /// Make a staged compaction while `pause` holds the pool: only its moves are checked, the
    /// stale ones dropped (`StepReport.stale`), the others made. `mover` as the plan was staged.
    #[pyo3(signature = (pause, staged, *, mover = None))]
    fn run_staged<'py>(
        slf: &Bound<'py, Self>,
        pause: &Bound<'py, PyAny>,
        staged: &Bound<'py, PyAny>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<StepReport> {
        let py = slf.py();
        let pool = slf.get();
        let staged = staged.cast::<StagedCompaction>().map_err(|_| {
            error(
                ErrorClass::ArgumentType,
                format!(
                    "staged must be a StagedCompaction (from pool.stage_compaction()), got {}",
                    args::type_name(staged)
                ),
            )
        })?;
        let pause = Pause::of(pool, pause)?;
        let mover = args::callable(mover, "mover")?;
        let core = &pool.core;
        let plan = staged.get().take()?;
        let done = pause.with_token(|token| {
            mover::run_with(py, mover.as_ref(), core.base_address(), |m| core.run_staged(token, plan, m))
        })?;
        let report = StepReport::from_core(&done);
        staged.get().ran(report.clone());
        Ok(report)
    }

    /// What `compact_step` would do, moving nothing (pauses the pool briefly unless `pause`
    /// holds it already); with `mover`, as `compact_step` with that mover would.
    #[pyo3(
        signature = (mode = None, *, max_bytes = None, chunks = None, pause = None, mover = None),
        text_signature = "(self, mode='full', *, max_bytes=None, chunks=None, pause=None, mover=None)"
    )]
    fn plan_compaction<'py>(
        slf: &Bound<'py, Self>,
        mode: Option<&Bound<'py, PyAny>>,
        max_bytes: Option<&Bound<'py, PyAny>>,
        chunks: Option<&Bound<'py, PyAny>>,
        pause: Option<&Bound<'py, PyAny>>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<CompactionPlan> {
        let py = slf.py();
        let pool = slf.get();
        let mode = args::mode_name(mode)?;
        let parsed = args::compaction_mode(&mode, max_bytes, chunks)?;
        let with_mover = args::callable(mover, "mover")?.is_some();
        let core = &pool.core;
        let plan = match pause.filter(|p| !p.is_none()) {
            Some(p) => Pause::of(pool, p)?
                .with_token(|token| without_gil(py, || core.plan_compaction_with(Some(token), &parsed, with_mover)))?,
            None => without_gil(py, || core.plan_compaction_with(None, &parsed, with_mover))?,
        };
        Ok(CompactionPlan::from_core(&mode, &plan))
    }

    /// Set the callable `handler(nbytes) -> bool` that a failing allocation calls before it
    /// raises `OutOfMemoryError` (a true result retries the allocation once), or `None`. A
    /// handler that raises is that error's `__cause__`.
    /// Returns the previous handler.
    fn set_oom_handler(&self, handler: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        self.oom.replace(handler)
    }

    /// The out-of-memory handler, or None.
    #[getter]
    fn oom_handler(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.oom.get(py)
    }

    fn __traverse__(&self, visit: pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.oom.traverse(&visit)?;
        self.hooks.traverse(&visit)
    }

    fn __clear__(&self) {
        self.stacks.clear();
        self.oom.clear();
        self.hooks.clear();
    }

    /// Give back what cores keep cached (freed blocks kept for reuse, all-free slabs, empty
    /// reserve chunks) now rather than
    /// when an allocation needs the room; then, in a pool that grew, every region that is
    /// entirely free except the first (`on_trim(offset, nbytes)` is called for each). Returns
    /// how many slabs and chunks went back, the chunks of those regions included. Waits for
    /// another thread's pause as `alloc` does: `PoolBusyError` when the pause outlasts its
    /// timeout (or inside a mover), and nothing is given back then.
    fn trim(&self, py: Python<'_>) -> PyResult<usize> {
        let core = &self.core;
        without_gil(py, || core.trim())
    }

    /// Bytes in the arena: `capacity`, plus the regions a pool that grows added (less those
    /// `trim()` gave back).
    #[getter]
    fn capacity(&self) -> usize {
        self.core.capacity()
    }

    /// The most bytes the pool may grow to (`capacity` for a pool that cannot grow).
    #[getter]
    fn max_capacity(&self) -> usize {
        self.core.max_capacity()
    }

    /// The bytes its offsets range over: `capacity` for a pool that cannot grow; for one that
    /// can, twice `max_capacity` in whole chunks (regions lie a chunk apart, and come and go),
    /// so a block's `offset + block_bytes` may pass `max_capacity`. The address range a
    /// runtime reserves from `base_address`, and the size of a `HostMirror` for the pool.
    #[getter]
    fn offset_space(&self) -> usize {
        self.core.config().offset_space()
    }

    /// The regions with memory behind them, as `(offset, nbytes)` pairs by offset: one unless
    /// the pool grew.
    fn regions(&self) -> Vec<(usize, usize)> {
        self.core.regions().into_iter().map(|r| (r.offset, r.bytes)).collect()
    }

    /// Number of per-core pools.
    #[getter]
    fn cores(&self) -> usize {
        self.core.cores()
    }

    /// Bytes of a chunk: the unit a core pool takes from the global pool, and the largest
    /// block of a chunk's buddy tree (larger blocks take runs of chunks).
    #[getter]
    fn chunk_size(&self) -> usize {
        self.core.config().chunk_size
    }

    /// Bytes of the smallest buddy block (a leaf of a chunk's tree): buddy blocks are cut in
    /// multiples of it.
    #[getter]
    fn min_block(&self) -> usize {
        self.core.config().min_block
    }

    /// Bytes of a bank: a block of at most a bank never straddles a bank boundary, and a
    /// larger one starts on one.
    #[getter]
    fn bank_size(&self) -> usize {
        self.core.config().bank_size
    }

    /// The alignment in bytes of a block allocated without `align`.
    #[getter]
    fn alignment(&self) -> usize {
        self.core.config().alignment
    }

    /// The slab caches' size classes in bytes, smallest first (empty: no slab caches, every
    /// block comes from the buddy trees).
    #[getter]
    fn slab_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.core.config().slab_sizes)
    }

    /// `"host"` or `"none"`.
    #[getter]
    fn backing(&self) -> &'static str {
        match self.core.config().backing {
            Backing::Host => "host",
            Backing::None => "none",
        }
    }

    /// `"best-fit"` or `"first-fit"`: how the global pool places chunk runs.
    #[getter]
    fn placement(&self) -> &'static str {
        match self.core.config().placement {
            Placement::BestFit => "best-fit",
            Placement::FirstFit => "first-fit",
        }
    }

    /// Whether a block past a chunk is its whole chunks and a tail at the start of the next
    /// chunk (at most 1/16 over the request) rather than whole chunks only.
    #[getter]
    fn run_tails(&self) -> bool {
        self.core.config().run_tails
    }

    /// Empty chunks each core keeps in reserve.
    #[getter]
    fn core_reserve(&self) -> usize {
        self.core.config().core_reserve
    }

    /// The address of offset 0: the host mapping's of a host pool, the `base_address` given
    /// otherwise (0 if none). `Block.address` is this plus the block's offset.
    #[getter]
    fn base_address(&self) -> u64 {
        self.core.base_address()
    }

    /// The device the memory lives on: a DLPack device type name and an index, e.g.
    /// `("cuda", 0)`; `("cpu", 0)` for host pools, `("ext_dev", 0)` for `backing="none"` pools
    /// that did not name one.
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let device = self.core.device();
        match device.type_name() {
            Some(name) => (name, device.index).into_pyobject(py),
            None => (device.type_code, device.index).into_pyobject(py),
        }
    }

    /// This pool for C code in the same process: a capsule named `npumem.pool` holding an
    /// `npumem_pool*` (see `npumem.h`) with one reference, released with the capsule. C code
    /// that keeps the pointer longer takes its own with `npumem_pool_retain`.
    fn c_pool<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        c_pool::capsule(py, &self.core)
    }

    /// The pool's name (labels its metrics).
    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    /// A number that tells this pool apart from every other pool of the process, never reused
    /// (names may repeat): `Snapshot.with_kv` checks with it that a cache is of the same pool.
    #[getter(_id)]
    fn id(&self) -> u32 {
        self.core.id()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<npumem.Pool {:?} capacity={} cores={} backing={}>",
            self.name.bind(py).to_string_lossy(),
            self.core.capacity(),
            self.core.cores(),
            self.backing()
        )
    }
}

/// Queue the frees of `blocks` (checked by `free_many`) in this thread's deferred scope: all or
/// none.
fn defer_all(pool: &Pool, blocks: &[Bound<'_, Block>]) -> PyResult<()> {
    for block in blocks {
        block.get().check_freeable(pool)?;
    }
    let mut before = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let Some(state) = block.get().mark_deferred() else {
            // Another thread ended a block's ownership (or pinned it) meanwhile: leave the
            // others as they were.
            for (earlier, state) in blocks[..i].iter().zip(before) {
                earlier.get().unmark_deferred(state);
            }
            return Err(block.get().deferral_refused(Some(i)));
        };
        before.push(state);
    }
    let items: Vec<Pending> = blocks.iter().map(|b| b.get().pending()).collect();
    if !deferred::queue_in_scope(&pool.pending, &items) {
        pool.pending.defer(&items);
    }
    Ok(())
}

impl Pool {
    /// Retry the frees of collected blocks that waited for the pool (not while another thread
    /// pauses it: they keep waiting).
    pub(crate) fn retry_stranded(&self, py: Python<'_>) {
        if self.pending.has_stranded() && !self.core.is_paused() {
            let batch = self.pending.take(false);
            let _ = self.pending.flush(py, batch);
        }
    }

    /// `err`, the refusal of a size argument; a size larger than any block the pool can hold
    /// also counts as a failed allocation in the core (and is traced as one), as
    /// `RequestTooLargeError` is an `OutOfMemoryError`, and carries the figures of one:
    /// `requested` (the size as given), `bytes_free` and `largest_free_block`.
    fn refused(
        &self,
        py: Python<'_>,
        err: PyErr,
        nbytes: &Bound<'_, PyAny>,
        align: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyErr {
        let capacity = self.core.max_capacity();
        let too_large = ErrorClass::RequestTooLarge.class(py).is_ok_and(|class| err.is_instance(py, class));
        if too_large {
            // The size as the refusal read it (an int, or what `__index__` gave).
            let size = args::int_value(nbytes, "nbytes", ErrorClass::ArgumentType)
                .ok()
                .and_then(|n| n.ok())
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(usize::MAX);
            let align = args::alignment(align, capacity).ok().flatten();
            let tag = args::tag(tag).ok().flatten();
            let tag_id = self.tags.acquire(py, &self.core, tag.as_ref(), 1).unwrap_or(0);
            // Without the GIL: the failure's record waits for another thread's pause.
            let refused = detached(py, || self.core.refuse_too_large(size, align, tag_id));
            self.tags.release(&self.core, tag_id, 1);
            if let npumem_core::Error::TooLarge { bytes_free, largest_free_block, .. } = refused {
                let requested = py
                    .import("operator")
                    .and_then(|operator| user_code::call(&operator.getattr("index")?, (nbytes,)))
                    .unwrap_or_else(|_| nbytes.clone());
                let message = err.value(py).str().map_or_else(|_| String::new(), |text| text.to_string());
                return with_figures(ErrorClass::RequestTooLarge, message, &requested, bytes_free, largest_free_block);
            }
        }
        err
    }
}
