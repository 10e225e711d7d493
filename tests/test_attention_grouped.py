"""The ort backend's attention (components/attention.py, grouped_attention: FusedMatMul over
grouped queries) against two independent references: attention in float64 numpy written from
the Attention op's definition (bottom-right causal after the past, a bool key mask, query head
h on kv head h // group, a row with no visible key giving zeros), and onnxruntime's own
opset-27 Attention op (the standard backend's node) on the same inputs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from formats.emit_harness import run_emitter
from mobius_lite.components.attention import grouped_attention
from mobius_lite.configs.layers import AttentionSpec
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare

SPEC = AttentionSpec(num_heads=8, num_kv_heads=2, head_dim=16)
CONTRIB = {"com.microsoft": 1}


def reference(q, k, v, key_mask, past_key, past_value) -> np.ndarray:
    keys = np.concatenate([past_key, k], axis=2).astype(np.float64)
    values = np.concatenate([past_value, v], axis=2).astype(np.float64)
    group = q.shape[1] // keys.shape[1]
    keys, values = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
    seq, total = q.shape[2], keys.shape[2]
    scores = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), keys) / np.sqrt(q.shape[-1])
    causal = np.arange(total)[None, :] <= np.arange(seq)[:, None] + (total - seq)
    visible = key_mask & causal  # [b, 1, seq, total]
    scores = np.where(visible, scores, -np.inf)
    top = np.where(visible.any(-1, keepdims=True), scores.max(-1, keepdims=True), 0)
    weights = np.where(visible, np.exp(scores - top), 0)
    total_weight = weights.sum(-1, keepdims=True)
    weights = np.divide(weights, total_weight, out=np.zeros_like(weights), where=total_weight > 0)
    return np.einsum("bhqk,bhkd->bhqd", weights, values)


def inputs(batch: int, past: int, seq: int, padded: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    h, kv, d = SPEC.num_heads, SPEC.num_kv_heads, SPEC.head_dim

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    key_mask = np.ones((batch, 1, 1, past + seq), dtype=bool)
    key_mask[-1, ..., :padded] = False  # the last row left-padded
    return [normal(batch, h, seq, d), normal(batch, kv, seq, d), normal(batch, kv, seq, d),
            key_mask, normal(batch, kv, past, d), normal(batch, kv, past, d)]  # fmt: skip


@pytest.mark.parametrize(
    ("batch", "past", "seq", "padded"),
    [(2, 0, 6, 3), (2, 5, 3, 2), (1, 40, 1, 0), (2, 7, 1, 4)],
    ids=["prefill-padded", "chunk-after-past", "decode", "decode-padded"],
)
def test_grouped_attention_is_the_attention_op(batch, past, seq, padded) -> None:
    arrays = inputs(batch, past, seq, padded, seed=batch + past + seq)

    def ours(op, *values):
        return grouped_attention(op, SPEC, *values)

    def onnx_op(op, q, k, v, mask, past_key, past_value):
        outs = op.Attention(q, k, v, mask, past_key, past_value, is_causal=1, _outputs=3,
                            scale=float(SPEC.head_dim**-0.5), softmax_precision=1)  # fmt: skip
        for value in outs:
            value.dtype = ir.DataType.FLOAT
        return outs

    y, present_key, present_value = run_emitter(ours, arrays, opset_imports=CONTRIB)
    expected = reference(*arrays)
    for got in (y, run_emitter(onnx_op, arrays)[0]):
        result = compare("attention", got, expected)
        assert result.passes(FP32_NRMSE, FP32_COSINE), result
    assert np.array_equal(present_key, np.concatenate([arrays[4], arrays[1]], axis=2))
    assert np.array_equal(present_value, np.concatenate([arrays[5], arrays[2]], axis=2))
    if padded > past:  # padded queries see no key: zeros, as the op's function body gives
        assert np.all(y[-1, :, : padded - past] == 0)
        assert np.any(y[-1, :, padded - past :] != 0)


def test_the_ort_backend_f32_decoder_uses_the_grouped_form() -> None:
    """f32 on the ort backend: FusedMatMul, no Attention node; the standard backend and f16
    keep the op (f16's softmax precision is the op's softmax_precision)."""
    from mobius_lite.components.context import BuildContext
    from mobius_lite.configs import NemotronHConfig
    from mobius_lite.enums import Backend
    from mobius_lite.graphs.decoder import build_decoder
    from reference_fixtures.nemotron_reference import TINY_BASE

    config = NemotronHConfig(**{**TINY_BASE, "layers_block_type": ["mamba", "attention"]})

    def ops(ctx: BuildContext) -> set[str]:
        return {node.op_type for node in build_decoder(config, ctx)[0].graph}

    assert {"FusedMatMul"} <= ops(BuildContext(ir.DataType.FLOAT, backend=Backend.ORT))
    assert "Attention" not in ops(BuildContext(ir.DataType.FLOAT, backend=Backend.ORT))
    assert "Attention" in ops(BuildContext(ir.DataType.FLOAT))
    assert "Attention" in ops(BuildContext(ir.DataType.FLOAT16, backend=Backend.ORT))
