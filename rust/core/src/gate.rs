//! The stop gate: compaction and `check()` pause a pool's alloc and free calls, wait for the
//! ones in flight to finish, and later let everything go on.
//!
//! The fast path pays one atomic load of the gate plus two plain stores to a thread-local record:
//!
//! ```text
//! enter:  record.active = pool        (relaxed store)
//!         light barrier               (compiler fence; a full fence without membarrier)
//!         if gate.closed (acquire load): record.active = 0, wait until open, retry
//! exit:   record.active = 0           (release store)
//! pause:  gate.closed = 1; heavy barrier (membarrier: a full fence on every running thread);
//!         wait until no record has active == pool (with a timeout)
//! ```
//!
//! The heavy barrier orders every other thread's store to its record before the pauser's reads
//! (the asymmetric Dekker pattern of folly and liburcu): either the entering thread sees the gate
//! closed, or the pauser sees it in flight. Without `membarrier` (old kernels), both barriers are
//! plain SeqCst fences. Records live in a global list; a thread takes a free one on first use and
//! hands it back when it exits.
//!
//! Held pauses (for compaction): a pauser may keep the gate closed across several calls
//! with a *ticket* (`pause_owned`): the gate's word holds the ticket instead of 1, so only that
//! ticket resumes it. The thread that took it (its record's *token*, fresh every time a record is
//! handed to a thread) may still enter, one call at a time as any nested caller, except while it
//! has marked the gate *busy* (it is moving blocks: its own calls must then fail, not wait for
//! themselves). Closing waits at most the timeout for another pauser, too, so nothing waits
//! forever on a pause someone forgot to end.
//!
//! Interruptible waits: every wait for another thread's pause (a call waiting for the gate to
//! open, a pauser waiting for another pause, for the pausers' lock or for calls in flight) runs
//! in slices of [`WAIT_SLICE`]. Between slices it asks the calling thread's interrupt check, if
//! [`interruptible`] set one (the Python binding runs the signal handlers there); when the check
//! says so, the wait gives up and the call fails having done nothing. The fast path never looks
//! at the check: only a thread that found the gate closed does.

#[cfg(not(loom))]
use std::cell::Cell;
#[cfg(not(loom))]
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[cfg(not(loom))]
use crate::util::sync::AtomicU32;
use crate::util::sync::{fence, spin_hint, AtomicU64, AtomicUsize, Ordering};

/// A thread's in-flight flag: the key of the gate it is inside now ([`Gate::key`]), or 0.
/// Written on every call, so each record has its cache lines to itself: two threads' records
/// side by side on one line made every alloc and free of one thread miss in the other's cache.
#[repr(align(128))]
pub(crate) struct Record {
    active: AtomicUsize,
    /// The key of the gate whose pausers' lock this thread takes or holds, or 0: after a
    /// `fork()` the child cannot pause that gate (the lock's holder does not exist there).
    pausing: AtomicUsize,
    in_use: AtomicUsize,
    next: AtomicUsize, // *const Record as usize
    /// Who uses the record now: a fresh number every time it is handed to a thread (a held
    /// pause names its holder by it).
    token: AtomicU64,
}

/// The list of every thread's record (records are never freed, only reused).
pub(crate) struct Registry {
    head: AtomicUsize,
    /// The last token handed out.
    tokens: AtomicU64,
}

impl Registry {
    #[cfg(not(loom))]
    const fn new() -> Registry {
        Registry { head: AtomicUsize::new(0), tokens: AtomicU64::new(0) }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> Registry {
        Registry { head: AtomicUsize::new(0), tokens: AtomicU64::new(0) }
    }

    /// A record for the calling thread: a free one reused, or a new one pushed.
    pub(crate) fn acquire(&self) -> &'static Record {
        let mut at = self.head.load(Ordering::Acquire);
        while at != 0 {
            // SAFETY: list entries are leaked `Record`s, never freed.
            let record: &'static Record = unsafe { &*(at as *const Record) };
            if record.in_use.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                record.token.store(self.tokens.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
                return record;
            }
            at = record.next.load(Ordering::Acquire);
        }
        let record: &'static Record = Box::leak(Box::new(Record {
            active: AtomicUsize::new(0),
            pausing: AtomicUsize::new(0),
            in_use: AtomicUsize::new(1),
            next: AtomicUsize::new(0),
            token: AtomicU64::new(self.tokens.fetch_add(1, Ordering::Relaxed) + 1),
        }));
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            record.next.store(head, Ordering::Relaxed);
            match self.head.compare_exchange_weak(
                head,
                record as *const Record as usize,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return record,
                Err(seen) => head = seen,
            }
        }
    }

    fn for_each(&self, mut f: impl FnMut(&Record) -> bool) -> bool {
        let mut at = self.head.load(Ordering::Acquire);
        while at != 0 {
            // SAFETY: list entries are leaked `Record`s, never freed.
            let record: &Record = unsafe { &*(at as *const Record) };
            if !f(record) {
                return false;
            }
            at = record.next.load(Ordering::Acquire);
        }
        true
    }
}

impl Record {
    pub(crate) fn release(&self) {
        self.active.store(0, Ordering::Release);
        self.pausing.store(0, Ordering::Release);
        self.in_use.store(0, Ordering::Release);
    }
}

#[cfg(not(loom))]
static REGISTRY: Registry = Registry::new();

