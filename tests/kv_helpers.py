"""Shared helpers of the KV cache tests."""

from __future__ import annotations

from typing import Any

import npumem
from npumem.kv import KVCache

# A small shape: 2 layers x 1 KV head x 8 dims x 2 (K and V) x 2 bytes = 64 bytes a token.
SHAPE: dict[str, Any] = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 8, "dtype_bytes": 2}


def make_cache(
    capacity_tokens: int | None = 256, page_tokens: int = 4, pool_bytes: int = 4 << 20, **kw: Any
) -> KVCache:
    pool = npumem.Pool(pool_bytes, cores=1, chunk_size=1 << 20)
    return KVCache(pool, page_tokens=page_tokens, capacity_tokens=capacity_tokens, **SHAPE, **kw)
