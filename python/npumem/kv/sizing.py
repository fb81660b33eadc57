"""The size of a KV cache from a model's shape: the formula of preallocating runtimes,
`max_seq_len * batch * layers * hidden * 2 (K and V) * dtype_bytes`, where `hidden` is the
width of the keys (`num_kv_heads * head_dim`; the model's hidden size without grouped-query
attention)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npumem._shown import shown
from npumem.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["KVShape", "kv_cache_bytes"]

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be greater than 0, got {value}")
    return value


@dataclass(frozen=True)
class KVShape:
    """What one token of KV cache holds: per layer, a key and a value of `num_kv_heads` heads of
    `head_dim` elements, of `dtype_bytes` bytes each."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes"):
            _positive(getattr(self, name), name)

    @property
    def hidden(self) -> int:
        """Width of the keys (and of the values) of one layer: `num_kv_heads * head_dim`."""
        return self.num_kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        """`num_layers * hidden * 2 * dtype_bytes`."""
        return self.num_layers * self.hidden * 2 * self.dtype_bytes

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, dtype_bytes: int | None = None) -> KVShape:
        """The shape from a model configuration (a Hugging Face `config.json` as a dict, or one
        with the field names of this class): layers from `num_hidden_layers` / `n_layer`, KV
        heads from `num_key_value_heads` (else the attention heads), `head_dim` (else
        `hidden_size / num_attention_heads`), element size from `torch_dtype` (else 2)."""
        if not isinstance(config, Mapping):
            raise ArgumentTypeError(f"config must be a mapping, got {type(config).__name__}")
        layers = _first(config, "num_layers", "num_hidden_layers", "n_layer", "n_layers")
        heads = _first(config, "num_attention_heads", "n_head", "n_heads")
        kv_heads = _first(config, "num_kv_heads", "num_key_value_heads", "n_kv_heads") or heads
        head_dim = _first(config, "head_dim")
        hidden = _first(config, "hidden_size", "n_embd", "d_model")
        if head_dim is None and hidden is not None and heads:
            if hidden % heads:
                raise InvalidArgumentError(
                    f"hidden_size {hidden} is not a multiple of {heads} heads"
                )
            head_dim = hidden // heads
        if kv_heads is None and hidden is not None and head_dim:
            kv_heads = hidden // head_dim
        missing = [
            name
            for name, value in (
                ("num_layers", layers),
                ("num_kv_heads", kv_heads),
                ("head_dim", head_dim),
            )
            if value is None
        ]
        if missing:
            raise InvalidArgumentError(f"the model config does not give {', '.join(missing)}")
        if dtype_bytes is None:
            dtype = _first(config, "dtype_bytes", "torch_dtype", "dtype")
            if isinstance(dtype, str):
                if dtype not in _DTYPE_BYTES:
                    raise InvalidArgumentError(f"unknown dtype {shown(dtype)} in the model config")
                dtype_bytes = _DTYPE_BYTES[dtype]
            else:
                dtype_bytes = 2 if dtype is None else dtype
        return cls(layers, kv_heads, head_dim, dtype_bytes)


def kv_cache_bytes(shape: KVShape | Mapping[str, Any], *, max_seq_len: int, batch: int) -> int:
    """Bytes of a KV cache preallocated for `batch` sequences of `max_seq_len` tokens:
    `max_seq_len * batch * layers * hidden * 2 * dtype_bytes`.

    >>> kv_cache_bytes({"num_hidden_layers": 32, "hidden_size": 4096,
    ...                 "num_attention_heads": 32}, max_seq_len=2048, batch=8)
    8589934592
    """
    if not isinstance(shape, KVShape):
        shape = KVShape.from_config(shape)
    seq = _positive(max_seq_len, "max_seq_len")
    n = _positive(batch, "batch")
    return seq * n * shape.num_layers * shape.hidden * 2 * shape.dtype_bytes
