"""Argument checks of the Python facade that no other test file covers: the model
configurations `KVShape.from_config` reads."""

from __future__ import annotations

from typing import Any

import pytest

import npumem
from npumem.kv import KVShape, kv_cache_bytes

LLAMA: dict[str, Any] = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}


@pytest.mark.parametrize(
    ("extra", "error", "text"),
    [
        (
            {"hidden_size": "4096"},
            npumem.ArgumentTypeError,
            "'hidden_size' must be an int, got str",
        ),
        (
            {"num_attention_heads": "32"},
            npumem.ArgumentTypeError,
            "'num_attention_heads' must be an int, got str",
        ),
        (
            {"hidden_size": 4096.0},
            npumem.ArgumentTypeError,
            "'hidden_size' must be an int, got float",
        ),
        (
            {"num_hidden_layers": True},
            npumem.ArgumentTypeError,
            "'num_hidden_layers' must be an int, got bool",
        ),
        ({"head_dim": 128.0}, npumem.ArgumentTypeError, "'head_dim' must be an int, got float"),
        (
            {"num_key_value_heads": 0},
            npumem.InvalidArgumentError,
            "'num_key_value_heads' must be greater than 0, got 0",
        ),
        (
            {"num_attention_heads": -32},
            npumem.InvalidArgumentError,
            "'num_attention_heads' must be greater than 0, got -32",
        ),
        (
            {"num_attention_heads": 0},
            npumem.InvalidArgumentError,
            "'num_attention_heads' must be greater than 0, got 0",
        ),
        (
            {"num_hidden_layers": -1},
            npumem.InvalidArgumentError,
            "'num_hidden_layers' must be greater than 0, got -1",
        ),
        (
            {"num_attention_heads": 30},
            npumem.InvalidArgumentError,
            "'hidden_size' (4096) is not a multiple of its 'num_attention_heads' (30)",
        ),
        ({"torch_dtype": "float7"}, npumem.InvalidArgumentError, "unknown dtype 'float7'"),
        ({"dtype_bytes": 0}, npumem.InvalidArgumentError, "'dtype_bytes' must be greater than 0"),
        ({"torch_dtype": 2.0}, npumem.ArgumentTypeError, "'torch_dtype' must be an int, got float"),
    ],
)
def test_model_config_fields_are_checked_by_their_key(
    extra: dict[str, Any], error: type[Exception], text: str
) -> None:
    config = {**LLAMA, **extra}
    with pytest.raises(error) as info:
        KVShape.from_config(config)
    assert text in str(info.value)
    assert str(info.value).startswith("the model config") or "unknown dtype" in str(info.value)
    with pytest.raises(error):
        kv_cache_bytes(config, max_seq_len=16, batch=1)


def test_model_configs_that_are_right_still_read() -> None:
    assert KVShape.from_config(LLAMA) == KVShape(32, 32, 128, 2)
    # No KV heads given (or given as null): the attention heads.
    assert KVShape.from_config({**LLAMA, "num_key_value_heads": None}).num_kv_heads == 32
    gqa = {**LLAMA, "num_key_value_heads": 8, "torch_dtype": "bfloat16", "head_dim": None}
    assert KVShape.from_config(gqa) == KVShape(32, 8, 128, 2)
    assert KVShape.from_config({"n_layer": 2, "n_embd": 64, "head_dim": 16}).num_kv_heads == 4
    assert KVShape.from_config({**LLAMA, "dtype_bytes": 4}).dtype_bytes == 4
    with pytest.raises(npumem.InvalidArgumentError, match="does not give num_kv_heads, head_dim"):
        KVShape.from_config({"num_hidden_layers": 2})
