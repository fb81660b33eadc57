//! # npumem-capi
//!
//! The C ABI of npumem, declared in `python/npumem/include/npumem.h` (C99 and C++): pools made
//! and shared by reference counting, allocation with handles or raw offsets, pins, batches, stats,
//! status codes with messages, an out-of-memory callback, and the two functions PyTorch's
//! `CUDAPluggableAllocator` loads. Thread-safe; no panic crosses into C; no Python needed.
//!
//! Built twice from the same source: as `libnpumem.so` for C programs, and into the Python
//! extension, which hands its pools to C with [`wrap`]. A pool object carries the functions of
//! the copy that made it, so either copy's entry points serve any pool correctly.
//!
//! | file | what it holds |
//! |---|---|
//! | `status.rs` | status codes, `npumem_strerror`, the per-thread last error, the panic guard |
//! | `types.rs` | the structs of the header |
//! | `config.rs` | `npumem_config` defaults and rules |
//! | `object.rs` | the pool object and its table of functions |
//! | `native.rs` | this copy's implementation of every operation |
//! | `exports.rs` | the entry points of the header |
//! | `torch.rs` | the PyTorch pluggable allocator functions |

mod config;
#[cfg(test)]
mod dispatch_tests;
mod exports;
mod native;
mod object;
mod status;
mod torch;
mod types;

pub use exports::*;
pub use native::wrap;
pub use object::{Location, NpumemPool, ABI_VERSION};
pub use status::Status;
pub use torch::{npumem_torch_alloc, npumem_torch_free, npumem_torch_set_pool};
pub use types::{NpumemBlock, NpumemConfig, NpumemHandle, NpumemPoolInfo, NpumemStats, BACKING_HOST, BACKING_NONE};