#[cfg(not(loom))]
struct ThreadRecord(&'static Record);

#[cfg(not(loom))]
impl Drop for ThreadRecord {
    fn drop(&mut self) {
        let _ = FAST_RECORD.try_with(|fast| fast.set(std::ptr::null()));
        self.0.release();
    }
}

#[cfg(not(loom))]
thread_local! {
    static RECORD: ThreadRecord = ThreadRecord(REGISTRY.acquire());
    /// A shortcut to `RECORD`'s record (no lazy-init check); cleared when `RECORD` drops.
    static FAST_RECORD: std::cell::Cell<*const Record> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// The calling thread's record, and whether it is a temporary one (the thread's own is gone:
/// it is exiting) to release after use.
#[cfg(not(loom))]
#[inline]
fn thread_record() -> (&'static Record, bool) {
    let fast = FAST_RECORD.try_with(std::cell::Cell::get).unwrap_or(std::ptr::null());
    if fast.is_null() {
        return thread_record_slow();
    }
    // SAFETY: records are leaked, never freed; this one is the thread's own until RECORD drops,
    // which clears the shortcut first.
    (unsafe { &*fast }, false)
}

#[cfg(not(loom))]
#[cold]
fn thread_record_slow() -> (&'static Record, bool) {
    match RECORD.try_with(|r| r.0) {
        Ok(record) => {
            let _ = FAST_RECORD.try_with(|fast| fast.set(record));
            (record, false)
        }
        Err(_) => (REGISTRY.acquire(), true),
    }
}

/// 0: not probed yet, 1: membarrier works, 2: use fences.
#[cfg(not(loom))]
static BARRIER_MODE: AtomicU32 = AtomicU32::new(0);

/// How many `fork()`s this process is away from the first process that made a pool here:
/// stepped in each child (`after_fork_in_child`).
#[cfg(not(loom))]
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The last record token handed out before this process was forked (0 in a process that was
/// not forked since a pool was made): every token up to it was given to a thread of an
/// ancestor process. Only the forking thread ([`FORKER_TOKEN`]) goes on here.
#[cfg(not(loom))]
static FORK_TOKENS: AtomicU64 = AtomicU64::new(0);

/// The token of the thread that made the last fork, in the child (0: it had no record).
#[cfg(not(loom))]
static FORKER_TOKEN: AtomicU64 = AtomicU64::new(0);

/// This process's fork generation (see `FORK_GENERATION`): a lock stamped with another one was
/// taken by a thread of an ancestor process, which does not exist here. Counted once a pool
/// was made (the at-fork handler is installed then).
#[cfg(not(loom))]
pub fn fork_generation() -> u64 {
    FORK_GENERATION.load(Ordering::Acquire)
}

/// Probe `membarrier` once per process (idempotent), and install the handler that makes the
/// gate usable in a child process after `fork()` (once).
#[cfg(not(loom))]
pub(crate) fn init_barriers() {
    #[cfg(unix)]
    {
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        // SAFETY: `after_fork_in_child` is an `extern "C" fn()` that lives as long as the
        // process; pthread_atfork only records the pointer.
        AT_FORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        });
    }
    if BARRIER_MODE.load(Ordering::Acquire) != 0 {
        return;
    }
    let mode = if register_membarrier() { 1 } else { 2 };
    let _ = BARRIER_MODE.compare_exchange(0, mode, Ordering::AcqRel, Ordering::Acquire);
}

/// Runs in the child process right after `fork()`, where only the forking thread exists.
///
/// Every other thread's record belonged to a thread of the parent. One inside a call of a pool
/// at the fork left that pool's metadata half updated (a block half placed, a count not yet
/// made), and that call never finishes in the child; one taking or holding a pool's pausers'
/// lock left the lock held by a thread that does not exist. Such a pool cannot be used in the
/// child: its gate is closed for good ([`TORN`]; every call is refused at once, never run on
/// that state). Then those records are released. The `membarrier` registration belongs to the
/// parent's address space, so the child probes again. A held pause that another thread of the
/// parent took earlier and did not end stays closed (its ticket may still resume it); the
/// tokens of the parent's threads are noted ([`FORK_TOKENS`]), so that calls that wait for such
/// a pause give up after its timeout saying so ([`Gate::held_across_fork`]).
///
/// Only atomic loads and stores: nothing here may take a lock (another thread may have held it
/// at the fork).
#[cfg(all(not(loom), unix))]
extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
    let own = FAST_RECORD.try_with(std::cell::Cell::get).unwrap_or(std::ptr::null());
    // SAFETY: records are leaked, never freed; `own` is this thread's.
    let own_token = if own.is_null() { 0 } else { unsafe { &*own }.token.load(Ordering::Relaxed) };
    FORKER_TOKEN.store(own_token, Ordering::Release);
    FORK_TOKENS.store(REGISTRY.tokens.load(Ordering::Acquire), Ordering::Release);
    REGISTRY.for_each(|record| {
        if !std::ptr::eq(record, own) {
            for key in [record.active.load(Ordering::Acquire), record.pausing.load(Ordering::Acquire)] {
                if key != 0 {
                    // SAFETY: a non-zero key is the address of a gate its thread borrowed at
                    // the fork (inside a call, or in a pause), so the gate was alive then; in
                    // the child that borrow never ends, so the gate is never dropped.
                    unsafe { &*(key as *const Gate) }.tear();
                }
            }
            record.release();
        }
        true
    });
    BARRIER_MODE.store(0, Ordering::Release);
    let mode = if register_membarrier() { 1 } else { 2 };
    BARRIER_MODE.store(mode, Ordering::Release);
}

#[cfg(all(not(loom), target_os = "linux"))]
fn register_membarrier() -> bool {
    const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    // SAFETY: membarrier takes two integer arguments and touches no memory of ours.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0) };
    if supported < 0 || supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED == 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0 }
}

#[cfg(all(not(loom), not(target_os = "linux")))]
fn register_membarrier() -> bool {
    false
}

#[inline]
fn light_barrier() {
    #[cfg(not(loom))]
    {
        if BARRIER_MODE.load(Ordering::Relaxed) == 1 {
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            return;
        }
    }
    fence(Ordering::SeqCst);
}

fn heavy_barrier() {
    #[cfg(all(not(loom), target_os = "linux"))]
    {
        if BARRIER_MODE.load(Ordering::Acquire) == 1 {
            const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
            // SAFETY: membarrier takes two integer arguments and touches no memory of ours.
            let done = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
            if done == 0 {
                return;
            }
        }
    }
    fence(Ordering::SeqCst);
}

/// How long a wait for another thread's pause runs between two looks at the calling thread's
/// interrupt check ([`interruptible`]): how late an interrupt is seen, at most (plus the time
/// the check itself takes).
pub const WAIT_SLICE: Duration = Duration::from_millis(20);

#[cfg(not(loom))]
thread_local! {
    /// The interrupt check that [`interruptible`] set for the calling thread, if any.
    static INTERRUPT_CHECK: Cell<Option<fn() -> bool>> = const { Cell::new(None) };
}

/// Restores the calling thread's previous interrupt check when [`interruptible`] ends (also
/// when its work panics).
#[cfg(not(loom))]
struct RestoreCheck(Option<fn() -> bool>);

#[cfg(not(loom))]
impl Drop for RestoreCheck {
    fn drop(&mut self) {
        let _ = INTERRUPT_CHECK.try_with(|check| check.set(self.0));
    }
}

