"""Type stubs of the Rust extension ``npumem._core``."""

__version__: str

class PackingInstance:
    """One component of a planning problem for the packing search (``npumem.plan.search``)."""

    def __init__(
        self,
        sizes: list[int],
        alignments: list[int],
        sec_lo: list[int],
        sec_hi: list[int],
        n_sections: int,
        neighbors: list[list[int]],
        obstacles: list[list[tuple[int, int]]],
    ) -> None: ...
    def __len__(self) -> int: ...
    def search(
        self,
        rank: list[int],
        capacity: int,
        target: int,
        node_limit: int,
        time_limit: float,
    ) -> tuple[bool, list[int] | None, int, int]: ...
