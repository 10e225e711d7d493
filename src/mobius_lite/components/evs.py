"""Efficient Video Sampling: the per-video token retention mask, computed in the graph.

Mirrors transformers' compute_retention_mask: every token of the first tubelet is kept; the
others are ranked by 1 - cosine(token, same position in the previous tubelet), and the top
max(P, int(T * P * (1 - rate))) are kept, equal scores going to the lower flat index (a stable
descending sort; ONNX TopK breaks ties the same way).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import FLOAT

INT64 = ir.DataType.INT64
DOUBLE = ir.DataType.DOUBLE

# The reference's score for first-tubelet tokens: above any 1 - cosine (at most 2).
FIRST_TUBELET_SCORE = 255.0
COSINE_EPS = 1e-8  # torch.nn.functional.cosine_similarity's default


def _rounding(op: OpBuilder, dtype: ir.DataType):
    """x -> x rounded to `dtype` and held in FP32: torch's half/bf16 ops compute in FP32 and
    round each result, so the scores (and their ties) match only with the same rounding."""
    if dtype == FLOAT:
        return lambda x: x
    return lambda x: op.Cast(op.Cast(x, to=dtype), to=FLOAT)


def _cosine(op: OpBuilder, x: ir.Value, y: ir.Value, dtype: ir.DataType) -> ir.Value:
    """torch.nn.functional.cosine_similarity over the last axis, as ATen computes it:
    sum((x / max(|x|, eps)) * (y / max(|y|, eps))), each step rounded to `dtype`."""
    r = _rounding(op, dtype)
    last = op.Constant(value_ints=[-1])
    eps = op.Constant(value=ir.tensor(COSINE_EPS, dtype=FLOAT))

    def unit(v: ir.Value) -> ir.Value:
        norm = op.Max(r(op.ReduceL2(v, last, keepdims=1)), eps)
        return r(op.Div(v, norm))

    return r(op.ReduceSum(r(op.Mul(unit(x), unit(y))), last, keepdims=0))


def retention_mask(
    op: OpBuilder,
    embeds: ir.Value,
    num_videos: ir.Value,
    num_tubelets: ir.Value,
    pruning_rate: float,
) -> ir.Value:
    """embeds [V * T * P, E] (each video's tubelets in order; the model dtype) -> bool
    [V * T * P], True for the tokens to keep. num_videos, num_tubelets: int64 [1]."""
    dtype = embeds.dtype
    r = _rounding(op, dtype)
    x = op.Cast(embeds, to=FLOAT) if dtype != FLOAT else embeds
    hidden = op.Shape(embeds, start=1, end=2)
    grid = op.Reshape(
        x, op.Concat(num_videos, num_tubelets, op.Constant(value_ints=[-1]), hidden, axis=0)
    )
    one = op.Constant(value_ints=[1])
    big = op.Constant(value_ints=[2**62])
    later = op.Slice(grid, one, big, one)
    earlier = op.Slice(grid, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), one)
    dissimilarity = r(
        op.Sub(op.Constant(value=ir.tensor(1.0, dtype=FLOAT)), _cosine(op, later, earlier, dtype))
    )

    first = op.Slice(grid, op.Constant(value_ints=[0]), one, one)  # [V, 1, P, E]
    first_scores = op.Expand(
        op.Constant(value=ir.tensor(FIRST_TUBELET_SCORE, dtype=FLOAT)),
        op.Shape(first, start=0, end=3),
    )
    scores = op.Concat(first_scores, dissimilarity, axis=1)  # [V, T, P]
    flat = op.Reshape(scores, op.Concat(num_videos, op.Constant(value_ints=[-1]), axis=0))

    per_tubelet = op.Shape(grid, start=2, end=3)
    total = op.Mul(num_tubelets, per_tubelet)
    # int(T * P * (1 - rate)) in double precision, as Python computes it
    evs_tokens = op.Cast(
        op.Floor(
            op.Mul(
                op.Cast(total, to=DOUBLE),
                op.Constant(value=ir.tensor([1.0 - pruning_rate], dtype=DOUBLE)),
            )
        ),
        to=INT64,
    )
    keep = op.Max(per_tubelet, evs_tokens)
    _, chosen = op.TopK(flat, keep, axis=-1, largest=1, sorted=1, _outputs=2)
    zeros = op.Mul(flat, op.Constant(value=ir.tensor(0.0, dtype=FLOAT)))
    ones = op.Add(
        op.Slice(zeros, op.Constant(value_ints=[0]), keep, one),
        op.Constant(value=ir.tensor(1.0, dtype=FLOAT)),
    )
    marked = op.ScatterElements(zeros, chosen, ones, axis=1)
    return op.Reshape(op.Cast(marked, to=ir.DataType.BOOL), op.Constant(value_ints=[-1]))