/// Run `work` with `interrupted` as the calling thread's interrupt check: every wait in `work`
/// for another thread's pause of a pool asks it once per [`WAIT_SLICE`] (never a call that
/// finds the pool open, nor a wait shorter than a slice). When it answers `true`, the wait gives
/// up and its call does nothing: it fails with [`Error::Interrupted`](crate::Error::Interrupted)
/// (a call that cannot fail, such as `Pool::trim`, returns having done nothing). `interrupted`
/// may block (take a lock, run a signal handler): the waiting thread holds no lock of the pool's
/// then, except the pausers' lock of a pauser that waits for another pause or for calls in
/// flight. Calls nest: the check of the innermost `interruptible` applies.
#[cfg(not(loom))]
pub fn interruptible<T>(interrupted: fn() -> bool, work: impl FnOnce() -> T) -> T {
    let previous = INTERRUPT_CHECK.try_with(|check| check.replace(Some(interrupted))).unwrap_or(None);
    let _restore = RestoreCheck(previous);
    work()
}

/// A waiting thread's interrupt check, asked at most once per [`WAIT_SLICE`], the first time one
/// slice after the wait began. A compaction's copies on host memory ask it too
/// (`compaction/execute.rs`).
pub(crate) struct Interrupt {
    check: Option<fn() -> bool>,
    next: Instant,
}

impl Interrupt {
    /// The calling thread's check ([`interruptible`]), for a wait that begins now.
    #[cold]
    pub(crate) fn of_caller() -> Interrupt {
        #[cfg(not(loom))]
        let check = INTERRUPT_CHECK.try_with(Cell::get).unwrap_or(None);
        #[cfg(loom)]
        let check = None;
        Interrupt { check, next: Instant::now() + WAIT_SLICE }
    }

    /// Whether the wait gives up now: its slice ended and the check says so.
    pub(crate) fn gives_up(&mut self) -> bool {
        let Some(check) = self.check else { return false };
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        let stop = check();
        self.next = Instant::now() + WAIT_SLICE;
        stop
    }
}

/// The value of a gate's `closed` word in a child process whose parent forked while another
/// thread was inside a call of the pool or pausing it (see `after_fork_in_child`): closed for
/// good. Tickets count up from 2 and never reach it.
const TORN: u64 = u64::MAX;

/// A pool's gate. While a thread is inside a call through it, or in a pause of it, its record
/// carries the gate's *key*: its address ([`Gate::key`]), stable while it is borrowed and
/// unique among live gates.
pub(crate) struct Gate {
    /// Non-zero while paused ([`TORN`]: for good).
    closed: AtomicU64,
    /// One pauser at a time (not on the alloc/free path).
    #[cfg(not(loom))]
    pausers: Mutex<()>,
    /// The token of the thread holding a ticketed pause, 0 for none.
    holder: AtomicU64,
    /// Non-zero while the holder moves blocks (its own calls are refused then).
    busy: AtomicU64,
    /// The last ticket handed out (tickets start at 2: 1 is the plain pause).
    tickets: AtomicU64,
    /// How long a caller waits for the current pause to end (ms): the timeout the pauser
    /// gave, so nobody waits longer for a pause than the pauser would have waited for them.
    wait_limit_ms: AtomicU64,
}

/// Why a call did not enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The caller holds the pause and is moving blocks: it would wait for itself.
    Relocating,
    /// The process was forked while another thread was inside a call of the pool or pausing
    /// it: the pool cannot be used in this child ([`TORN`]).
    Forked,
    /// The pause outlasted the pauser's timeout: waited this long.
    PausedTooLong(Duration),
    /// As `PausedTooLong`, for a pause held by a thread of the parent process at the fork
    /// ([`Gate::held_across_fork`]): that thread does not exist in this child.
    HeldAcrossFork(Duration),
    /// The caller's interrupt check ([`interruptible`]) ended the wait: waited this long.
    Interrupted(Duration),
}

/// Why a pause was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseError {
    /// Calls in flight (or another pauser) did not finish in time: waited this long.
    Timeout(Duration),
    /// The calling thread holds the pause and is moving blocks.
    Relocating,
    /// The calling thread holds a ticketed pause already.
    AlreadyHeld,
    /// The calling thread is inside a call of this pool (a hook it runs): it would wait for
    /// itself.
    InsideCall,
    /// The gate is closed for good in this child process ([`Refusal::Forked`]).
    Forked,
    /// The gate is held by a pause of a thread of the parent process at the fork
    /// ([`Gate::held_across_fork`]), which did not end within its own timeout (or the caller's,
    /// if shorter): waited this long.
    HeldAcrossFork(Duration),
    /// A maintenance pauser ([`Gate::pause`]) waited for a held pause as long as that pause's
    /// own timeout, as calls wait for it, and the pause did not end: waited this long.
    PausedTooLong(Duration),
    /// The caller's interrupt check ([`interruptible`]) ended the wait (the gate as it was):
    /// waited this long.
    Interrupted(Duration),
}

/// How a caller's wait for the gate to open ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    Open,
    /// The pause outlasted its timeout.
    TooLong,
    /// The caller's interrupt check ended the wait.
    Interrupted,
}

/// Who pauses: how long a pauser waits for another pause that holds the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pauser {
    /// A held pause (`Pool::pause`): for its own timeout.
    Held,
    /// A maintenance call (a check, a snapshot, a trace switch, a compaction without a held
    /// pause): for a held pause, as calls wait for it (that pause's own timeout), and never
    /// longer than its own timeout.
    Maintenance,
}

/// Proof that the caller is inside the pool; leaving drops it.
pub(crate) struct Entered<'a> {
    record: &'a Record,
    previous: usize,
    /// A record borrowed for this call only (the thread is exiting): released on leaving.
    temporary: bool,
}

impl Drop for Entered<'_> {
    #[inline]
    fn drop(&mut self) {
        self.record.active.store(self.previous, Ordering::Release);
        if self.temporary {
            self.record.release();
        }
    }
}

impl Gate {
    pub(crate) fn new() -> Gate {
        Gate {
            closed: AtomicU64::new(0),
            #[cfg(not(loom))]
            pausers: Mutex::new(()),
            holder: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            tickets: AtomicU64::new(1),
            wait_limit_ms: AtomicU64::new(u64::MAX),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) != 0
    }

    /// What a record carries while its thread is inside a call through this gate or pausing it:
    /// the gate's address (not 0, and no other live gate has it).
    #[inline(always)]
    fn key(&self) -> usize {
        self as *const Gate as usize
    }

    /// Whether the gate is closed for good in this child process ([`TORN`]).
    fn is_torn(&self) -> bool {
        self.closed.load(Ordering::Acquire) == TORN
    }

