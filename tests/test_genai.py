"""onnxruntime-genai runs the exported text package: greedy tokens identical to transformers.

Also pins down, by experiment, what onnxruntime-genai does with hybrid caches whose shapes
differ between layers (docs/genai.md).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

import mobius_lite
from mobius_lite.configs.loader import load_text_config
from mobius_lite.enums import LayerKind
from mobius_lite.genai_config import genai_limitations
from reference_fixtures.nemotron_reference import make_reference, pinned_torch

# end-to-end: builds packages and runs them against their reference (`-m "not slow"`
# leaves them out of a quick run)
pytestmark = pytest.mark.slow

og = pytest.importorskip(
    "onnxruntime_genai",
    reason="onnxruntime-genai is not installed (pip install onnxruntime-genai); CI installs it",
)

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [5, 17, 33, 8, 61, 12, 40, 3, 77, 21, 9]
NEW_TOKENS = 8
PATTERNS = {
    "hybrid": ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"],
    "attention_only": ["full_attention", "mlp", "full_attention", "moe"],
    "mamba_only": ["linear_attention", "mlp", "linear_attention", "moe"],
}


def _export(root: Path, pattern: list[str], seed: int = 0):
    model = make_reference(dict(layers_block_type=pattern), seed=seed)
    model.save_pretrained(root / "checkpoint")
    package = mobius_lite.build(root / "checkpoint").save(root / "package", quiet=True)
    return model, root / "checkpoint", package


def _load_example():
    """The shipped example, imported so tests drive onnxruntime-genai through its code."""
    spec = importlib.util.spec_from_file_location(
        "generate_with_genai", ROOT / "examples" / "generate_with_genai.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


genai_generate = _load_example().generate


def transformers_greedy(model, prompt: list[int], new_tokens: int, cached: bool) -> list[int]:
    """transformers' greedy generate, or (models without attention, which its generate cannot
    run: it asks the cache for a sequence length only attention layers have) the same greedy
    loop recomputing the whole sequence each step without any cache."""
    with pinned_torch():
        ids = torch.tensor([prompt])
        if cached:
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
            )
            return out[0, len(prompt) :].tolist()
        tokens: list[int] = []
        for _ in range(new_tokens):
            logits = model(ids, use_cache=False).logits[0, -1]
            tokens.append(int(logits.argmax()))
            ids = torch.cat([ids, torch.tensor([[tokens[-1]]])], dim=1)
        return tokens


@pytest.mark.parametrize("name", list(PATTERNS))
def test_genai_greedy_matches_transformers(name: str, tmp_path: Path) -> None:
    pattern = PATTERNS[name]
    model, _, package = _export(tmp_path, pattern)
    ours = genai_generate(package, PROMPT, NEW_TOKENS)
    expected = transformers_greedy(model, PROMPT, NEW_TOKENS, cached=name != "mamba_only")
    assert len(expected) == NEW_TOKENS  # no early end of sequence: every step is checked
    assert ours == expected


def test_genai_config_describes_the_graph(tmp_path: Path) -> None:
    """Every cache input and output of the graph is named by one of the config's templates,
    at its global layer index, and the model type is one onnxruntime-genai accepts."""
    _, _, package = _export(tmp_path, PATTERNS["hybrid"])
    config = json.loads((package / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "decoder"
    assert config["search"]["past_present_share_buffer"] is False
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    # An input with an initializer is optional (that is its default); genai feeds the rest.
    defaults = {t.name: t for t in proto.graph.initializer}
    inputs = {i.name for i in proto.graph.input} - {"input_ids", "attention_mask"}
    optional = {name for name in inputs if name in defaults}
    assert optional == {"logits_to_keep"}
    assert onnx.numpy_helper.to_array(defaults["logits_to_keep"]) == 0  # 0: every position
    inputs -= optional
    outputs = {o.name for o in proto.graph.output} - {"logits"}
    described_in = {
        decoder["inputs"][key] % layer
        for key in ("past_key_names", "past_value_names")
        for layer in (2,)
    } | {
        decoder["inputs"][key] % layer
        for key in ("past_conv_names", "past_recurrent_names")
        for layer in (0, 4)
    }
    described_out = {
        decoder["outputs"][key] % layer
        for key in ("present_key_names", "present_value_names")
        for layer in (2,)
    } | {
        decoder["outputs"][key] % layer
        for key in ("present_conv_names", "present_recurrent_names")
        for layer in (0, 4)
    }
    assert inputs == described_in
    assert outputs == described_out
    assert decoder["num_hidden_layers"] == len(PATTERNS["hybrid"])


def test_example_script_generates(tmp_path: Path) -> None:
    model, checkpoint, _ = _export(tmp_path, PATTERNS["hybrid"], seed=1)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "generate_with_genai.py"),
            str(checkpoint),
            "--output",
            str(tmp_path / "example-package"),
            "--prompt-ids",
            ",".join(map(str, PROMPT)),
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = transformers_greedy(model, PROMPT, 4, cached=True)
    assert f"new tokens: {expected}" in result.stdout


# --------------------------------------------------------------------------- schema limits
def _genai_error(package: Path) -> str:
    try:
        genai_generate(package, [1, 2, 3], 3)
    except Exception as exc:  # onnxruntime-genai raises RuntimeError from C++
        return str(exc)
    return "ok"


def _puzzle_package(root: Path, uniform_mamba: bool):
    """The heterogeneous Puzzle fixture (per-layer attention heads, MoE shapes, Mamba heads);
    with uniform_mamba its Mamba layers are given the global Mamba sizes."""
    from reference_fixtures.puzzle_fixtures import (
        HETEROGENEOUS_BLOCKS,
        puzzle_raw_config,
        write_puzzle_checkpoint,
    )

    blocks = [
        {"block_type": "mamba"} if uniform_mamba and b["block_type"] == "mamba" else dict(b)
        for b in HETEROGENEOUS_BLOCKS
    ]
    raw = puzzle_raw_config(blocks)
    checkpoint, model = write_puzzle_checkpoint(raw, root / "checkpoint")
    package = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    return model.float().eval(), load_text_config(raw), package


def test_genai_runs_puzzle_with_per_layer_attention_heads(tmp_path: Path) -> None:
    model, config, package = _puzzle_package(tmp_path, uniform_mamba=True)
    attention = [layer.attention for layer in config.layers if layer.kind is LayerKind.ATTENTION]
    heads = {(a.num_kv_heads, a.head_dim) for a in attention}
    assert len(heads) > 1  # the attention layers really differ
    assert genai_limitations(config) == []
    expected = transformers_greedy(model, PROMPT, NEW_TOKENS, cached=True)
    assert len(expected) == NEW_TOKENS
    assert genai_generate(package, PROMPT, NEW_TOKENS) == expected


def test_genai_cannot_run_per_layer_mamba_shapes_and_says_so(tmp_path: Path) -> None:
    """onnxruntime-genai 0.18 gives every Mamba layer the first one's state shape, so a Puzzle
    package whose Mamba layers differ fails at the first call; genai_limitations names it."""
    _, config, package = _puzzle_package(tmp_path, uniform_mamba=False)
    problems = genai_limitations(config)
    assert [p.split()[1] for p in problems] == ["conv_state", "recurrent_state"]
    message = _genai_error(package)
    assert "invalid dimensions" in message and "conv_state" in message


# --------------------------------------------------------------------------- MtpGenerator
_example = _load_example()
genai_generate_mtp = _example.generate_mtp
# onnxruntime-genai 0.18's MtpGenerator on the CPU provider: its host argmax of the decoder's
# logits casts them to float32 with the CPU Cast, which refuses a float32 -> float32 cast.
CPU_FLOAT32_LOGITS_REFUSAL = "Cast - input and output types are the same"


@pytest.fixture(scope="module")
def head_package(tmp_path_factory: pytest.TempPathFactory):
    from reference_fixtures.mtp_fixtures import write_nemotron_h_mtp_checkpoint

    root = tmp_path_factory.mktemp("genai_mtp")
    checkpoint, model, _ = write_nemotron_h_mtp_checkpoint(root / "checkpoint")
    package = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    expected = transformers_greedy(model, PROMPT, NEW_TOKENS, cached=True)
    assert len(expected) == NEW_TOKENS
    return package, expected


def test_genai_config_carries_the_mtp_section(head_package) -> None:
    """model.mtp and the head's overlay name tensors mtp.onnx / model.onnx really have."""
    package, _ = head_package
    config = json.loads((package / "genai_config.json").read_text())
    mtp = config["model"]["mtp"]
    decoder = onnx.load(str(package / "model.onnx"), load_external_data=False).graph
    head = onnx.load(str(package / "mtp.onnx"), load_external_data=False).graph
    decoder_outputs = {o.name for o in decoder.output}
    head_inputs = {i.name for i in head.input}
    head_outputs = {o.name for o in head.output}
    assert mtp["filename"] == "mtp.onnx"
    assert config["speculative"] == {"max_draft_tokens": 1}  # the head's depth
    assert mtp["main_hidden_states"] in decoder_outputs
    assert config["model"]["decoder"]["outputs"]["hidden_states"] == mtp["main_hidden_states"]
    assert mtp["outputs"]["hidden_states"] in head_outputs  # chained drafts feed it back
    assert mtp["inputs"]["hidden_states"] in head_inputs
    assert mtp["inputs"]["past_key_names"] % 0 in head_inputs
    assert mtp["outputs"]["present_value_names"] % 0 in head_outputs
    key = next(i for i in head.input if i.name == mtp["inputs"]["past_key_names"] % 0)
    dims = [d.dim_value for d in key.type.tensor_type.shape.dim]
    assert (dims[1], dims[3]) == (mtp["num_key_value_heads"], mtp["head_size"])
    overlay = json.loads((package / "genai_mtp_overlay.json").read_text())["model"]["decoder"]
    assert overlay["filename"] == "mtp.onnx"
    named = {v % 0 if "%d" in v else v for v in overlay["inputs"].values()}
    assert named & head_inputs == {
        "input_ids",
        "attention_mask",
        "hidden_states",
        mtp["inputs"]["past_key_names"] % 0,
        mtp["inputs"]["past_value_names"] % 0,
    }


