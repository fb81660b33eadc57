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


def _first(config: Mapping[str, Any], *keys: str) -> tuple[str, Any] | None:
    """The first of `keys` that `config` gives (not None), with its value."""
    for key in keys:
        if config.get(key) is not None:
            return key, config[key]
    return None


def _count(config: Mapping[str, Any], *keys: str) -> int | None:
    """The first of `keys` that `config` gives, which must be an int > 0 (the message names
    the config key); None when it gives none."""
    found = _first(config, *keys)
    return None if found is None else _checked(*found)


def _checked(key: str, value: object) -> int:
    """`value`, the model config's `key`, which must be an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(
            f"the model config's {key!r} must be an int, got {type(value).__name__}"
        )
    if value <= 0:
        raise InvalidArgumentError(
            f"the model config's {key!r} must be greater than 0, got {value}"
        )
    return value


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
        heads from `num_key_value_heads` (when it gives none, the attention heads), `head_dim`
        (else `hidden_size / num_attention_heads`), element size from `torch_dtype` (else 2).
        Every count it reads must be an int (`ArgumentTypeError`) greater than 0
        (`InvalidArgumentError`); the message names the config key. A key given as None
        (`null` in JSON) counts as not given."""
        if not isinstance(config, Mapping):
            raise ArgumentTypeError(f"config must be a mapping, got {type(config).__name__}")
        layers = _count(config, "num_layers", "num_hidden_layers", "n_layer", "n_layers")
        heads = _count(config, "num_attention_heads", "n_head", "n_heads")
        kv_heads = _count(config, "num_kv_heads", "num_key_value_heads", "n_kv_heads")
        if kv_heads is None:
            kv_heads = heads
        head_dim = _count(config, "head_dim")
        hidden = _count(config, "hidden_size", "n_embd", "d_model")
        if head_dim is None and hidden is not None and heads is not None:
            if hidden % heads:
                hidden_key = _first(config, "hidden_size", "n_embd", "d_model")
                heads_key = _first(config, "num_attention_heads", "n_head", "n_heads")
                assert hidden_key is not None and heads_key is not None
                raise InvalidArgumentError(
                    f"the model config's {hidden_key[0]!r} ({hidden}) is not a multiple of its "
                    f"{heads_key[0]!r} ({heads}): it gives no head_dim"
                )
            head_dim = hidden // heads
        if kv_heads is None and hidden is not None and head_dim is not None:
            kv_heads = hidden // head_dim
            if kv_heads == 0:
                raise InvalidArgumentError(
                    f"the model config's head_dim ({head_dim}) is wider than its hidden size "
                    f"({hidden}): it gives no KV heads"
                )
        if layers is None or kv_heads is None or head_dim is None:
            missing = [
                name
                for name, value in (
                    ("num_layers", layers),
                    ("num_kv_heads", kv_heads),
                    ("head_dim", head_dim),
                )
                if value is None
            ]
            raise InvalidArgumentError(f"the model config does not give {', '.join(missing)}")
        if dtype_bytes is None:
            dtype = _first(config, "dtype_bytes", "torch_dtype", "dtype")
            if dtype is not None and isinstance(dtype[1], str):
                if dtype[1] not in _DTYPE_BYTES:
                    raise InvalidArgumentError(
                        f"unknown dtype {shown(dtype[1])} in the model config's {dtype[0]!r}"
                    )
                dtype_bytes = _DTYPE_BYTES[dtype[1]]
            elif dtype is not None:
                dtype_bytes = _checked(*dtype)
            else:
                dtype_bytes = 2
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