    /// Close the gate for good ([`TORN`]; see `after_fork_in_child`).
    fn tear(&self) {
        self.closed.store(TORN, Ordering::Release);
    }

    /// Whether the gate is held by a ticketed pause whose holder is a thread of the parent
    /// process at the last fork (see `after_fork_in_child`): that thread does not exist here,
    /// so only the pause's ticket, if this process has it, can end the pause. Asked only by
    /// callers that waited for the gate.
    #[cfg(not(loom))]
    #[cold]
    fn held_across_fork(&self) -> bool {
        let closed = self.closed.load(Ordering::Acquire);
        if closed <= 1 || closed == TORN {
            return false;
        }
        let holder = self.holder.load(Ordering::Acquire);
        holder != 0 && holder <= FORK_TOKENS.load(Ordering::Acquire) && holder != FORKER_TOKEN.load(Ordering::Acquire)
    }

    /// Loom models run in one process, never forked.
    #[cfg(loom)]
    fn held_across_fork(&self) -> bool {
        false
    }

    /// How long a pauser that asked for `timeout` waits for the pause that holds the gate now:
    /// `timeout`, but no longer than that pause's own timeout (what callers wait) when a thread
    /// of the parent process held it at the fork.
    fn pauser_limit(&self, timeout: Duration) -> Duration {
        if !self.held_across_fork() {
            return timeout;
        }
        timeout.min(Duration::from_millis(self.wait_limit_ms.load(Ordering::Relaxed)))
    }

    /// Why a pause that gave up after `waited` was not taken.
    fn pause_refused(&self, waited: Duration) -> PauseError {
        match self.held_across_fork() {
            true => PauseError::HeldAcrossFork(waited),
            false => PauseError::Timeout(waited),
        }
    }

    /// Whether `pauser`, which asked for `timeout` and came at `started`, gives up waiting for
    /// another pauser (for the pausers' lock, or for the gate): why, if so.
    fn pauser_gives_up(&self, pauser: Pauser, started: Instant, timeout: Duration) -> Option<PauseError> {
        let waited = started.elapsed();
        if pauser == Pauser::Maintenance {
            let closed = self.closed.load(Ordering::Acquire);
            let limit = Duration::from_millis(self.wait_limit_ms.load(Ordering::Relaxed));
            if closed > 1 && closed != TORN && limit <= timeout && waited >= limit {
                return Some(match self.held_across_fork() {
                    true => PauseError::HeldAcrossFork(waited),
                    false => PauseError::PausedTooLong(waited),
                });
            }
            return (waited >= timeout).then(|| self.pause_refused(waited));
        }
        (waited >= self.pauser_limit(timeout)).then(|| self.pause_refused(waited))
    }