def test_mtp_generator_refuses_float32_logits_on_cpu(head_package) -> None:
    """0.18 loads both models and builds the MtpGenerator, then fails at the prompt: every
    package returns float32 logits (docs/genai.md says what is missing)."""
    package, _ = head_package
    with pytest.raises(RuntimeError) as refusal:
        genai_generate_mtp(package, PROMPT, NEW_TOKENS, 1)
    assert str(refusal.value) == CPU_FLOAT32_LOGITS_REFUSAL


def _with_float16_logits(package: Path, destination: Path) -> Path:
    """A copy of the package whose decoder casts its logits to float16 (one Cast node), the
    one element type 0.18's CPU path casts from; nothing else changes."""
    import shutil

    from onnx import TensorProto, helper

    shutil.copytree(package, destination)
    proto = onnx.load(str(destination / "model.onnx"), load_external_data=False)
    for node in proto.graph.node:
        node.output[:] = ["logits_float32" if o == "logits" else o for o in node.output]
    proto.graph.node.append(
        helper.make_node("Cast", ["logits_float32"], ["logits"], to=TensorProto.FLOAT16)
    )
    logits = next(o for o in proto.graph.output if o.name == "logits")
    logits.type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.save(proto, str(destination / "model.onnx"))
    return destination


@pytest.mark.parametrize("draft_tokens", [None, 3])
def test_mtp_generator_gives_the_plain_greedy_tokens(
    head_package, tmp_path: Path, draft_tokens: int
) -> None:
    """With the decoder's logits in float16 (the test's one-node edit), 0.18's MtpGenerator runs
    the hybrid package as the config describes it: drafts from mtp.onnx, verification with
    Mamba state snapshots, and transformers' greedy tokens (rejections included)."""
    package, expected = head_package
    edited = _with_float16_logits(package, tmp_path / "f16-logits")
    tokens, stats = genai_generate_mtp(edited, PROMPT, NEW_TOKENS, draft_tokens)
    assert tokens == expected
    assert stats["draft_forward_passes"] > 0  # the head drafted
    assert stats["correction_tokens"] > 0  # and was rejected at least once: a state restore
    # None: the package's speculative.max_draft_tokens (1, the head's depth), not genai's 4
    per_round = 1 if draft_tokens is None else draft_tokens
    assert stats["draft_tokens_proposed"] <= per_round * stats["rounds"]
    assert stats["draft_tokens_proposed"] > (per_round - 1) * stats["rounds"]


