// npumem.h from C++: it compiles without warnings, links, and its structs have the sizes the
// library was built with (the Rust side asserts the same numbers).
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "npumem.h"

int main() {
    static_assert(sizeof(void *) != 8 || sizeof(npumem_config) == 112, "npumem_config");
    static_assert(sizeof(void *) != 8 || sizeof(npumem_block) == 40, "npumem_block");
    static_assert(sizeof(void *) != 8 || sizeof(npumem_stats) == 184, "npumem_stats");
    static_assert(sizeof(void *) != 8 || sizeof(npumem_pool_info) == 48, "npumem_pool_info");
    static_assert(sizeof(npumem_handle) == 16, "npumem_handle");
    npumem_config config;
    npumem_pool *pool = nullptr;
    if (npumem_config_init(&config, 1u << 20) != NPUMEM_OK) return 1;
    config.cores = 1;
    if (npumem_pool_create(&config, &pool) != NPUMEM_OK) return 2;
    npumem_block block;
    if (npumem_alloc(pool, 100, 0, 0, &block) != NPUMEM_OK) return 3;
    std::memset(reinterpret_cast<void *>(static_cast<std::uintptr_t>(block.address)), 0xab, block.size);
    if (npumem_free(pool, block.handle) != NPUMEM_OK) return 4;
    if (npumem_pool_release(pool) != NPUMEM_OK) return 5;
    std::printf("ok %s\n", npumem_version());
    return 0;
}
