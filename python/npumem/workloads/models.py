"""The demo's models: their weights, and activation arenas planned ahead of time.

Each model's graph (from `npumem.plan.networks`) is planned with `npumem.plan.solve()`
once per batch size (vision) or per batch and sequence bucket (text). A request reserves one
block of the planned arena size and binds the plan to it (`solution.bind(block)`): every
tensor then has its offset inside the block, with no allocation per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from npumem import plan
from npumem.plan import networks

__all__ = [
    "TEXT_BUCKETS",
    "TEXT_HIDDEN",
    "TEXT_LAYERS",
    "TEXT_VOCAB",
    "VISION_BATCHES",
    "ArenaPlan",
    "Model",
    "build_models",
]

VISION_BATCHES = (1, 2, 4, 8)
TEXT_BATCHES = (1, 2)
TEXT_BUCKETS = (64, 128, 256)
TEXT_LAYERS = 4
TEXT_HIDDEN = 768
TEXT_VOCAB = 30522
ARENA_ALIGN = 64


@dataclass(frozen=True)
class ArenaPlan:
    """A planned activation arena: the solution, and the tensors' offsets inside the arena in
    op order (the demo touches each op's output there)."""

    key: tuple[int, ...]
    solution: plan.Solution
    op_outputs: tuple[int, ...]

    @property
    def arena_size(self) -> int:
        """Bytes to reserve for the arena."""
        return self.solution.arena_size


@dataclass(frozen=True)
class Model:
    """A served model: `kind` is `"vision"` or `"text"`; `plans` maps a batch size
    (vision) or `(batch, bucket)` (text) to its planned arena."""

    name: str
    kind: str
    weight_bytes: int
    plans: dict[tuple[int, ...], ArenaPlan]

    # Compared by value, but not hashable (`plans` is a dict): `hash()` names this class.
    __hash__ = None  # type: ignore[assignment]

    def plan_for(self, batch: int, seq_len: int = 0) -> ArenaPlan:
        """The arena for a request (text: the smallest bucket that holds `seq_len`)."""
        if self.kind == "vision":
            return self.plans[(batch,)]
        bucket = next(b for b in TEXT_BUCKETS if b >= seq_len)
        return self.plans[(batch, bucket)]


def _arena(graph: plan.Graph, key: tuple[int, ...], time_limit: float) -> ArenaPlan:
    problem = plan.Problem.from_graph(graph, alignment=ARENA_ALIGN)
    solution = plan.solve(problem, time_limit=time_limit)
    solution.validate()
    table = solution.tensor_offsets()
    outputs = tuple(table[op.outputs[0]][0] for op in graph.ops if op.outputs[0] in table)
    return ArenaPlan(key, solution, outputs)


# fp16 parameter counts: ResNet-50 25.6 M, MobileNetV2 3.5 M, a 4-layer BERT-base encoder
# 28.3 M plus 23.8 M of embeddings.
_WEIGHTS = {"resnet50": 25_557_032 * 2, "mobilenet_v2": 3_504_872 * 2, "text": 52_111_104 * 2}


def build_models(
    *, time_limit: float = 1.0, batches: Sequence[int] = VISION_BATCHES
) -> list[Model]:
    """Plan every arena of the three demo models (a few milliseconds each)."""
    vision = [
        Model(
            name,
            "vision",
            _WEIGHTS[name],
            {(b,): _arena(build(batch=b), (b,), time_limit) for b in batches},
        )
        for name, build in (
            ("resnet50", networks.resnet50),
            ("mobilenet_v2", networks.mobilenet_v2),
        )
    ]
    text = Model(
        "text",
        "text",
        _WEIGHTS["text"],
        {
            (b, s): _arena(
                networks.bert_base(batch=b, seq_len=s, layers=TEXT_LAYERS), (b, s), time_limit
            )
            for b in TEXT_BATCHES
            for s in TEXT_BUCKETS
        },
    )
    return [*vision, text]
