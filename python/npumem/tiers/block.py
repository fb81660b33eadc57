"""The handle of a tiered block (`TieredBlock`) and the name of a tier (`Tier`).

A `TieredBlock` stays the caller's handle for the whole life of the data: when the tiered
pool promotes or demotes it, the bytes move to a block of another pool and the handle points to
that block. `tb.block` is the current underlying `npumem.Block`; read it again after a
move (its offset and pool change, its contents do not).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal, NoReturn

from npumem._core import Block
from npumem.tiers.policy import Heat

if TYPE_CHECKING:
    from npumem.tiers.pool import TieredPool

__all__ = ["FAST", "SLOW", "Tier", "TierKind", "TieredBlock"]

# How the error of an `npumem.Block` detached from its object begins (`Block.detach()`).
_DETACHED_PREFIX = "the block was detached"

TierKind = Literal["fast", "slow"]
FAST: TierKind = "fast"
"""The per-core fast tier (SRAM)."""
SLOW: TierKind = "slow"
"""The shared slow tier (HBM)."""


@dataclass(frozen=True, slots=True)
class Tier:
    """One memory of a tiered pool: the fast pool of a core, or the shared slow pool. Movers get
    a `Tier` for the source and the destination of every copy."""

    kind: TierKind
    core: int | None = None
    """The core whose fast pool this is; `None` for the slow tier."""

    def __str__(self) -> str:
        return self.kind if self.core is None else f"{self.kind}[{self.core}]"


class TieredBlock:
    """A block of a `TieredPool`: a handle that stays valid when the block
    moves between tiers. Free it with `free` (or use it as a context manager)."""

    __slots__ = (
        "_align",
        "_block",
        "_core",
        "_heat",
        "_left",
        "_nbytes",
        "_owner",
        "home",
        "serial",
    )

    def __reduce__(self) -> NoReturn:
        # A copy would be a second owner of one block (copy.copy, deepcopy and pickle all
        # come here), as the core's Block refuses to be.
        raise TypeError(
            "cannot copy or pickle a 'TieredBlock' object: it is the one owner of its block"
        )

    def __init__(
        self,
        owner: TieredPool,
        block: Block,
        core: int | None,
        home: int,
        align: int | None,
        nbytes: int,
        serial: int = -1,
    ) -> None:
        self._owner = owner
        self._nbytes = nbytes
        self._block: Block | None = block
        self._core = core
        self._align = align
        self.home = home
        """The core the block belongs to: promotions go to this core's fast pool."""
        self._heat: Heat | None = None
        # Why the block left its tiered pool other than by a free through it (None: it did not).
        self._left: str | None = None
        self.serial = serial
        """The number of the allocation in its tiered pool (0, 1, 2, ...)."""

    @property
    def heat(self) -> Heat:
        """What the policy remembers of the block's accesses (made at the first use)."""
        heat = self._heat
        if heat is None:
            heat = self._heat = Heat()
        return heat

    @property
    def block(self) -> Block:
        """The underlying `npumem.Block` where the bytes are now."""
        if self._block is None:
            raise self._gone()
        return self._block

    def _gone(self) -> Exception:
        """The error for a use of the block once its tiered pool no longer lists it."""
        from npumem.errors import InvalidHandleError

        return InvalidHandleError(self._left or "the tiered block was freed")

    @property
    def alive(self) -> bool:
        """Whether the block is still allocated."""
        return self._block is not None and self._block.alive

    @property
    def tier(self) -> TierKind:
        """`"fast"` or `"slow"`: where the bytes are now."""
        self.block  # noqa: B018  (refuses a freed block)
        return SLOW if self._core is None else FAST

    @property
    def core(self) -> int | None:
        """The core whose fast pool holds the block, or `None` when it is in the slow tier."""
        self.block  # noqa: B018
        return self._core

    @property
    def location(self) -> Tier:
        """The `Tier` that holds the block."""
        return Tier(self.tier, self._core)

    @property
    def offset(self) -> int:
        """The offset of the bytes in their tier's pool."""
        return self.block.offset

    @property
    def nbytes(self) -> int:
        """The size asked for."""
        return self.block.nbytes

    @property
    def tag(self) -> str | None:
        """The tag given at allocation."""
        return self.block.tag

    @property
    def pins(self) -> int:
        """User pins and live views of the underlying block; a block with pins never moves."""
        return self.block.pins

    def _block_detached(self) -> bool:
        """Whether the underlying block was detached from its `npumem.Block` (`tb.block.detach()`):
        its bytes are still allocated, and the holder of the handle owns them. Read from the
        error the block raises once its object can no longer use it."""
        from npumem.errors import InvalidHandleError

        block = self._block
        if block is None:
            return False
        try:
            block.offset  # noqa: B018
        except InvalidHandleError as exc:
            return str(exc).startswith(_DETACHED_PREFIX)
        return False

    def view(self) -> memoryview:
        """The block's bytes (host-backed pools only), as a view that keeps the block where it
        is until it is released: taken under the tiered pool's lock, so it never races with a
        move. Use it instead of `memoryview(tb.block)` while moves may run."""
        return self._owner._view(self)

    def free(self) -> None:
        """Give the bytes back to their tier (see `TieredPool.free`)."""
        self._owner.free(self)

    def __enter__(self) -> TieredBlock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._block is not None:
            self._owner.free(self)

    def __repr__(self) -> str:
        if self._block is None:
            return "<TieredBlock freed>" if self._left is None else "<TieredBlock detached>"
        if not self._block.alive:
            how = "detached" if self._block_detached() else "freed"
            return f"<TieredBlock in {self.location}, {how} directly through .block>"
        return (
            f"<TieredBlock {self.location} offset={self._block.offset} "
            f"nbytes={self._block.nbytes} tag={self._block.tag!r}>"
        )
