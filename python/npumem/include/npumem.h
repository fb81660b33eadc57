/*
 * npumem.h: the C ABI of npumem, a lock-free accelerator-memory manager.
 *
 * C99 and C++. Link with the library `npumem.get_library()` names (libnpumem.so); this header
 * is in `npumem.get_include()`. No Python is needed.
 *
 *     npumem_config config;
 *     npumem_config_init(&config, 64u << 20);
 *     config.cores = 4;
 *     npumem_pool *pool;
 *     if (npumem_pool_create(&config, &pool) != NPUMEM_OK) { puts(npumem_last_error()); ... }
 *     npumem_block block;
 *     npumem_alloc(pool, 4096, 256, 0, &block);   // block.handle, block.offset, block.address
 *     npumem_free(pool, block.handle);
 *     npumem_pool_release(pool);
 *
 * Threads: every function may be called from any thread at once. Allocation and free are
 * lock-free.
 *
 * Errors: every function returns NPUMEM_OK or an NPUMEM_ERR_* code; npumem_strerror() describes
 * the code, npumem_last_error() gives the calling thread's full message of its last failure. A
 * failed call changes nothing (a failed batch leaves the pool as it was), except that an
 * allocation that fails for lack of room, or asks for more than the pool holds, counts in
 * `failed_allocs`.
 *
 * Tags: `npumem_tag_id()` gives a tag name's id in a pool; blocks allocated with it count under
 * the tag (live blocks, bytes asked for, their peak), as Python's `PoolStats.by_tag` shows for a
 * pool shared with Python. Untagged blocks from C, and tag numbers that are not ids of the pool
 * when the block is allocated, count with the untagged blocks for their whole life (they are
 * stored untagged: a number that becomes a tag's id later does not make them that tag's). A
 * free is counted in the row its allocation was counted in.
 *
 * Moves: a compaction (run from Python on a shared pool) may move a block of the handle API at
 * any time, also right after npumem_alloc() returns; its handle follows it, but an offset or
 * address read earlier goes stale. C code that reads or writes a block's bytes while a
 * compaction may run pins it first (npumem_pin), uses the address the pin gives, and unpins it
 * when done: a pinned block never moves and cannot be freed. Raw blocks (npumem_alloc_raw)
 * never move.
 *
 * Pools are reference counted: npumem_pool_create() returns one reference; npumem_pool_retain()
 * adds one and npumem_pool_release() drops one; the last release destroys the pool and every
 * block in it. A pool made in Python (`pool.c_pool()`) works with these functions as well.
 * Passing a pool pointer after its last release is undefined behaviour, as for freed memory
 * (while that memory is not reused, calls mostly get NPUMEM_ERR_INVALID_POOL); so is passing
 * an array shorter than its `count`.
 */
#ifndef NPUMEM_H
#define NPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The version of this interface; npumem_abi_version() gives the library's. */
#define NPUMEM_ABI_VERSION 5

/** Status codes. */
typedef int npumem_status;
#define NPUMEM_OK 0
#define NPUMEM_ERR_NULL_ARGUMENT 1     /* a required pointer argument is NULL */
#define NPUMEM_ERR_INVALID_POOL 2      /* the pool pointer is not a live pool */
#define NPUMEM_ERR_CONFIG 3            /* a configuration field broke a rule; npumem_tag_id: an empty, reserved or too long name */
#define NPUMEM_ERR_INVALID_SIZE 4      /* zero or unusable size */
#define NPUMEM_ERR_TOO_LARGE 5         /* larger than the pool: can never succeed */
#define NPUMEM_ERR_INVALID_ALIGNMENT 6 /* not a power of two, or too large */
#define NPUMEM_ERR_OUT_OF_MEMORY 7     /* no room now (the request itself is valid) */
#define NPUMEM_ERR_INVALID_HANDLE 8    /* the handle names no live block of this pool */
#define NPUMEM_ERR_FOREIGN_HANDLE 9    /* the handle belongs to another pool */
#define NPUMEM_ERR_DOUBLE_FREE 10      /* the block was already freed */
#define NPUMEM_ERR_PINNED 11           /* the block is pinned (npumem_pin, or exported through DLPack),
                                          * or a pin would pass the most a block holds */