    /// Enter through `record`, or `None` at once if the gate is closed.
    #[inline]
    pub(crate) fn try_enter_with<'a>(&self, record: &'a Record) -> Option<Entered<'a>> {
        let previous = record.active.load(Ordering::Relaxed);
        if previous == self.key() {
            // Already inside this pool on this thread (a nested call): nothing to do.
            return Some(Entered { record, previous, temporary: false });
        }
        record.active.store(self.key(), Ordering::Relaxed);
        light_barrier();
        // Acquire (free on x86): what a pauser wrote before it resumed (a relocation's metadata)
        // happens before this call (the loom model `a_held_pause_shields_callers_...` needs it).
        if self.closed.load(Ordering::Acquire) == 0 || self.admits(record) {
            return Some(Entered { record, previous, temporary: false });
        }
        record.active.store(previous, Ordering::Release);
        None
    }

    /// Whether `record`'s thread is inside a call through this gate now (its own record: only
    /// that thread writes it).
    fn is_inside(&self, record: &Record) -> bool {
        record.active.load(Ordering::Relaxed) == self.key()
    }

    /// Whether `record`'s thread holds the gate's ticketed pause (off the fast path: only asked
    /// when the gate is closed).
    #[cold]
    fn holds(&self, record: &Record) -> bool {
        let holder = self.holder.load(Ordering::Acquire);
        holder != 0 && holder == record.token.load(Ordering::Relaxed)
    }

    /// The holder of a ticketed pause may enter while it is not moving blocks (and the gate is
    /// not closed for good).
    #[cold]
    fn admits(&self, record: &Record) -> bool {
        self.holds(record) && self.busy.load(Ordering::Acquire) == 0 && !self.is_torn()
    }

    /// Enter through `record`, waiting while the gate is closed: at most the pauser's timeout
    /// (then [`Refusal::PausedTooLong`]: a pause nobody ended cannot hang every caller); at once
    /// [`Refusal::Relocating`] when the caller holds the pause and is moving blocks.
    #[inline]
    pub(crate) fn enter_with<'a>(&self, record: &'a Record) -> Result<Entered<'a>, Refusal> {
        match self.try_enter_with(record) {
            Some(entered) => Ok(entered),
            None => self.enter_slow(record),
        }
    }

    #[cold]
    #[inline(never)]
    fn enter_slow<'a>(&self, record: &'a Record) -> Result<Entered<'a>, Refusal> {
        let started = Instant::now();
        let mut interrupt = Interrupt::of_caller();
        loop {
            if self.is_torn() {
                return Err(Refusal::Forked);
            }
            if self.holds(record) {
                return Err(Refusal::Relocating);
            }
            match self.wait_open(started, &mut interrupt) {
                Waited::Open => {}
                Waited::TooLong => {
                    let waited = started.elapsed();
                    return Err(match self.held_across_fork() {
                        true => Refusal::HeldAcrossFork(waited),
                        false => Refusal::PausedTooLong(waited),
                    });
                }
                Waited::Interrupted => return Err(Refusal::Interrupted(started.elapsed())),
            }
            if let Some(entered) = self.try_enter_with(record) {
                return Ok(entered);
            }
        }
    }

    /// Wait until the gate opens: [`Waited::TooLong`] once the caller has waited (since
    /// `started`) longer than the current pause's limit, [`Waited::Interrupted`] when its
    /// interrupt check ends the wait. (Loom models wait without a limit.)
    #[cfg_attr(loom, allow(unused_variables))]
    fn wait_open(&self, started: Instant, interrupt: &mut Interrupt) -> Waited {
        let mut spins = 0u32;
        while self.is_closed() && !self.is_torn() {
            if spins < 64 {
                spin_hint();
            } else {
                #[cfg(not(loom))]
                {
                    let limit = self.wait_limit_ms.load(Ordering::Relaxed);
                    if started.elapsed().as_millis() >= u128::from(limit) && self.is_closed() {
                        return Waited::TooLong;
                    }
                    if interrupt.gives_up() {
                        return Waited::Interrupted;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                #[cfg(loom)]
                loom::thread::yield_now();
            }
            spins = spins.saturating_add(1);
        }
        Waited::Open
    }

    /// Close the gate and wait for calls in flight through `registry` to finish (for the loom
    /// models).
    #[cfg(loom)]
    pub(crate) fn pause_with(&self, registry: &Registry, timeout: Duration) -> Result<(), PauseError> {
        self.close_with(Pauser::Maintenance, 1, registry, Instant::now(), timeout, &mut Interrupt::of_caller())
    }

    /// Close the gate with `value` (1, or a ticket) and wait for calls in flight through
    /// `registry` to finish; `Err` (and the gate as it was) when another pauser or a call in
    /// flight did not finish in time.
    /// The wait counts from `started` (a pauser that waited for the pausers' lock has spent part
    /// of its timeout already), a maintenance pauser's wait for calls in flight from when it
    /// closed the gate; callers of the pool wait for the pause up to the whole timeout.
    /// Another pause that holds the gate is waited for as [`Gate::pauser_gives_up`] says: a
    /// held pause waits for the caller's `timeout`, a maintenance pauser no longer than that
    /// pause's own timeout either, as calls wait for it; a pause that a thread of the parent
    /// process held at the fork is waited for no longer than its own timeout by both. Either
    /// wait ends when `interrupt` says so ([`PauseError::Interrupted`], the gate as it was).
    fn close_with(
        &self,
        pauser: Pauser,
        value: u64,
        registry: &Registry,
        started: Instant,
        timeout: Duration,
        interrupt: &mut Interrupt,
    ) -> Result<(), PauseError> {
        let mut spins = 0u32;
        while self.closed.compare_exchange(0, value, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // Another pauser holds the gate: wait for it, but not forever.
            if let Some(refused) = self.pauser_gives_up(pauser, started, timeout) {
                return Err(refused);
            }
            if spins >= 256 && interrupt.gives_up() {
                return Err(PauseError::Interrupted(started.elapsed()));
            }
            if spins < 256 {
                spin_hint();
            } else {
                #[cfg(not(loom))]
                std::thread::sleep(Duration::from_micros(50));
                #[cfg(loom)]
                loom::thread::yield_now();
            }
            spins = spins.saturating_add(1);
        }
        // A maintenance pauser's own timeout for calls in flight counts from here: its wait for
        // a held pause was bounded by that pause's timeout.
        let in_flight_since = match pauser {
            Pauser::Maintenance => Instant::now(),
            Pauser::Held => started,
        };
        // Callers wait for this pause as long as it waits for them.
        self.wait_limit_ms.store(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
        heavy_barrier();
        let mut spins = 0u32;
        loop {
            let quiet = registry.for_each(|record| record.active.load(Ordering::Acquire) != self.key());
            if quiet {
                fence(Ordering::SeqCst);
                return Ok(());
            }
            if in_flight_since.elapsed() >= timeout {
                self.closed.store(0, Ordering::Release);
                return Err(PauseError::Timeout(started.elapsed()));
            }
            if spins >= 256 && interrupt.gives_up() {
                self.closed.store(0, Ordering::Release);
                return Err(PauseError::Interrupted(started.elapsed()));
            }
            if spins < 256 {
                spin_hint();
            } else {
                #[cfg(not(loom))]
                std::thread::yield_now();
                #[cfg(loom)]
                loom::thread::yield_now();
            }
            spins = spins.saturating_add(1);
        }
    }

    pub(crate) fn resume(&self) {
        self.closed.store(0, Ordering::Release);
    }

    // ----- held (ticketed) pauses, for compaction ---------------------------------------------

    /// [`Gate::pause_held_since`] from now (for the loom models).
    #[cfg(loom)]
    pub(crate) fn pause_held_with(
        &self,
        registry: &Registry,
        record: &Record,
        timeout: Duration,
    ) -> Result<u64, PauseError> {
        self.pause_held_since(registry, record, Instant::now(), timeout, &mut Interrupt::of_caller())
    }

    /// Take a held pause for `record`'s thread: close the gate with a fresh ticket and wait for
    /// calls in flight, for at most `timeout` from `started` (or until `interrupt` says so).
    /// Returns the ticket that [`Gate::resume_held`] needs.
    fn pause_held_since(
        &self,
        registry: &Registry,
        record: &Record,
        started: Instant,
        timeout: Duration,
        interrupt: &mut Interrupt,
    ) -> Result<u64, PauseError> {
        if self.holds(record) {
            return Err(PauseError::AlreadyHeld);
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) + 1;
        self.close_with(Pauser::Held, ticket, registry, started, timeout, interrupt)?;
        self.holder.store(record.token.load(Ordering::Relaxed), Ordering::Release);
        Ok(ticket)
    }

    /// Whether `ticket` holds the gate now.
    pub(crate) fn is_held_by(&self, ticket: u64) -> bool {
        ticket > 1 && self.closed.load(Ordering::Acquire) == ticket
    }

    /// Mark the holder of `ticket` as moving blocks (its own calls are refused meanwhile);
    /// `false` if the ticket does not hold the gate or it is marked already.
    pub(crate) fn begin_busy(&self, ticket: u64) -> bool {
        self.is_held_by(ticket) && self.busy.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// The holder is done moving blocks.
    pub(crate) fn end_busy(&self) {
        self.busy.store(0, Ordering::Release);
    }

    /// End the held pause of `ticket`; `false` (and nothing changes) if it does not hold the gate
    /// or its holder is moving blocks.
    pub(crate) fn resume_held(&self, ticket: u64) -> bool {
        if !self.is_held_by(ticket) || self.busy.load(Ordering::Acquire) != 0 {
            return false;
        }
        self.holder.store(0, Ordering::Release);
        self.closed.compare_exchange(ticket, 0, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }
}

#[cfg(not(loom))]
impl Gate {
    /// Enter on the calling thread, or `None` if paused.
    #[inline]
    pub(crate) fn try_enter(&self) -> Option<Entered<'static>> {
        let (record, temporary) = thread_record();
        match self.try_enter_with(record) {
            Some(mut entered) => {
                entered.temporary = temporary;
                Some(entered)
            }
            None => {
                if temporary {
                    record.release();
                }
                None
            }
        }
    }

    /// Whether the calling thread holds this gate's held pause.
    pub(crate) fn held_by_caller(&self) -> bool {
        let (record, temporary) = thread_record();
        let held = self.holds(record);
        if temporary {
            record.release();
        }
        held
    }

    /// Enter on the calling thread, waiting while paused (see [`Gate::enter_with`]).
    #[inline]
    pub(crate) fn enter(&self) -> Result<Entered<'static>, Refusal> {
        let (record, temporary) = thread_record();
        match self.enter_with(record) {
            Ok(mut entered) => {
                entered.temporary = temporary;
                Ok(entered)
            }
            Err(refusal) => {
                if temporary {
                    record.release();
                }
                Err(refusal)
            }
        }
    }

    /// Pause the pool: one pauser at a time; `Err` if calls in flight (or another pauser) did
    /// not finish in time (the gate is as it was then). Inside the calling thread's own held
    /// pause this is a no-op guard (refused while the thread moves blocks).
    pub(crate) fn pause(&self, timeout: Duration) -> Result<PauseGuard<'_>, PauseError> {
        if self.is_torn() {
            return Err(PauseError::Forked);
        }
        let (record, temporary) = thread_record();
        let own = self.holds(record);
        // A pauser inside one of this pool's calls (a hook it runs) would wait for itself.
        let inside = self.is_inside(record);
        if own || inside {
            if temporary {
                record.release();
            }
            if inside && !own {
                return Err(PauseError::InsideCall);
            }
            if self.busy.load(Ordering::Acquire) != 0 {
                return Err(PauseError::Relocating);
            }
            return Ok(PauseGuard { gate: self, serial: None });
        }
        let pausing = Pausing::mark(self, record, temporary);
        let started = Instant::now();
        let mut interrupt = Interrupt::of_caller();
        let lock = self.lock_pausers(Pauser::Maintenance, started, timeout, &mut interrupt)?;
        self.close_with(Pauser::Maintenance, 1, &REGISTRY, started, timeout, &mut interrupt)?;
        Ok(PauseGuard { gate: self, serial: Some((lock, pausing)) })
    }

    /// Whether the calling thread holds the pause and is moving blocks now.
    pub(crate) fn moving_here(&self) -> bool {
        let (record, temporary) = thread_record();
        let here = self.holds(record) && self.busy.load(Ordering::Acquire) != 0;
        if temporary {
            record.release();
        }
        here
    }

    /// Take a held pause for the calling thread (see [`Gate::pause_held_with`]).
    pub(crate) fn pause_held(&self, timeout: Duration) -> Result<u64, PauseError> {
        if self.is_torn() {
            return Err(PauseError::Forked);
        }
        let (record, temporary) = thread_record();
        if temporary {
            // An exiting thread cannot hold a pause: its record goes to another thread.
            record.release();
            return Err(PauseError::Timeout(Duration::ZERO));
        }
        if self.holds(record) {
            return Err(PauseError::AlreadyHeld); // before the serial lock: never wait for ourselves
        }
        if self.is_inside(record) {
            return Err(PauseError::InsideCall);
        }
        let _pausing = Pausing::mark(self, record, false);
        let started = Instant::now();
        let mut interrupt = Interrupt::of_caller();
        let _serial = self.lock_pausers(Pauser::Held, started, timeout, &mut interrupt)?;
        self.pause_held_since(&REGISTRY, record, started, timeout, &mut interrupt)
    }

    /// The pausers' lock, waited for until `timeout` has passed since `started`: the pauser
    /// that holds it may wait for calls in flight for as long as its own timeout allows, and
    /// nobody waits for it longer than they asked. A maintenance pauser also gives up when a
    /// held pause closes the gate longer than that pause's own timeout, as calls do (the lock's
    /// holder may be another pauser waiting for that pause). `interrupt` may end the wait
    /// ([`PauseError::Interrupted`]).
    fn lock_pausers(
        &self,
        pauser: Pauser,
        started: Instant,
        timeout: Duration,
        interrupt: &mut Interrupt,
    ) -> Result<std::sync::MutexGuard<'_, ()>, PauseError> {
        let mut spins = 0u32;
        loop {
            match self.pausers.try_lock() {
                Ok(lock) => return Ok(lock),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => return Ok(poisoned.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            match pauser {
                Pauser::Maintenance => {
                    if let Some(refused) = self.pauser_gives_up(pauser, started, timeout) {
                        return Err(refused);
                    }
                }
                Pauser::Held if started.elapsed() >= timeout => return Err(PauseError::Timeout(started.elapsed())),
                Pauser::Held => {}
            }
            if spins >= 256 && interrupt.gives_up() {
                return Err(PauseError::Interrupted(started.elapsed()));
            }
            if spins < 256 {
                spin_hint();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            spins = spins.saturating_add(1);
        }
    }
}

/// The calling thread takes or holds a gate's pausers' lock while this lives: its record
/// carries the gate's key (`after_fork_in_child` reads it). Declared before the lock's guard,
/// so the mark goes after the lock is released: a fork in between finds the mark, never a held
/// lock without one.
#[cfg(not(loom))]
struct Pausing {
    record: &'static Record,
    /// The record was borrowed for this pause only (the thread is exiting): released after.
    temporary: bool,
}

#[cfg(not(loom))]
impl Pausing {
    fn mark(gate: &Gate, record: &'static Record, temporary: bool) -> Pausing {
        record.pausing.store(gate.key(), Ordering::SeqCst);
        Pausing { record, temporary }
    }
}

#[cfg(not(loom))]
impl Drop for Pausing {
    fn drop(&mut self) {
        self.record.pausing.store(0, Ordering::Release);
        if self.temporary {
            self.record.release();
        }
    }
}

/// The pool stays paused while this lives (a guard inside the caller's own held pause, without
/// the serial lock, leaves the pause as it found it).
#[cfg(not(loom))]
pub(crate) struct PauseGuard<'a> {
    gate: &'a Gate,
    /// The pausers' lock and the mark of the thread that holds it (none for a guard inside the
    /// caller's own held pause). The lock drops first ([`Pausing`]).
    serial: Option<(std::sync::MutexGuard<'a, ()>, Pausing)>,
}

#[cfg(not(loom))]
impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        if let Some((lock, pausing)) = self.serial.take() {
            self.gate.resume();
            drop(lock);
            drop(pausing);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn pause_waits_for_calls_in_flight_and_holds_new_ones() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let inside = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (gate, inside, done, stop) = (gate.clone(), inside.clone(), done.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _entered = gate.enter().expect("enters");
                        inside.fetch_add(1, Ordering::SeqCst);
                        std::hint::spin_loop();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        while done.load(Ordering::Relaxed) < 1000 {
            std::thread::yield_now();
        }
        for _ in 0..200 {
            let guard = gate.pause(Duration::from_secs(5)).expect("pauses");
            let frozen = done.load(Ordering::SeqCst);
            for _ in 0..50 {
                assert_eq!(inside.load(Ordering::SeqCst), 0, "a call ran while paused");
            }
            assert_eq!(done.load(Ordering::SeqCst), frozen, "a call finished while paused");
            drop(guard);
        }
        let before = done.load(Ordering::Relaxed);
        while done.load(Ordering::Relaxed) == before {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
    }

    #[test]
    fn pause_times_out_on_a_stuck_caller() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let stuck = std::thread::spawn(move || {
            let _entered = g.enter();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        assert!(gate.pause(Duration::from_millis(30)).is_err());
        assert!(!gate.is_closed(), "a failed pause leaves the gate open");
        assert!(gate.try_enter().is_some());
        release_tx.send(()).unwrap();
        stuck.join().unwrap();
        assert!(gate.pause(Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn a_pauser_waiting_for_another_does_not_hold_up_a_third_past_its_timeout() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let holder = std::thread::spawn(move || {
            let ticket = g.pause_held(Duration::from_secs(1)).expect("pauses");
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            assert!(g.resume_held(ticket));
        });
        held_rx.recv().unwrap();
        // A second pauser waits (holding the pausers' lock) for the held pause to end.
        let g = gate.clone();
        let waiter = std::thread::spawn(move || g.pause(Duration::from_secs(30)).map(drop));
        std::thread::sleep(Duration::from_millis(50));
        for timeout in [Duration::ZERO, Duration::from_millis(100)] {
            let started = Instant::now();
            assert!(matches!(gate.pause_held(timeout), Err(PauseError::Timeout(_))));
            assert!(matches!(gate.pause(timeout), Err(PauseError::Timeout(_))));
            assert!(started.elapsed() < Duration::from_secs(10), "waited {:?}", started.elapsed());
        }
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(waiter.join().unwrap().is_ok());
        assert!(!gate.is_closed());
    }

    #[test]
    fn a_maintenance_pauser_waits_for_a_held_pause_as_long_as_calls_do() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let holder = std::thread::spawn(move || {
            let ticket = g.pause_held(Duration::from_millis(200)).expect("pauses");
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            assert!(g.resume_held(ticket));
        });
        held_rx.recv().unwrap();
        // Waiting for the gate: 200 ms (the held pause's timeout), not the 30 s it asked for.
        let started = Instant::now();
        assert!(matches!(gate.pause(Duration::from_secs(30)), Err(PauseError::PausedTooLong(_))));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(10), "waited {waited:?}");
        assert!(gate.is_closed(), "the held pause holds the gate as before");
        // Waiting for the pausers' lock, which a pauser that asked for 2 s holds while it waits
        // for the gate: 200 ms again.
        let g = gate.clone();
        let waiter = std::thread::spawn(move || g.pause_held(Duration::from_secs(2)));
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        assert!(matches!(gate.pause(Duration::from_secs(30)), Err(PauseError::PausedTooLong(_))));
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(1), "waited {waited:?} for the pausers' lock");
        // Asked for less than the held pause's timeout: its own timeout.
        assert!(matches!(gate.pause(Duration::from_millis(100)), Err(PauseError::Timeout(_))));
        assert!(matches!(waiter.join().unwrap(), Err(PauseError::Timeout(_))));
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(gate.pause(Duration::from_secs(1)).is_ok());
    }

    thread_local! {
        /// How many times this thread's interrupt check was asked, and after how many askings
        /// it says to give up.
        static ASKED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        static GIVE_UP_AT: std::cell::Cell<u32> = const { std::cell::Cell::new(u32::MAX) };
    }

    /// An interrupt check that gives up at its `GIVE_UP_AT`-th asking.
    fn counting_check() -> bool {
        let asked = ASKED.with(|a| a.get()) + 1;
        ASKED.with(|a| a.set(asked));
        asked >= GIVE_UP_AT.with(std::cell::Cell::get)
    }

    /// Run `work` on a fresh thread whose interrupt check gives up at its `give_up_at`-th
    /// asking; what `work` returned, and how many times the check was asked.
    fn with_check<T: Send + 'static>(give_up_at: u32, work: impl FnOnce() -> T + Send + 'static) -> (T, u32) {
        std::thread::spawn(move || {
            GIVE_UP_AT.with(|g| g.set(give_up_at));
            let out = interruptible(counting_check, work);
            (out, ASKED.with(std::cell::Cell::get))
        })
        .join()
        .unwrap()
    }

    /// A gate held by a ticketed pause of another thread (for `hold`), resumed by the returned
    /// sender.
    fn held_elsewhere(gate: &Arc<Gate>, hold: Duration) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let holder = std::thread::spawn(move || {
            let ticket = g.pause_held(hold).expect("pauses");
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            assert!(g.resume_held(ticket));
        });
        held_rx.recv().unwrap();
        (release_tx, holder)
    }

    #[test]
    fn an_interrupt_check_ends_a_calls_wait_for_a_held_pause() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (release, holder) = held_elsewhere(&gate, Duration::from_secs(60));
        let g = gate.clone();
        let (refused, asked) = with_check(3, move || g.enter().map(drop));
        assert!(matches!(refused, Err(Refusal::Interrupted(_))), "{refused:?}");
        assert_eq!(asked, 3, "asked once per slice until it said to give up");
        assert!(gate.is_closed(), "the held pause holds the gate as before");
        release.send(()).unwrap();
        holder.join().unwrap();
        let g = gate.clone();
        let (entered, asked) = with_check(1, move || g.enter().map(drop));
        assert!(entered.is_ok() && asked == 0, "an open gate never asks the check");
    }

    #[test]
    fn an_interrupt_check_ends_a_pausers_wait_for_another_pause() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (release, holder) = held_elsewhere(&gate, Duration::from_secs(60));
        // A maintenance pause and a held pause, each waiting for the gate.
        let g = gate.clone();
        let (refused, _) = with_check(2, move || g.pause(Duration::from_secs(60)).map(drop));
        assert!(matches!(refused, Err(PauseError::Interrupted(_))), "{refused:?}");
        let g = gate.clone();
        let (refused, _) = with_check(2, move || g.pause_held(Duration::from_secs(60)));
        assert!(matches!(refused, Err(PauseError::Interrupted(_))), "{refused:?}");
        // Waiting for the pausers' lock, which another pauser holds while it waits for the gate.
        let g = gate.clone();
        let waiter = std::thread::spawn(move || g.pause(Duration::from_secs(60)).map(drop));
        while gate.pausers.try_lock().is_ok() {
            std::thread::yield_now();
        }
        let g = gate.clone();
        let (refused, _) = with_check(2, move || g.pause_held(Duration::from_secs(60)));
        assert!(matches!(refused, Err(PauseError::Interrupted(_))), "{refused:?}");
        release.send(()).unwrap();
        holder.join().unwrap();
        assert!(waiter.join().unwrap().is_ok());
        assert!(!gate.is_closed());
        assert!(gate.pause(Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn an_interrupt_check_ends_a_pausers_wait_for_a_call_in_flight_and_reopens_the_gate() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let inside = std::thread::spawn(move || {
            let _entered = g.enter();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        let g = gate.clone();
        let (refused, _) = with_check(2, move || g.pause_held(Duration::from_secs(60)));
        assert!(matches!(refused, Err(PauseError::Interrupted(_))), "{refused:?}");
        assert!(!gate.is_closed(), "an interrupted pause leaves the gate open");
        assert!(gate.try_enter().is_some());
        release_tx.send(()).unwrap();
        inside.join().unwrap();
    }

    #[test]
    fn interruptible_restores_the_check_it_replaced() {
        init_barriers();
        let gate = Arc::new(Gate::new());
        let (release, holder) = held_elsewhere(&gate, Duration::from_millis(300));
        let g = gate.clone();
        // Inside, a nested `interruptible` whose check never gives up; after it, the outer one
        // applies again.
        let ((inner, outer), asked) = with_check(1, move || {
            fn never() -> bool {
                false
            }
            let inner = interruptible(never, || g.enter().map(drop));
            (inner, g.enter().map(drop))
        });
        assert!(matches!(inner, Err(Refusal::PausedTooLong(_))), "{inner:?}");
        assert!(matches!(outer, Err(Refusal::Interrupted(_))), "{outer:?}");
        assert_eq!(asked, 1);
        release.send(()).unwrap();
        holder.join().unwrap();
    }

    #[test]
    fn try_enter_refuses_while_paused() {
        init_barriers();
        let gate = Gate::new();
        let guard = gate.pause(Duration::from_secs(1)).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| assert!(gate.try_enter().is_none()));
        });
        drop(guard);
        assert!(gate.try_enter().is_some());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A caller enters and bumps a counter while a pauser closes the gate: whenever the pause
    /// succeeds, the caller is either done or not started, never in the middle.
    #[test]
    fn pause_excludes_calls_in_flight() {
        loom::model(|| {
            let registry = Arc::new(Registry::new());
            let gate = Arc::new(Gate::new());
            let work = Arc::new(AtomicU64::new(0));
            let (r2, g2, w2) = (registry.clone(), gate.clone(), work.clone());
            let caller = thread::spawn(move || {
                let record = r2.acquire();
                if let Some(_entered) = g2.try_enter_with(record) {
                    w2.fetch_add(1, Ordering::Relaxed);
                    w2.fetch_add(1, Ordering::Relaxed);
                }
            });
            if gate.pause_with(&registry, Duration::from_secs(3600)).is_ok() {
                let seen = work.load(Ordering::Relaxed);
                assert!(seen == 0 || seen == 2, "pause overlapped a call in flight ({seen})");
                let again = work.load(Ordering::Relaxed);
                assert_eq!(seen, again, "a call started while paused");
                gate.resume();
            }
            caller.join().unwrap();
        });
    }

    // ----- held pauses ---------------------------------------------------------------------------

    /// A relocation under a held pause rewrites metadata in two steps (`a`, then `b`) while a
    /// caller reads it inside the gate: the caller never sees a half-done rewrite, the holder
    /// itself is admitted (and refused while busy), and only its ticket resumes the gate, once.
    #[test]
    fn a_held_pause_shields_callers_from_a_relocation() {
        loom::model(|| {
            let registry = Arc::new(Registry::new());
            let gate = Arc::new(Gate::new());
            let a = Arc::new(AtomicU64::new(0));
            let b = Arc::new(AtomicU64::new(0));
            let (r2, g2, a2, b2) = (registry.clone(), gate.clone(), a.clone(), b.clone());
            let caller = thread::spawn(move || {
                let record = r2.acquire();
                if let Some(_entered) = g2.try_enter_with(record) {
                    let seen_a = a2.load(Ordering::Relaxed);
                    let seen_b = b2.load(Ordering::Relaxed);
                    assert_eq!(seen_a, seen_b, "a caller saw a half-done relocation");
                }
            });
            let me = registry.acquire();
            if let Ok(ticket) = gate.pause_held_with(&registry, me, Duration::from_secs(3600)) {
                assert!(gate.try_enter_with(me).is_some(), "the holder may enter");
                assert!(gate.begin_busy(ticket));
                assert!(gate.try_enter_with(me).is_none(), "the holder is refused while it moves blocks");
                assert!(!gate.resume_held(ticket), "no resume while moving blocks");
                a.store(1, Ordering::Relaxed);
                b.store(1, Ordering::Relaxed);
                gate.end_busy();
                assert!(!gate.resume_held(ticket + 1), "another ticket does not resume");
                assert!(gate.resume_held(ticket));
                assert!(!gate.resume_held(ticket), "a ticket resumes once");
            }
            caller.join().unwrap();
        });
    }

    /// A plain pause and a held pause race: they never hold the gate at the same time.
    #[test]
    fn plain_and_held_pauses_exclude_each_other() {
        loom::model(|| {
            let registry = Arc::new(Registry::new());
            let gate = Arc::new(Gate::new());
            let inside = Arc::new(AtomicU64::new(0));
            let (r2, g2, i2) = (registry.clone(), gate.clone(), inside.clone());
            let plain = thread::spawn(move || {
                if g2.pause_with(&r2, Duration::from_secs(3600)).is_ok() {
                    assert_eq!(i2.fetch_add(1, Ordering::SeqCst), 0, "two pausers at once");
                    i2.fetch_sub(1, Ordering::SeqCst);
                    g2.resume();
                }
            });
            let me = registry.acquire();
            if let Ok(ticket) = gate.pause_held_with(&registry, me, Duration::from_secs(3600)) {
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two pausers at once");
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(gate.resume_held(ticket));
            }
            plain.join().unwrap();
        });
    }
}
