//! Moving the calling thread between the CPUs it may run on, so that its core pool changes
//! between calls (on a machine with one CPU, or where the kernel cannot say, nothing moves).

use super::Rng;

/// The CPUs this thread may run on (none where the kernel cannot say, say with more CPUs than
/// a `cpu_set_t` holds: the tests then run without moves), and the set to restore afterwards.
fn allowed_cpus() -> (Vec<usize>, libc::cpu_set_t) {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (Vec::new(), set);
        }
        let cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        (cpus, set)
    }
}

/// Run this thread on the CPUs of `set`. A refusal (a CPU taken offline meanwhile) leaves the
/// thread where it is: the moves only vary where the allocations run.
fn run_on(set: &libc::cpu_set_t) {
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
}

fn one_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: as in `allowed_cpus`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// Moves the calling thread to a random allowed CPU now and then; puts it back on drop.
pub struct Mover {
    cpus: Vec<usize>,
    restore: libc::cpu_set_t,
    rng: Rng,
}

impl Mover {
    pub fn new(seed: u64) -> Mover {
        let (cpus, restore) = allowed_cpus();
        Mover { cpus, restore, rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1) }
    }

    /// One time in eight, move to a random allowed CPU.
    pub fn maybe_move(&mut self) {
        if !self.cpus.is_empty() && self.rng.next() % 8 == 0 {
            let cpu = self.cpus[(self.rng.next() % self.cpus.len() as u64) as usize];
            run_on(&one_cpu(cpu));
        }
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        if !self.cpus.is_empty() {
            run_on(&self.restore);
        }
    }
}