#define NPUMEM_ERR_INVALID_BLOCK 12    /* raw free: no live block of that size at that offset */
#define NPUMEM_ERR_NO_BACKING 13       /* the pool has no host memory */
#define NPUMEM_ERR_BACKING 14          /* host memory could not be mapped or allocated (npumem's own tables too) */
#define NPUMEM_ERR_BUSY 15             /* paused too long (try again); in a forked child: the pool was in use at the fork */
#define NPUMEM_ERR_CORRUPTION 16       /* pool metadata is inconsistent */
#define NPUMEM_ERR_ABI_MISMATCH 17     /* struct size or ABI version differs */
#define NPUMEM_ERR_INTERNAL 18         /* a bug in npumem (details in npumem_last_error) */
#define NPUMEM_ERR_INVALID_ARGUMENT 19 /* an argument is malformed (a tag name that is not UTF-8) */
#define NPUMEM_ERR_NOT_PINNED 20       /* npumem_unpin: the block holds no pin to drop */

/** Backing: real host memory behind the arena, or offsets only (device memory). */
#define NPUMEM_BACKING_HOST 0u
#define NPUMEM_BACKING_NONE 1u

/** How the global pool places runs of whole chunks. */
#define NPUMEM_PLACEMENT_BEST_FIT 0u
#define NPUMEM_PLACEMENT_FIRST_FIT 1u

/** Device types: the DLPack DLDeviceType codes. */
#define NPUMEM_DEVICE_CPU 1
#define NPUMEM_DEVICE_CUDA 2
#define NPUMEM_DEVICE_CUDA_HOST 3
#define NPUMEM_DEVICE_ROCM 10
#define NPUMEM_DEVICE_EXT_DEV 12
#define NPUMEM_DEVICE_CUDA_MANAGED 13

/** A pool (opaque). */
typedef struct npumem_pool npumem_pool;

/**
 * A pool's configuration: fill it with npumem_config_init() (the defaults of the Python
 * `Pool`), then change fields. The rules are those of the Python `Pool`; a broken one gives
 * NPUMEM_ERR_CONFIG and a message naming the field.
 */
typedef struct npumem_config {
    uint32_t struct_size;   /* sizeof(npumem_config); set by npumem_config_init */
    uint32_t backing;       /* NPUMEM_BACKING_HOST (default) or NPUMEM_BACKING_NONE */
    size_t capacity;        /* bytes in the arena */
    size_t cores;           /* per-core pools (default: the number of online CPUs) */
    size_t chunk_size;      /* power of two (default 2 MiB) */
    size_t min_block;       /* power of two, >= 64 (default 256) */
    size_t bank_size;       /* power of two, <= chunk_size (default 4096) */
    size_t alignment;       /* default alignment, power of two (default 64) */
    size_t core_reserve;    /* free chunks a core keeps (default 1) */
    const size_t *slab_sizes; /* slab classes; NULL (with slab_count 0): defaults; non-NULL with count 0: none */
    size_t slab_count;
    uint32_t placement;     /* NPUMEM_PLACEMENT_BEST_FIT (default) or _FIRST_FIT */
    int32_t device_type;    /* NPUMEM_DEVICE_*; 0: CPU for host pools, EXT_DEV otherwise */
    int32_t device_id;      /* device index (0 for host pools) */
    uint64_t base_address;  /* address of offset 0; backing none only (host: the mapping) */
    uint32_t run_tails;     /* 1 (default): past a chunk, whole chunks and a tail; 0: whole chunks */
} npumem_config;

/** A block reference: survives moves by compaction and detects reuse after a free. */
typedef struct npumem_handle {
    uint32_t pool_id;
    uint32_t slot;
    uint32_t generation;
    uint32_t reserved;     /* 0: npumem writes 0 here and refuses a handle whose reserved is not 0 */
} npumem_handle;

/** A block as an allocation returns it. */
typedef struct npumem_block {
    npumem_handle handle;
    size_t offset;     /* offset in the arena (changes when a compaction moves it: see npumem_pin) */
    size_t size;       /* bytes asked for */
    uint64_t address;  /* base address + offset: a host pointer on host pools */
} npumem_block;

/**
 * A snapshot of a pool's usage and counters: the fields of the Python `PoolStats` (and of the
 * core's `PoolStats`) without its lists, in the same order.
 */
