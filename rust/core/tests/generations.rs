//! Handle generations never wrap: a slot freed at its last generation is retired, so a stale
//! handle can never match a later block in that slot.
#![cfg(not(loom))]

use npumem_core::{Error, Handle, HandleFault, Pool, PoolConfig};

#[test]
fn a_slot_retires_at_its_last_generation_and_stale_handles_stay_refused() {
    let p = Pool::new(PoolConfig::new(16 << 20).cores(1)).unwrap();
    p.start_generations_at(u32::MAX - 2);
    let first = p.alloc(100, None, 0).unwrap();
    assert_eq!(first.generation(), u32::MAX - 2);
    let slot = first.slot();
    p.free(first).unwrap();
    let mut stale = vec![first];
    for expected in [u32::MAX - 1, u32::MAX] {
        let h = p.alloc(100, None, 0).unwrap();
        assert_eq!((h.slot(), h.generation()), (slot, expected), "the slot is reused until its last generation");
        p.free(h).unwrap();
        stale.push(h);
    }
    // The slot is retired: the next block gets another slot, and no handle of the old slot,
    // whatever its generation (0 is where a wrapped generation would start again), matches it.
    let next = p.alloc(100, None, 0).unwrap();
    assert_ne!(next.slot(), slot, "a slot at its last generation is never reused");
    let wrapped = Handle::from_bits((next.pool_id() as u128) << 64 | (slot as u128) << 32);
    stale.push(wrapped);
    for h in stale {
        assert!(p.block(h).is_err());
        assert!(matches!(p.free(h), Err(Error::DoubleFree) | Err(Error::InvalidHandle(_))));
    }
    assert!(p.block(next).is_ok(), "stale frees did not touch the new block");
    p.check().unwrap();
    p.free(next).unwrap();
    p.check().unwrap();
}

#[test]
fn a_handle_from_a_slots_past_is_a_double_free_and_one_from_its_future_names_no_block() {
    let p = Pool::new(PoolConfig::new(16 << 20).cores(1)).unwrap();
    let first = p.alloc(100, None, 0).unwrap();
    p.free(first).unwrap();
    let live = p.alloc(100, None, 0).unwrap();
    assert_eq!(live.slot(), first.slot(), "the slot is reused");
    let with_generation =
        |g: u32| Handle::from_bits((live.pool_id() as u128) << 64 | (live.slot() as u128) << 32 | g as u128);
    let forged = with_generation(live.generation() + 1);
    let before = p.stats();
    assert_eq!(p.free(first), Err(Error::DoubleFree));
    assert_eq!(p.free(forged), Err(Error::InvalidHandle(HandleFault::Unknown)));
    assert_eq!(p.block(forged), Err(Error::InvalidHandle(HandleFault::Unknown)));
    assert_eq!(p.free(with_generation(u32::MAX)), Err(Error::InvalidHandle(HandleFault::Unknown)));
    assert_eq!(p.stats(), before, "refused frees change nothing");
    assert!(p.block(live).is_ok());
    p.free(live).unwrap();
    p.check().unwrap();
}

#[test]
fn a_retired_slots_handles_all_read_as_freed() {
    let p = Pool::new(PoolConfig::new(16 << 20).cores(1)).unwrap();
    p.start_generations_at(u32::MAX);
    let last = p.alloc(100, None, 0).unwrap();
    assert_eq!(last.generation(), u32::MAX);
    p.free(last).unwrap();
    // Retired: its word reads generation 0, below every handle the slot handed out.
    assert_eq!(p.free(last), Err(Error::DoubleFree));
    assert_eq!(p.block(last), Err(Error::InvalidHandle(HandleFault::Freed)));
    p.check().unwrap();
}

#[test]
fn many_slots_retire_and_the_pool_goes_on() {
    let p = Pool::new(PoolConfig::new(16 << 20).cores(2)).unwrap();
    p.start_generations_at(u32::MAX - 1);
    for round in 0..4 {
        let hs: Vec<Handle> = (0..500).map(|_| p.alloc(64, None, 0).unwrap()).collect();
        assert!(hs.iter().all(|h| h.generation() >= u32::MAX - 1), "round {round}");
        for h in hs {
            p.free(h).unwrap();
        }
        p.check().unwrap();
    }
}

#[test]
fn slots_that_threads_freed_serve_later_threads_and_stale_handles_stay_refused() {
    let p = Pool::new(PoolConfig::new(16 << 20).cores(2)).unwrap();
    let mut stale = Vec::new();
    for round in 0..3 {
        let freed: Vec<Vec<Handle>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let hs: Vec<Handle> = (0..50).map(|i| p.alloc(64 + i * 8, None, 0).unwrap()).collect();
                        for &h in &hs {
                            p.free(h).unwrap();
                        }
                        hs
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        stale.extend(freed.into_iter().flatten());
        // The threads are gone; the slots they freed are free and counted.
        p.check().unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    let live: Vec<Handle> = (0..200).map(|_| p.alloc(256, None, 0).unwrap()).collect();
    for h in &stale {
        assert!(p.block(*h).is_err(), "a stale handle matched a later block");
        assert!(matches!(p.free(*h), Err(Error::DoubleFree) | Err(Error::InvalidHandle(_))));
    }
    p.check().unwrap();
    for h in live {
        p.free(h).unwrap();
    }
    p.check().unwrap();
}
