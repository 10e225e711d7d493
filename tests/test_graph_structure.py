"""Graph-level facts: node count independent of the expert count, dtype builds pass the ONNX
checker with the source's FP32 islands, f16 runs in onnxruntime CPU close to the reference."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

import mobius_lite
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import RELEASE_COSINE, RELEASE_NRMSE, compare
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.run.decoder_session import DecoderSession
from reference_fixtures.nemotron_reference import TINY_BASE, make_reference, pinned_torch

PATTERN = ("mamba", "moe", "attention", "moe", "mlp")


def op_histogram(model: ir.Model) -> Counter:
    counts: Counter = Counter()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        counts[node.op_type] += 1
    return counts


def tiny_moe(experts: int) -> NemotronHConfig:
    return NemotronHConfig(
        **{
            **TINY_BASE,
            "layers_block_type": PATTERN,
            "n_routed_experts": experts,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 8,
            "n_group": 4,
            "topk_group": 2,
        }
    )


def test_node_count_does_not_grow_with_experts() -> None:
    histograms = {e: op_histogram(build_decoder(tiny_moe(e))[0]) for e in (8, 64, 512)}
    assert histograms[8] == histograms[64] == histograms[512]
    assert histograms[8]["Loop"] == 2  # one gathered-expert loop per MoE layer


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_low_precision_graphs_pass_the_checker(precision: str, tmp_path: Path) -> None:
    reference = make_reference(dict(layers_block_type=list(PATTERN)))
    reference.save_pretrained(tmp_path / "ckpt")
    ep = "cuda" if precision == "bf16" else "cpu"  # onnxruntime CPU has no bf16 kernels
    out = mobius_lite.build(tmp_path / "ckpt", dtype=precision, ep=ep).save(tmp_path / "pkg")
    onnx.checker.check_model(str(out / "model.onnx"), full_check=True)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    want = onnx.TensorProto.FLOAT16 if precision == "f16" else onnx.TensorProto.BFLOAT16
    dtypes = {
        t.name: t.data_type
        for t in model.graph.initializer
        if t.name.startswith(("backbone", "lm_head"))
    }
    router = {n for n in dtypes if ".gate." in n}
    assert router and all(dtypes[n] == onnx.TensorProto.FLOAT for n in router)  # router stays FP32
    assert all(dtypes[n] == want for n in dtypes if n not in router)
    states = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert states["past_key_values.0.recurrent_state"] == onnx.TensorProto.FLOAT  # SSM state FP32
    assert states["past_key_values.0.conv_state"] == want
    assert states["past_key_values.2.key"] == want
    logits = next(o for o in model.graph.output if o.name == "logits")
    assert logits.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_f16_runs_on_cpu_within_release_gates(tmp_path: Path) -> None:
    reference = make_reference(dict(layers_block_type=list(PATTERN)))
    reference.save_pretrained(tmp_path / "ckpt")
    package = mobius_lite.build(tmp_path / "ckpt", dtype="f16")
    out = package.save(tmp_path / "pkg")
    session = DecoderSession(out / "model.onnx")
    ids = np.random.default_rng(0).integers(3, 97, size=(1, 12))
    ours = session.step(ids)["logits"]
    with pinned_torch():
        expected = reference(torch.from_numpy(ids)).logits.float().numpy()
    result = compare("f16 logits", ours, expected)
    assert result.passes(RELEASE_NRMSE, RELEASE_COSINE), result
