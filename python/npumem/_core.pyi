"""Type stubs of the Rust extension ``npumem._core``."""

from typing import Self, final

__all__ = ["PackingInstance", "__version__"]

__version__: str

@final
class PackingInstance:
    """One component of a planning problem for the packing search (``npumem.plan.search``)."""

    def __new__(
        cls,
        sizes: list[int],
        alignments: list[int],
        sec_lo: list[int],
        sec_hi: list[int],
        n_sections: int,
        neighbors: list[list[int]],
        obstacles: list[list[tuple[int, int]]],
    ) -> Self: ...
    def __len__(self) -> int: ...
    def search(
        self,
        rank: list[int],
        capacity: int,
        target: int,
        node_limit: int,
        time_limit: float,
    ) -> tuple[bool, list[int] | None, int, int]: ...
