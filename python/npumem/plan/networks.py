"""Graphs of real networks, built from their layer shapes (inference, NCHW for CNNs).

Each function returns a `Graph` in our format, with the weights as weight
tensors (not planned unless asked). Batch normalization is folded into the convolutions, as
inference runtimes do; activations (ReLU, ReLU6, GELU, softmax, scaling) and residual additions
run in place on their first input; flattening and head reshapes are views.

* `resnet50()`: ResNet-50 v1.5 (He et al. 2016; stride 2 in the 3x3 convolution).
* `mobilenet_v2()`: MobileNetV2 1.0 (Sandler et al. 2018).
* `bert_base()`: a stack of BERT-base encoder layers (hidden 768, 12 heads, FFN 3072).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from npumem._shown import shown
from npumem.plan.graph import DTYPE_SIZES, Graph, Op, Tensor

__all__ = ["NETWORKS", "bert_base", "mobilenet_v2", "resnet50"]


class _Builder:
    """Adds tensors and ops in execution order; shapes are tracked to size the tensors."""

    def __init__(self, name: str, dtype: str) -> None:
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"unknown dtype {shown(dtype)}; known: {', '.join(DTYPE_SIZES)}")
        self.name = name
        self.itemsize = DTYPE_SIZES[dtype]
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.inputs: list[str] = []

    def tensor(
        self, name: str, shape: Sequence[int], *, weight: bool = False, view_of: str | None = None
    ) -> str:
        self.shapes[name] = tuple(shape)
        self.tensors.append(
            Tensor(name, math.prod(shape) * self.itemsize, weight=weight, view_of=view_of)
        )
        return name

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.inputs.append(self.tensor(name, shape))
        return name

    def op(self, name: str, inputs: list[str], out: str, *, inplace_with: str | None = None) -> str:
        self.ops.append(Op(name, inputs, [out], {out: inplace_with} if inplace_with else {}))
        return out

    def unary(self, x: str, name: str) -> str:
        """An element-wise op that may run in place."""
        out = self.tensor(f"{name}.out", self.shapes[x])
        return self.op(name, [x], out, inplace_with=x)

    def add(self, a: str, b: str, name: str) -> str:
        out = self.tensor(f"{name}.out", self.shapes[a])
        return self.op(name, [a, b], out, inplace_with=a)

    def conv(self, x: str, cout: int, k: int, stride: int, name: str, groups: int = 1) -> str:
        n, cin, h, w = self.shapes[x]
        pad = k // 2
        ho = (h + 2 * pad - k) // stride + 1
        wo = (w + 2 * pad - k) // stride + 1
        weight = self.tensor(f"{name}.weight", (cout, cin // groups, k, k), weight=True)
        bias = self.tensor(f"{name}.bias", (cout,), weight=True)
        out = self.tensor(f"{name}.out", (n, cout, ho, wo))
        return self.op(name, [x, weight, bias], out)

    def pool(self, x: str, k: int, stride: int, name: str) -> str:
        n, c, h, w = self.shapes[x]
        pad = k // 2
        out = self.tensor(
            f"{name}.out", (n, c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
        )
        return self.op(name, [x], out)

    def global_pool_fc(self, x: str, classes: int) -> str:
        n, c, _, _ = self.shapes[x]
        pooled = self.op("avgpool", [x], self.tensor("avgpool.out", (n, c, 1, 1)))
        flat = self.op("flatten", [pooled], self.tensor("flatten.out", (n, c), view_of=pooled))
        return self.linear(flat, classes, "fc")

    def linear(self, x: str, features: int, name: str) -> str:
        *lead, cin = self.shapes[x]
        weight = self.tensor(f"{name}.weight", (cin, features), weight=True)
        bias = self.tensor(f"{name}.bias", (features,), weight=True)
        out = self.tensor(f"{name}.out", (*lead, features))
        return self.op(name, [x, weight, bias], out)

    def graph(self, outputs: list[str]) -> Graph:
        return Graph.build(self.name, self.tensors, self.ops, self.inputs, outputs)


def resnet50(*, batch: int = 1, image_size: int = 224, dtype: str = "float32") -> Graph:
    """ResNet-50 for inference: 53 convolutions in 16 bottleneck blocks, then pooling and a
    1000-way classifier."""
    b = _Builder("resnet50", dtype)
    x = b.input("input", (batch, 3, image_size, image_size))
    x = b.unary(b.conv(x, 64, 7, 2, "conv1"), "conv1.relu")
    x = b.pool(x, 3, 2, "maxpool")
    cin = 64
    for stage, (width, blocks, stride) in enumerate(
        [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1
    ):
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            s = stride if block == 0 else 1
            identity = x
            y = b.unary(b.conv(x, width, 1, 1, f"{p}.conv1"), f"{p}.relu1")
            y = b.unary(b.conv(y, width, 3, s, f"{p}.conv2"), f"{p}.relu2")
            y = b.conv(y, width * 4, 1, 1, f"{p}.conv3")
            if block == 0 and (s != 1 or cin != width * 4):
                identity = b.conv(x, width * 4, 1, s, f"{p}.downsample")
            y = b.add(y, identity, f"{p}.add")
            x = b.unary(y, f"{p}.relu3")
            cin = width * 4
    return b.graph([b.global_pool_fc(x, 1000)])


def mobilenet_v2(*, batch: int = 1, image_size: int = 224, dtype: str = "float32") -> Graph:
    """MobileNetV2 1.0 for inference: 17 inverted-residual blocks, then a 1280-channel
    convolution, pooling and a 1000-way classifier."""
    b = _Builder("mobilenet_v2", dtype)
    x = b.input("input", (batch, 3, image_size, image_size))
    x = b.unary(b.conv(x, 32, 3, 2, "features.0"), "features.0.relu6")
    cin = 32
    index = 1
    for t, c, n, s in [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]:
        for i in range(n):
            p = f"features.{index}"
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = b.unary(b.conv(y, hidden, 1, 1, f"{p}.expand"), f"{p}.expand.relu6")
            y = b.unary(b.conv(y, hidden, 3, stride, f"{p}.dw", groups=hidden), f"{p}.dw.relu6")
            y = b.conv(y, c, 1, 1, f"{p}.project")
            if stride == 1 and cin == c:
                y = b.add(y, x, f"{p}.add")
            x = y
            cin = c
            index += 1
    x = b.unary(b.conv(x, 1280, 1, 1, f"features.{index}"), f"features.{index}.relu6")
    return b.graph([b.global_pool_fc(x, 1000)])


def bert_base(
    *, batch: int = 1, seq_len: int = 128, layers: int = 12, dtype: str = "float32"
) -> Graph:
    """A stack of `layers` BERT-base encoder layers on embeddings of `seq_len` tokens
    (inputs: the embeddings and the additive attention mask)."""
    hidden, heads, ffn = 768, 12, 3072
    head_dim = hidden // heads
    b = _Builder("bert_base", dtype)
    x = b.input("embeddings", (batch, seq_len, hidden))
    mask = b.input("attention_mask", (batch, 1, 1, seq_len))
    for layer in range(layers):
        p = f"layer{layer}"
        q = b.linear(x, hidden, f"{p}.query")
        k = b.linear(x, hidden, f"{p}.key")
        v = b.linear(x, hidden, f"{p}.value")
        heads_shape = (batch, heads, seq_len, head_dim)
        qh = b.op(f"{p}.query.heads", [q], b.tensor(f"{p}.query.heads.out", heads_shape))
        kt = b.op(
            f"{p}.key.heads_t",
            [k],
            b.tensor(f"{p}.key.heads_t.out", (batch, heads, head_dim, seq_len)),
        )
        vh = b.op(f"{p}.value.heads", [v], b.tensor(f"{p}.value.heads.out", heads_shape))
        scores = b.op(
            f"{p}.scores",
            [qh, kt],
            b.tensor(f"{p}.scores.out", (batch, heads, seq_len, seq_len)),
        )
        scores = b.unary(scores, f"{p}.scale")
        scores = b.add(scores, mask, f"{p}.mask")
        probs = b.unary(scores, f"{p}.softmax")
        ctx = b.op(f"{p}.context", [probs, vh], b.tensor(f"{p}.context.out", heads_shape))
        merged = b.op(
            f"{p}.context.merge",
            [ctx],
            b.tensor(f"{p}.context.merge.out", (batch, seq_len, heads, head_dim)),
        )
        flat = b.op(
            f"{p}.context.flatten",
            [merged],
            b.tensor(f"{p}.context.flatten.out", (batch, seq_len, hidden), view_of=merged),
        )
        attn = b.add(b.linear(flat, hidden, f"{p}.attention.output"), x, f"{p}.attention.add")
        x1 = b.op(
            f"{p}.attention.norm", [attn], b.tensor(f"{p}.attention.norm.out", b.shapes[attn])
        )
        h = b.unary(b.linear(x1, ffn, f"{p}.intermediate"), f"{p}.gelu")
        out = b.add(b.linear(h, hidden, f"{p}.output"), x1, f"{p}.output.add")
        x = b.op(f"{p}.output.norm", [out], b.tensor(f"{p}.output.norm.out", b.shapes[out]))
    return b.graph([x])


NETWORKS: dict[str, Callable[..., Graph]] = {
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "bert_base": bert_base,
}
"""The networks by name."""
