/*
 * The C ABI under load and under misuse, with no Python involved.
 *
 * 1. Four threads allocate and free blocks of random sizes and alignments from one host pool,
 *    fill each with a pattern of their own, and check the pattern before each free; at the end
 *    every live block of every thread is checked for overlap with the others.
 * 2. Misuse: a NULL pool, bad sizes and alignments, a double free, a foreign and a made-up
 *    handle, bad raw frees, bad configurations, failing batches. Each gets its error code and
 *    leaves the pool's statistics as they were.
 * 3. The out-of-memory callback (and what `failed_allocs` counts with it), reference counting,
 *    pins, and the PyTorch allocator functions on a pool with no backing and a fake base
 *    address.
 *
 * Prints "ok" and exits 0, or prints the failed check and exits 1.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npumem.h"

#define THREADS 4
#define ITERATIONS 20000
#define LIVE 48

static int failures = 0;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, npumem_last_error());                                             \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

#define EXPECT(call, code)                                                                     \
    do {                                                                                       \
        npumem_status got_ = (call);                                                           \
        if (got_ != (code)) {                                                                  \
            fprintf(stderr, "%s:%d: %s gave %d (%s), expected %d (%s); last error: %s\n",     \
                    __FILE__, __LINE__, #call, got_, npumem_strerror(got_), (int)(code),       \
                    npumem_strerror(code), npumem_last_error());                               \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

/* xorshift: a per-thread random sequence. */
static uint64_t next_random(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

static unsigned char pattern_byte(unsigned thread, size_t serial, size_t i) {
    return (unsigned char)(thread * 61u + serial * 7u + i * 13u + 1u);
}

static void fill(const npumem_block *b, unsigned thread, size_t serial) {
    unsigned char *p = (unsigned char *)(uintptr_t)b->address;
    size_t i;
    for (i = 0; i < b->size; i++) p[i] = pattern_byte(thread, serial, i);
}

static int intact(const npumem_block *b, unsigned thread, size_t serial) {
    const unsigned char *p = (const unsigned char *)(uintptr_t)b->address;
    size_t i;
    for (i = 0; i < b->size; i++) {
        if (p[i] != pattern_byte(thread, serial, i)) return 0;
    }
    return 1;
}

typedef struct {
    npumem_pool *pool;
    unsigned id;
    npumem_block live[LIVE];
    size_t serial[LIVE];
    size_t count;
    size_t allocs, corrupted, errors;
} worker;

static size_t random_size(uint64_t *state) {
    uint64_t r = next_random(state);
    switch (r % 4) {
    case 0: return 1 + (size_t)(r >> 8) % 64;          /* slab sizes */
    case 1: return 1 + (size_t)(r >> 8) % 4096;        /* up to a bank */
    case 2: return 1 + (size_t)(r >> 8) % (256 << 10); /* buddy blocks */
    default: return 1 + (size_t)(r >> 8) % 1024;
    }
}

static void *work(void *arg) {
    worker *w = (worker *)arg;
    uint64_t state = 0x9e3779b97f4a7c15ull * (w->id + 1);
    static const size_t aligns[] = {0, 8, 64, 256, 4096};
    size_t serial = 0, i;
    for (i = 0; i < ITERATIONS; i++) {
        uint64_t r = next_random(&state);
        if (w->count == LIVE || (w->count > 0 && r % 3 == 0)) {
            size_t k = (size_t)(r >> 16) % w->count;
            if (!intact(&w->live[k], w->id, w->serial[k])) w->corrupted++;
            if (npumem_free(w->pool, w->live[k].handle) != NPUMEM_OK) w->errors++;
            w->live[k] = w->live[w->count - 1];
            w->serial[k] = w->serial[w->count - 1];
            w->count--;
        } else {
            size_t align = aligns[(r >> 20) % 5];
            npumem_block b;
            npumem_status s = npumem_alloc(w->pool, random_size(&state), align, w->id + 1, &b);
            if (s == NPUMEM_ERR_OUT_OF_MEMORY) continue;
            if (s != NPUMEM_OK) {
                w->errors++;
                continue;
            }
            if (align != 0 && b.address % align != 0) w->errors++;
            fill(&b, w->id, serial);
            w->live[w->count] = b;
            w->serial[w->count] = serial++;
            w->count++;
            w->allocs++;
        }
    }
    return NULL;
}

typedef struct {
    size_t offset, end;
    unsigned thread;
} extent;

static int by_offset(const void *a, const void *b) {
    const extent *x = (const extent *)a, *y = (const extent *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static npumem_pool *make_pool(size_t capacity, size_t cores) {
    npumem_config config;
    npumem_pool *pool = NULL;
    EXPECT(npumem_config_init(&config, capacity), NPUMEM_OK);
    config.cores = cores;
    EXPECT(npumem_pool_create(&config, &pool), NPUMEM_OK);
    return pool;
}

static void threads(void) {
    npumem_pool *pool = make_pool(64u << 20, THREADS);
    worker workers[THREADS];
    pthread_t tids[THREADS];
    extent all[THREADS * LIVE];
    npumem_handle handles[THREADS * LIVE];
    npumem_stats stats;
    size_t n = 0, i, k, allocs = 0;
    unsigned t;
    if (!pool) return;
    for (t = 0; t < THREADS; t++) {
        memset(&workers[t], 0, sizeof workers[t]);
        workers[t].pool = pool;
        workers[t].id = t;
        CHECK(pthread_create(&tids[t], NULL, work, &workers[t]) == 0);
    }
    for (t = 0; t < THREADS; t++) pthread_join(tids[t], NULL);
    for (t = 0; t < THREADS; t++) {
        CHECK(workers[t].corrupted == 0);
        CHECK(workers[t].errors == 0);
        allocs += workers[t].allocs;
        for (k = 0; k < workers[t].count; k++) {
            const npumem_block *b = &workers[t].live[k];
            CHECK(intact(b, t, workers[t].serial[k]));
            all[n].offset = b->offset;
            all[n].end = b->offset + b->size;
            all[n].thread = t;
            handles[n] = b->handle;
            n++;
        }
    }
    qsort(all, n, sizeof all[0], by_offset);
    for (i = 1; i < n; i++) {
        if (all[i].offset < all[i - 1].end) {
            fprintf(stderr, "overlap: [%zu, %zu) of thread %u and [%zu, %zu) of thread %u\n",
                    all[i - 1].offset, all[i - 1].end, all[i - 1].thread, all[i].offset, all[i].end,
                    all[i].thread);
            failures++;
        }
    }
    EXPECT(npumem_pool_stats(pool, &stats), NPUMEM_OK);
    CHECK(stats.blocks_in_use == n);
    CHECK(stats.alloc_count == allocs);
    EXPECT(npumem_free_many(pool, handles, n, NULL), NPUMEM_OK);
    EXPECT(npumem_pool_stats(pool, &stats), NPUMEM_OK);
    CHECK(stats.bytes_in_use == 0);
    CHECK(stats.blocks_in_use == 0);
    CHECK(stats.free_count == stats.alloc_count);
    printf("threads: %u threads, %zu allocations, %zu live at the end, no overlap\n", THREADS,
           allocs, n);
    EXPECT(npumem_pool_release(pool), NPUMEM_OK);
}

/* The statistics that a refused call must leave as they were. */
static int same_stats(npumem_pool *pool, const npumem_stats *before) {
    npumem_stats now;
    if (npumem_pool_stats(pool, &now) != NPUMEM_OK) return 0;
    return now.bytes_in_use == before->bytes_in_use && now.blocks_in_use == before->blocks_in_use &&
           now.alloc_count == before->alloc_count && now.free_count == before->free_count &&
           now.requested_bytes_in_use == before->requested_bytes_in_use;
}

static void misuse(void) {
    npumem_pool *pool = make_pool(8u << 20, 2), *other = make_pool(8u << 20, 1), *made = NULL;
    npumem_block a, b, foreign, out[3];
    npumem_handle made_up = {0, 0, 0, 0}, twice[2];
    npumem_stats before, stats;
    npumem_pool_info info;
    npumem_config config;
    size_t sizes[3] = {64, 0, 64}, failed = 0, offset = 0;
    if (!pool || !other) return;

    /* A NULL pool or output. */
    EXPECT(npumem_alloc(NULL, 64, 0, 0, &a), NPUMEM_ERR_NULL_ARGUMENT);
    CHECK(strstr(npumem_last_error(), "pool is NULL") != NULL);
    EXPECT(npumem_free(NULL, made_up), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_pool_stats(NULL, &stats), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_pool_release(NULL), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_pool_retain(NULL), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_alloc_many(NULL, sizes, 3, 0, 0, out, NULL), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_free_raw(NULL, 0, 64), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_alloc(pool, 64, 0, 0, NULL), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_pool_stats(pool, NULL), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_pool_create(NULL, &made), NPUMEM_ERR_NULL_ARGUMENT);

    EXPECT(npumem_alloc(pool, 1000, 0, 7, &a), NPUMEM_OK);
    EXPECT(npumem_alloc(other, 1000, 0, 0, &foreign), NPUMEM_OK);
    EXPECT(npumem_pool_stats(pool, &before), NPUMEM_OK);

    /* Bad sizes and alignments. */
    EXPECT(npumem_alloc(pool, 0, 0, 0, &b), NPUMEM_ERR_INVALID_SIZE);
    EXPECT(npumem_alloc(pool, (size_t)16 << 20, 0, 0, &b), NPUMEM_ERR_TOO_LARGE);
    EXPECT(npumem_alloc(pool, SIZE_MAX, 0, 0, &b), NPUMEM_ERR_TOO_LARGE);
    EXPECT(npumem_alloc(pool, 64, 3, 0, &b), NPUMEM_ERR_INVALID_ALIGNMENT);
    EXPECT(npumem_alloc_raw(pool, 0, 0, &offset, NULL), NPUMEM_ERR_INVALID_SIZE);
    CHECK(same_stats(pool, &before));

    /* A double free, a foreign handle, a made-up handle. */
    EXPECT(npumem_alloc(pool, 500, 0, 0, &b), NPUMEM_OK);
    EXPECT(npumem_free(pool, b.handle), NPUMEM_OK);
    EXPECT(npumem_free(pool, b.handle), NPUMEM_ERR_DOUBLE_FREE);
    CHECK(same_stats(pool, &before) == 0); /* the good alloc and free were counted */
    EXPECT(npumem_pool_stats(pool, &before), NPUMEM_OK);
    EXPECT(npumem_free(pool, b.handle), NPUMEM_ERR_DOUBLE_FREE);
    EXPECT(npumem_free(pool, foreign.handle), NPUMEM_ERR_FOREIGN_HANDLE);
    made_up.pool_id = a.handle.pool_id;
    made_up.slot = 100000;
    EXPECT(npumem_free(pool, made_up), NPUMEM_ERR_INVALID_HANDLE);
    EXPECT(npumem_block_info(pool, foreign.handle, &b), NPUMEM_ERR_FOREIGN_HANDLE);
    CHECK(same_stats(pool, &before));

    /* Raw frees of blocks that are not there. */
    EXPECT(npumem_free_raw(pool, a.offset + 64, 64), NPUMEM_ERR_INVALID_BLOCK);
    EXPECT(npumem_free_raw(pool, (size_t)100 << 20, 64), NPUMEM_ERR_INVALID_BLOCK);
    EXPECT(npumem_free_raw(pool, 0, 0), NPUMEM_ERR_INVALID_BLOCK);
    CHECK(same_stats(pool, &before));

    /* Batches that fail leave nothing behind. */
    failed = 99;
    EXPECT(npumem_alloc_many(pool, sizes, 3, 0, 0, out, &failed), NPUMEM_ERR_INVALID_SIZE);
    CHECK(failed == 1);
    twice[0] = a.handle;
    twice[1] = a.handle;
    EXPECT(npumem_free_many(pool, twice, 2, &failed), NPUMEM_ERR_DOUBLE_FREE);
    CHECK(failed == 1);
    CHECK(strstr(npumem_last_error(), "names one block twice (items 0 and 1)") != NULL);
    /* A count no pool could hold is refused before the array is read. */
    EXPECT(npumem_alloc_many(pool, sizes, SIZE_MAX / 2, 0, 0, out, &failed), NPUMEM_ERR_TOO_LARGE);
    CHECK(failed == SIZE_MAX);
    CHECK(strstr(npumem_last_error(), "can never succeed") != NULL);
    EXPECT(npumem_free_many(pool, twice, SIZE_MAX / 2, &failed), NPUMEM_ERR_INVALID_HANDLE);
    CHECK(failed == SIZE_MAX);
    twice[1] = foreign.handle;
    EXPECT(npumem_free_many(pool, twice, 2, &failed), NPUMEM_ERR_FOREIGN_HANDLE);
    CHECK(failed == 1);
    CHECK(same_stats(pool, &before));
    /* A batch that runs out of room frees what it made (those count as allocs and frees). */
    sizes[1] = (size_t)6 << 20; /* fits alone, not with the others after a big one */
    sizes[2] = (size_t)6 << 20;
    EXPECT(npumem_alloc_many(pool, sizes, 3, 0, 0, out, &failed), NPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(failed == 2);
    CHECK(strstr(npumem_last_error(), "out of memory") != NULL);
    EXPECT(npumem_pool_stats(pool, &stats), NPUMEM_OK);
    CHECK(stats.bytes_in_use == before.bytes_in_use && stats.blocks_in_use == before.blocks_in_use);
    CHECK(stats.requested_bytes_in_use == before.requested_bytes_in_use);

    /* Bad configurations name their field. */
    EXPECT(npumem_config_init(&config, 1u << 20), NPUMEM_OK);
    config.alignment = 48;
    EXPECT(npumem_pool_create(&config, &made), NPUMEM_ERR_CONFIG);
    CHECK(strstr(npumem_last_error(), "alignment must be a power of two, got 48") != NULL);
    EXPECT(npumem_config_init(&config, 1u << 20), NPUMEM_OK);
    config.cores = 0;
    EXPECT(npumem_pool_create(&config, &made), NPUMEM_ERR_CONFIG);
    EXPECT(npumem_config_init(&config, 1u << 20), NPUMEM_OK);
    config.base_address = 4096; /* host pools have their own address */
    EXPECT(npumem_pool_create(&config, &made), NPUMEM_ERR_CONFIG);
    CHECK(strstr(npumem_last_error(), "base_address") != NULL);
    EXPECT(npumem_config_init(&config, 1u << 20), NPUMEM_OK);
    CHECK(config.run_tails == 1);
    config.run_tails = 2;
    EXPECT(npumem_pool_create(&config, &made), NPUMEM_ERR_CONFIG);
    CHECK(strstr(npumem_last_error(), "run_tails must be 0 or 1, got 2") != NULL);
    EXPECT(npumem_config_init(&config, 1u << 20), NPUMEM_OK);
    config.slab_count = 3; /* with slab_sizes NULL, which asks for the default classes */
    EXPECT(npumem_pool_create(&config, &made), NPUMEM_ERR_CONFIG);
    CHECK(strstr(npumem_last_error(), "slab_sizes is NULL with slab_count 3") != NULL);
    CHECK(made == NULL);
    /* run_tails 1 (the default): 3 MiB takes a chunk and a 1 MiB tail; 0: two whole chunks. */
    for (uint32_t tails = 0; tails <= 1; tails++) {
        npumem_pool *tailed = NULL;
        npumem_block big;
        npumem_stats held;
        EXPECT(npumem_config_init(&config, 16u << 20), NPUMEM_OK);
        config.backing = NPUMEM_BACKING_NONE;
        config.cores = 1;
        config.run_tails = tails;
        EXPECT(npumem_pool_create(&config, &tailed), NPUMEM_OK);
        EXPECT(npumem_alloc(tailed, (size_t)3 << 20, 0, 0, &big), NPUMEM_OK);
        EXPECT(npumem_pool_stats(tailed, &held), NPUMEM_OK);
        CHECK(held.bytes_in_use == (tails ? (size_t)3 << 20 : (size_t)4 << 20));
        EXPECT(npumem_free(tailed, big.handle), NPUMEM_OK);
        npumem_pool_release(tailed);
    }
    EXPECT(npumem_config_init(&config, 1u << 20), NPUMEM_OK);
    config.struct_size = 8;
    EXPECT(npumem_pool_create(&config, &made), NPUMEM_ERR_ABI_MISMATCH);
    CHECK(made == NULL);

    /* The pool is still good. */
    EXPECT(npumem_pool_get_info(pool, &info), NPUMEM_OK);
    CHECK(info.capacity == (8u << 20) && info.cores == 2 && info.backing == NPUMEM_BACKING_HOST);
    CHECK(info.device_type == NPUMEM_DEVICE_CPU && info.base_address + a.offset == a.address);
    EXPECT(npumem_block_info(pool, a.handle, &b), NPUMEM_OK);
    CHECK(b.offset == a.offset && b.size == 1000 && b.address == a.address);
    EXPECT(npumem_free(pool, a.handle), NPUMEM_OK);
    EXPECT(npumem_free(other, foreign.handle), NPUMEM_OK);

    CHECK(strcmp(npumem_strerror(NPUMEM_OK), "success") == 0);
    CHECK(strcmp(npumem_strerror(12345), "unknown status code") == 0);
    CHECK(npumem_abi_version() == NPUMEM_ABI_VERSION);
    EXPECT(npumem_pool_release(other), NPUMEM_OK);
    EXPECT(npumem_pool_release(pool), NPUMEM_OK);
    printf("misuse: every refused call gave its code and left the pool as it was\n");
}

typedef struct {
    npumem_pool *pool;
    npumem_handle reserve;
    int calls;
} oom_state;

static int release_reserve(npumem_pool *pool, size_t size, size_t align, void *user) {
    oom_state *s = (oom_state *)user;
    (void)size;
    (void)align;
    s->calls++;
    return s->pool == pool && npumem_free(pool, s->reserve) == NPUMEM_OK;
}

static int always_retry(npumem_pool *pool, size_t size, size_t align, void *user) {
    (void)pool;
    (void)size;
    (void)align;
    ++*(int *)user;
    return 1;
}

static uint64_t failed_allocs(npumem_pool *pool) {
    npumem_stats stats;
    return npumem_pool_stats(pool, &stats) == NPUMEM_OK ? stats.failed_allocs : UINT64_MAX;
}

static void oom_callback_and_refs(void) {
    npumem_pool *pool = make_pool(4u << 20, 1);
    npumem_block reserve, big, again, two[2];
    oom_state state;
    size_t offset, sizes[2] = {1u << 20, 1u << 20};
    int retries = 0;
    if (!pool) return;
    EXPECT(npumem_alloc(pool, 3u << 20, 0, 0, &reserve), NPUMEM_OK);
    EXPECT(npumem_alloc(pool, 2u << 20, 0, 0, &big), NPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(failed_allocs(pool) == 1);
    /* A retry that finds no room either: each allocation counts once. */
    EXPECT(npumem_set_oom_callback(pool, always_retry, &retries), NPUMEM_OK);
    EXPECT(npumem_alloc(pool, 2u << 20, 0, 0, &big), NPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(failed_allocs(pool) == 2);
    EXPECT(npumem_alloc_raw(pool, 2u << 20, 0, &offset, NULL), NPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(failed_allocs(pool) == 3);
    EXPECT(npumem_alloc_many(pool, sizes, 2, 0, 0, two, NULL), NPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(failed_allocs(pool) == 4);
    CHECK(retries == 3);
    state.pool = pool;
    state.reserve = reserve.handle;
    state.calls = 0;
    EXPECT(npumem_set_oom_callback(pool, release_reserve, &state), NPUMEM_OK);
    EXPECT(npumem_alloc(pool, 2u << 20, 0, 0, &big), NPUMEM_OK);
    CHECK(state.calls == 1);
    CHECK(failed_allocs(pool) == 4); /* rescued: it never failed */
    EXPECT(npumem_alloc(pool, 4u << 20, 0, 0, &again), NPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(state.calls == 2);
    EXPECT(npumem_set_oom_callback(pool, NULL, NULL), NPUMEM_OK);
    EXPECT(npumem_free(pool, big.handle), NPUMEM_OK);

    /* Two references: the pool lives until both are released. */
    EXPECT(npumem_pool_retain(pool), NPUMEM_OK);
    EXPECT(npumem_pool_release(pool), NPUMEM_OK);
    EXPECT(npumem_alloc(pool, 64, 0, 0, &again), NPUMEM_OK);
    EXPECT(npumem_free(pool, again.handle), NPUMEM_OK);
    EXPECT(npumem_pool_release(pool), NPUMEM_OK);
    printf("oom callback and reference counts: ok\n");
}

static void pins(void) {
    npumem_pool *pool = make_pool(4u << 20, 1);
    npumem_block block, where;
    npumem_handle forged;
    npumem_stats before;
    size_t failed = 0;
    if (!pool) return;
    EXPECT(npumem_alloc(pool, 1000, 0, 0, &block), NPUMEM_OK);
    EXPECT(npumem_pin(pool, block.handle, &where), NPUMEM_OK);
    CHECK(where.offset == block.offset && where.address == block.address && where.size == 1000);
    EXPECT(npumem_pin(pool, block.handle, NULL), NPUMEM_OK);
    EXPECT(npumem_pool_stats(pool, &before), NPUMEM_OK);
    EXPECT(npumem_free(pool, block.handle), NPUMEM_ERR_PINNED);
    EXPECT(npumem_free_many(pool, &block.handle, 1, &failed), NPUMEM_ERR_PINNED);
    CHECK(failed == 0);
    CHECK(same_stats(pool, &before));
    EXPECT(npumem_unpin(pool, block.handle), NPUMEM_OK);
    EXPECT(npumem_free(pool, block.handle), NPUMEM_ERR_PINNED); /* one pin is left */
    EXPECT(npumem_unpin(pool, block.handle), NPUMEM_OK);
    EXPECT(npumem_unpin(pool, block.handle), NPUMEM_ERR_NOT_PINNED);
    CHECK(strstr(npumem_last_error(), "holds no pin") != NULL);
    CHECK(strcmp(npumem_strerror(NPUMEM_ERR_NOT_PINNED), "the block holds no pin to drop") == 0);
    forged = block.handle;
    forged.reserved = 3;
    EXPECT(npumem_pin(pool, forged, &where), NPUMEM_ERR_INVALID_HANDLE);
    EXPECT(npumem_unpin(NULL, block.handle), NPUMEM_ERR_NULL_ARGUMENT);
    EXPECT(npumem_free(pool, block.handle), NPUMEM_OK);
    EXPECT(npumem_pin(pool, block.handle, &where), NPUMEM_ERR_INVALID_HANDLE);
    EXPECT(npumem_pool_release(pool), NPUMEM_OK);
    printf("pins: ok\n");
}

static void torch_functions(void) {
    const uint64_t base = 0x7f0000000000ull; /* a fake device address */
    npumem_config config;
    npumem_pool *pool = NULL;
    npumem_stats stats;
    void *p, *q;
    EXPECT(npumem_config_init(&config, 64u << 20), NPUMEM_OK);
    config.backing = NPUMEM_BACKING_NONE;
    config.base_address = base;
    config.device_type = NPUMEM_DEVICE_CUDA;
    config.cores = 2;
    EXPECT(npumem_pool_create(&config, &pool), NPUMEM_OK);
    if (!pool) return;
    CHECK(npumem_torch_alloc(1024, 0, NULL) == NULL); /* no pool for device 0 yet */
    EXPECT(npumem_torch_set_pool(64, pool), NPUMEM_ERR_CONFIG);
    EXPECT(npumem_torch_set_pool(0, pool), NPUMEM_OK);
    p = npumem_torch_alloc(1000, 0, NULL);
    q = npumem_torch_alloc(3 << 20, 0, NULL);
    CHECK(p != NULL && q != NULL && p != q);
    CHECK((uintptr_t)p % 256 == 0 && (uintptr_t)q % 256 == 0);
    CHECK((uint64_t)(uintptr_t)p >= base && (uint64_t)(uintptr_t)p < base + (64u << 20));
    CHECK(npumem_torch_alloc((ptrdiff_t)1 << 40, 0, NULL) == NULL);
    CHECK(npumem_torch_alloc(-5, 0, NULL) == NULL);
    CHECK(strstr(npumem_last_error(), "size must not be negative, got -5") != NULL);
    npumem_torch_free(p, -1000, 0, NULL); /* refused: p stays allocated */
    EXPECT(npumem_pool_stats(pool, &stats), NPUMEM_OK);
    CHECK(stats.requested_bytes_in_use == 1000 + (3 << 20));
    npumem_torch_free(p, 1000, 0, NULL);
    npumem_torch_free(q, 3 << 20, 0, NULL);
    EXPECT(npumem_pool_stats(pool, &stats), NPUMEM_OK);
    CHECK(stats.bytes_in_use == 0);
    npumem_torch_free(q, 3 << 20, 0, NULL); /* refused: the pool is unchanged */
    EXPECT(npumem_pool_stats(pool, &stats), NPUMEM_OK);
    CHECK(stats.bytes_in_use == 0 && stats.free_count == 2);
    EXPECT(npumem_torch_set_pool(0, NULL), NPUMEM_OK);
    EXPECT(npumem_pool_release(pool), NPUMEM_OK);
    printf("torch allocator functions: ok\n");
}

int main(void) {
    threads();
    misuse();
    oom_callback_and_refs();
    pins();
    torch_functions();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