def test_mtp_generator_drafts_the_lightning_depth_by_default(tmp_path: Path) -> None:
    """A Nemotron 3.5 Lightning-style package (depth 2 over one depth of weights): its
    genai_config makes MtpGenerator chain 2 drafts a round through mtp.onnx; tokens are
    transformers' greedy ones (float16 logits, as above)."""
    from reference_fixtures.mtp_fixtures import write_lightning_checkpoint

    checkpoint, model, _ = write_lightning_checkpoint(tmp_path / "checkpoint", "model.")
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    assert json.loads((package / "genai_config.json").read_text())["speculative"] == {
        "max_draft_tokens": 2
    }
    expected = transformers_greedy(model, PROMPT, NEW_TOKENS, cached=True)
    edited = _with_float16_logits(package, tmp_path / "f16-logits")
    tokens, stats = genai_generate_mtp(edited, PROMPT, NEW_TOKENS)
    assert tokens == expected
    assert stats["rounds"] < stats["draft_tokens_proposed"] <= 2 * stats["rounds"]


def test_mtp_generator_runs_depth_zero_of_distinct_depths(tmp_path: Path) -> None:
    """A head of two distinct depths (mtp_use_repeated_layer false): genai_config points
    MtpGenerator at depth 0 (mtp.onnx) with one draft a round, which it runs with
    transformers' greedy tokens (float16 logits, as above); mtp_depth1.onnx is not in it."""
    from reference_fixtures.mtp_fixtures import write_distinct_depths_checkpoint

    checkpoint, model, _ = write_distinct_depths_checkpoint(tmp_path / "checkpoint", "*E", 2)
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    config = json.loads((package / "genai_config.json").read_text())
    assert config["speculative"] == {"max_draft_tokens": 1}
    assert config["model"]["mtp"]["filename"] == "mtp.onnx"
    assert "mtp_depth1" not in json.dumps(config)
    expected = transformers_greedy(model, PROMPT, NEW_TOKENS, cached=True)
    assert genai_generate(package, PROMPT, NEW_TOKENS) == expected
    edited = _with_float16_logits(package, tmp_path / "f16-logits")
    tokens, stats = genai_generate_mtp(edited, PROMPT, NEW_TOKENS)
    assert tokens == expected
    assert 0 < stats["draft_tokens_proposed"] <= stats["rounds"]
