/*
 * C code sharing a pool with Python: a shared library that keeps its own reference to a pool
 * made in Python (`pool.c_pool()`) and allocates from it. Loaded by tests/test_capi_shared.py.
 */
#include <string.h>

#include "npumem.h"

static npumem_pool *kept = NULL;

npumem_status keep(npumem_pool *pool) {
    npumem_status status = npumem_pool_retain(pool);
    if (status == NPUMEM_OK) kept = pool;
    return status;
}

npumem_status fill_block(size_t size, unsigned char value, npumem_block *out) {
    npumem_status status = npumem_alloc(kept, size, 0, 42, out);
    if (status == NPUMEM_OK) memset((void *)(size_t)out->address, value, size);
    return status;
}

npumem_status free_block(npumem_handle handle) { return npumem_free(kept, handle); }

npumem_status blocks_in_use(uint64_t *out) {
    npumem_stats stats;
    npumem_status status = npumem_pool_stats(kept, &stats);
    if (status == NPUMEM_OK) *out = stats.blocks_in_use;
    return status;
}

npumem_status drop(void) {
    npumem_status status = npumem_pool_release(kept);
    kept = NULL;
    return status;
}