typedef struct npumem_stats {
    size_t capacity;               /* bytes in the arena */
    size_t usable_capacity;        /* bytes blocks can use */
    size_t bytes_in_use;           /* bytes held by live blocks (block sizes) */
    size_t bytes_free;             /* bytes any allocation can use */
    size_t slab_cached_bytes;      /* unused bytes inside slabs that still hold objects */
    size_t peak_bytes_in_use;      /* the highest bytes_in_use seen */
    size_t requested_bytes_in_use; /* bytes the live blocks asked for */
    size_t largest_free_block;     /* the largest block one allocation could get now */
    double external_fragmentation; /* 1 - largest_free_block / bytes_free; 0.0 when nothing is free */
    uint64_t alloc_count;          /* allocations since the pool was made */
    uint64_t free_count;           /* frees since the pool was made */
    uint64_t failed_allocs;        /* allocations that failed: no room, or larger than the pool */
    uint64_t overflow_allocs;      /* allocations served outside the caller's core pool */
    uint64_t slab_allocs;          /* allocations served by slab caches */
    uint64_t core_allocs;          /* allocations served by core pools' buddy trees */
    uint64_t global_allocs;        /* allocations served by the global pool (chunk runs) */
    uint64_t blocks_in_use;        /* live blocks */
    size_t chunks;                 /* chunks in the arena */
    size_t chunks_free;            /* chunks free in the global pool */
    size_t chunks_in_cores;        /* chunks granted to core pools */
    size_t chunks_in_runs;         /* chunks in large blocks (runs) */
    size_t regions;                /* regions with memory behind them (1 unless the pool grew) */
    uint64_t grow_events;          /* times the pool grew */
} npumem_stats;

/** What a pool is. */
typedef struct npumem_pool_info {
    size_t capacity;
    size_t cores;
    size_t alignment;
    uint32_t backing;
    uint32_t pool_id;
    int32_t device_type;
    int32_t device_id;
    uint64_t base_address;
} npumem_pool_info;

/**
 * Called when an allocation of `size` bytes aligned to `align` finds no room, on the allocating
 * thread. Return nonzero after releasing memory to have the allocation tried once more; the
 * allocation counts once in `failed_allocs` when that try fails too, and not at all when it
 * succeeds (as with Python's `Pool.set_oom_handler`). The
 * callback may call the API, on this pool too: an allocation it makes from this pool that finds
 * no room fails without calling it again, and the pool stays live until the allocation that
 * called it returns, even if the callback releases the caller's last reference.
 */
typedef int (*npumem_oom_callback)(npumem_pool *pool, size_t size, size_t align, void *user_data);

/* ----- pools ------------------------------------------------------------------------------ */

npumem_status npumem_config_init(npumem_config *config, size_t capacity);
npumem_status npumem_pool_create(const npumem_config *config, npumem_pool **out);
npumem_status npumem_pool_retain(npumem_pool *pool);
npumem_status npumem_pool_release(npumem_pool *pool);
npumem_status npumem_pool_get_info(npumem_pool *pool, npumem_pool_info *out);
npumem_status npumem_pool_stats(npumem_pool *pool, npumem_stats *out);
/**
 * Set the out-of-memory callback (NULL clears it). Returns once every call of the callback it
 * replaces that another thread began has returned, so the caller may then free that callback and
 * its user data. Called from inside this pool's callback, it replaces the callback without
 * waiting (that call itself is still running).
 */
npumem_status npumem_set_oom_callback(npumem_pool *pool, npumem_oom_callback callback, void *user_data);

/* ----- blocks ----------------------------------------------------------------------------- */

/**
 * The id of the tag `name` (NUL-terminated) in `pool`, interned on first use, for npumem_alloc()
 * and npumem_alloc_many(). A pool's first 63 tags keep their ids for its life; the id of a later
 * tag may name another tag once no block carries it, so look it up again for a later allocation.
 * Refused (NPUMEM_ERR_CONFIG): the empty name, which reads as no tag, "(other tags)", the name
 * of the later tags' row, and a name longer than 256 bytes.
 */
npumem_status npumem_tag_id(npumem_pool *pool, const char *name, uint32_t *id);
/** Allocate `size` bytes aligned to `align` (0: the pool's default), tag id `tag` (0: none). */
npumem_status npumem_alloc(npumem_pool *pool, size_t size, size_t align, uint32_t tag, npumem_block *out);
npumem_status npumem_free(npumem_pool *pool, npumem_handle handle);
/**
 * The block's current offset and address. A compaction may move the block afterwards (then
 * read them again); pin it (npumem_pin) to keep them.
 */
