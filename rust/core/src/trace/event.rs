//! One traced event (alloc, free, move or failed alloc) and its encoding as the words of a
//! ring slot.

/// Words of one event in a ring slot.
pub(crate) const EVENT_WORDS: usize = 7;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// A block was allocated (`aux` = its alignment).
    Alloc = 1,
    /// A block was freed.
    Free = 2,
    /// A live block moved (`offset` = where it is now, `aux` = where it was).
    Move = 3,
    /// An allocation failed for lack of memory (`offset` = 0, `aux` = the alignment asked).
    Failed = 4,
}

impl EventKind {
    fn from_u8(v: u8) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Alloc),
            2 => Some(EventKind::Free),
            3 => Some(EventKind::Move),
            4 => Some(EventKind::Failed),
            _ => None,
        }
    }

    /// A short lowercase name: `alloc`, `free`, `move`, `failed`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::Move => "move",
            EventKind::Failed => "failed",
        }
    }
}

/// One traced event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    /// Nanoseconds since the pool was made (monotonic clock).
    pub time_ns: u64,
    /// What happened.
    pub kind: EventKind,
    /// The block's offset (after the move for moves; 0 for failed allocations).
    pub offset: usize,
    /// The bytes asked for.
    pub size: usize,
    /// The core pool of the thread that made the call.
    pub core: u16,
    /// The tag id given at allocation (0 = none).
    pub tag: u32,
    /// The block's handle, packed ([`Handle::to_bits`](crate::handle::id::Handle::to_bits)); 0 for failed allocations.
    pub handle: u128,
    /// Alignment for allocations and failures, the old offset for moves, 0 for frees.
    pub aux: u64,
}

impl TraceEvent {
    pub(crate) fn to_words(self) -> [u64; EVENT_WORDS] {
        [
            self.time_ns,
            self.offset as u64,
            self.size as u64,
            self.kind as u64 | (self.core as u64) << 8 | (self.tag as u64) << 32,
            self.handle as u64,
            (self.handle >> 64) as u64,
            self.aux,
        ]
    }

    pub(crate) fn from_words(w: [u64; EVENT_WORDS]) -> Option<TraceEvent> {
        Some(TraceEvent {
            time_ns: w[0],
            offset: w[1] as usize,
            size: w[2] as usize,
            kind: EventKind::from_u8(w[3] as u8)?,
            core: (w[3] >> 8) as u16,
            tag: (w[3] >> 32) as u32,
            handle: w[4] as u128 | (w[5] as u128) << 64,
            aux: w[6],
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let e = TraceEvent {
            time_ns: 123,
            kind: EventKind::Move,
            offset: 1 << 40,
            size: 77,
            core: 513,
            tag: u32::MAX,
            handle: (9u128 << 64) | (5 << 32) | 3,
            aux: 4096,
        };
        assert_eq!(TraceEvent::from_words(e.to_words()), Some(e));
    }
}