npumem_status npumem_block_info(npumem_pool *pool, npumem_handle handle, npumem_block *out);
/**
 * Pin the block: until the matching npumem_unpin() it never moves (its offset and address stay
 * valid) and npumem_free(), npumem_free_many() and Python's `free()` refuse it
 * (NPUMEM_ERR_PINNED). `out` (if not NULL) receives the block as it is now, where it stays while
 * pinned. Pins count: each npumem_pin() needs one npumem_unpin(). Waits while a compaction is
 * moving the block (NPUMEM_ERR_BUSY at once when called from the thread that moves it: a
 * mover). A block holds at most 32767 pins of this kind (then NPUMEM_ERR_PINNED).
 */
npumem_status npumem_pin(npumem_pool *pool, npumem_handle handle, npumem_block *out);
/**
 * Drop a pin that npumem_pin() took (NPUMEM_ERR_NOT_PINNED, and nothing changes, when the block
 * holds none). Pins are counted per block, not per caller: drop only pins you took. Python's
 * `Block.pin()` takes the same kind of pin; the pins of buffer views and DLPack exports are
 * apart and go with them.
 */
npumem_status npumem_unpin(npumem_pool *pool, npumem_handle handle);
/**
 * Allocate `count` blocks into out[0..count), or none. On failure `*failed_index` (if not NULL)
 * names the item that failed (SIZE_MAX when no single item is to blame).
 */
npumem_status npumem_alloc_many(npumem_pool *pool, const size_t *sizes, size_t count, size_t align,
                                uint32_t tag, npumem_block *out, size_t *failed_index);
/** Free `count` blocks, or none (all are checked first: live, of this pool, no duplicates). */
npumem_status npumem_free_many(npumem_pool *pool, const npumem_handle *handles, size_t count,
                               size_t *failed_index);
/** Allocate without a handle (the block never moves); `address` may be NULL. */
npumem_status npumem_alloc_raw(npumem_pool *pool, size_t size, size_t align, size_t *offset,
                               uint64_t *address);
/**
 * Free a raw block by its offset and the size it was allocated with. A raw block keeps no record
 * of its size: an offset or size that names no allocated bytes is refused, but one whose shape
 * matches other allocated bytes at that offset (a part of a block, live or freed and kept in a
 * cache of freed blocks, or a block and its neighbour) is not detected and frees those bytes,
 * which later allocations may then overlap. The same holds for the offset and size of a block
 * allocated with a handle, pinned or not (its pins, Python buffer views and DLPack exports do
 * not stop this call): it is freed behind its handle's back and the pool is corrupt from then
 * on. Free only raw blocks with this call (a handle's block with npumem_free).
 * Use handles (npumem_alloc / npumem_free) where a caller cannot vouch for the offset and the
 * size.
 */
npumem_status npumem_free_raw(npumem_pool *pool, size_t offset, size_t size);

/* ----- errors and versions ---------------------------------------------------------------- */

/** The fixed description of a status code (static storage, never NULL). */
const char *npumem_strerror(npumem_status status);
/** The calling thread's message of its last failure ("" if none), valid until its next one. */
const char *npumem_last_error(void);
const char *npumem_version(void);
uint32_t npumem_abi_version(void);

/* ----- PyTorch (torch.cuda.memory.CUDAPluggableAllocator) ---------------------------------- */

/**
 * Serve `device` (0..63) from `pool` (a reference is taken; NULL stops serving it). The pool
 * needs a nonzero base address. Set it before PyTorch allocates; replace or clear it only
 * after every tensor it served was freed.
 */
npumem_status npumem_torch_set_pool(int device, npumem_pool *pool);
/** `alloc` of CUDAPluggableAllocator: 256-byte aligned, NULL when out of memory (and for a
 *  negative size; 0 takes a 1-byte block). `stream` is a cudaStream_t. */
void *npumem_torch_alloc(ptrdiff_t size, int device, void *stream);
/** `free` of CUDAPluggableAllocator: npumem_free_raw() of the pointer's offset and `size`, with
 *  its contract (PyTorch passes back the size it allocated). A pointer or size that names no
 *  allocated bytes is ignored, the reason left in npumem_last_error(). */
void npumem_torch_free(void *ptr, ptrdiff_t size, int device, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NPUMEM_H */
