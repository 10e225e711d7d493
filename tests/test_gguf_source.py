"""GGUF reading: the lazy index against gguf-py's own reader, split sets, bad inputs, the
metadata -> config reader against the transformers config, the name map against the
checkpoint, and the gguf-py-dequantized reference against transformers' logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import NemotronHConfig as HFNemotronHConfig
from transformers import NemotronHForCausalLM, PreTrainedTokenizerFast

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.gguf_metadata import config_from_checkpoint, config_from_gguf
from mobius_lite.enums import LayerKind
from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.models.nemotron_h_gguf import (
    LayoutTransform,
    ValueTransform,
    nemotron_h_gguf_mapping,
)
from mobius_lite.sources.gguf_file import GGUFCheckpoint
from mobius_lite.sources.gguf_tokenizer import gguf_tokenizer_files
from reference_fixtures.gguf_fixtures import (
    PRESET_GGUF_PY,
    PRESET_MIXED,
    build_bpe_tokenizer,
    dequantized_arrays,
    dequantized_state_dict,
    write_gguf,
)
from reference_fixtures.nemotron_reference import make_reference, pinned_torch

HYBRID = {"layers_block_type": ["mamba", "attention", "mlp", "mamba", "attention", "mlp"]}
# hidden 256 so that K / IQ super-blocks fit the input rows; the rest falls back like llama.cpp
HYBRID_WIDE = {
    "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
    "hidden_size": 256,
    "intermediate_size": 256,
    "head_dim": 64,
}
MOE = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "moe_latent_size": 16,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 2.5,
}
MOE_WIDE = {**MOE, "hidden_size": 256, "moe_latent_size": 256, "moe_intermediate_size": 256}

# fixed gate for "equal logits" (F32 storage; only ssm_a's -exp / log round trip rounds)
LOGIT_ATOL, LOGIT_RTOL = 1e-5, 1e-4


def _hf_json(model: NemotronHForCausalLM) -> dict[str, Any]:
    """The config as save_pretrained writes it (JSON round trip, infinities encoded)."""
    return json.loads(model.config.to_json_string())


def _write(tmp: Path, name: str, overrides: dict[str, Any], arch: str, types: dict, **kw: Any):
    model = make_reference(overrides, seed=kw.pop("seed", 0))
    files = write_gguf(tmp / f"{name}.gguf", model, arch, types, **kw)
    return model, files


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gguf")
    return {
        "wide": _write(tmp, "wide", HYBRID_WIDE, "nemotron_h", PRESET_MIXED),
        "moe_wide": _write(tmp, "moe_wide", MOE_WIDE, "nemotron_h_moe", PRESET_MIXED),
        "moe_py": _write(tmp, "moe_py", MOE, "nemotron_h_moe", PRESET_GGUF_PY),
        "hybrid_f32": _write(tmp, "hybrid_f32", HYBRID, "nemotron_h", {}),
        "moe_f32": _write(tmp, "moe_f32", MOE, "nemotron_h_moe", {}),
    }


# ----------------------------------------------------------------------------- reading
@pytest.mark.parametrize("key", ["wide", "moe_wide", "moe_py"])
def test_index_matches_gguf_reader(written: dict[str, Any], key: str) -> None:
    _, files = written[key]
    reader = gguf.GGUFReader(files[0])
    source = GGUFCheckpoint(files[0])
    assert source.names() == [t.name for t in reader.tensors]
    raw = files[0].read_bytes()
    for t in reader.tensors:
        block, type_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
        logical = tuple(int(d) for d in reversed(t.shape))
        assert source.ggml_type(t.name).name == t.tensor_type.name
        assert source.logical_shape(t.name) == logical
        assert source.byte_range(t.name) == (files[0], t.data_offset, t.n_bytes)
        info = source.info(t.name)
        assert info.nbytes == t.n_bytes
        data = source.read(t.name)
        assert isinstance(data, np.memmap)
        assert data.tobytes() == raw[t.data_offset : t.data_offset + t.n_bytes]
        assert data.tobytes() == np.asarray(t.data).tobytes()
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            assert info.shape == logical and data.shape == logical
            reference = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            np.testing.assert_array_equal(data.astype(np.float32), reference.reshape(logical))
        else:
            assert info.dtype == np.uint8
            assert info.shape == (*logical[:-1], logical[-1] // block * type_bytes)
    assert (
        source.metadata["general.architecture"] == reader.fields["general.architecture"].contents()
    )


def test_the_fixtures_cover_the_type_families(written: dict[str, Any]) -> None:
    seen = set()
    for key in ("wide", "moe_wide", "moe_py"):
        source = GGUFCheckpoint(written[key][1][0])
        seen |= {source.ggml_type(n).name for n in source.names()}
    expected = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K"}
    expected |= {"Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL"}
    assert expected <= seen, expected - seen


def test_split_set_is_found_from_any_part(tmp_path: Path) -> None:
    model = make_reference(MOE)
    single = write_gguf(tmp_path / "one.gguf", model, "nemotron_h_moe", PRESET_GGUF_PY)[0]
    parts = write_gguf(tmp_path / "many.gguf", model, "nemotron_h_moe", PRESET_GGUF_PY, split=6)
    assert len(parts) > 2 and parts[1].name.endswith(f"-00002-of-{len(parts):05d}.gguf")
    whole = GGUFCheckpoint(single)
    for given in (parts[0], parts[-1]):
        split = GGUFCheckpoint(given)
        assert split.files == parts
        assert split.names() == whole.names()
        assert split.metadata["general.architecture"] == "nemotron_h_moe"
        for part in parts:
            for t in gguf.GGUFReader(part).tensors:
                assert split.byte_range(t.name) == (part, t.data_offset, t.n_bytes)
                assert split.read(t.name).tobytes() == whole.read(t.name).tobytes()
    parts[2].unlink()
    with pytest.raises(CheckpointError, match=f"missing: {parts[2]}"):
        GGUFCheckpoint(parts[0])


# ----------------------------------------------------------------------------- bad inputs
def test_truncated_files(tmp_path: Path, written: dict[str, Any]) -> None:
    good = written["hybrid_f32"][1][0]
    data = good.read_bytes()
    last = gguf.GGUFReader(good).tensors[-1].name
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-64])
    with pytest.raises(CheckpointError, match=f"truncated GGUF file: tensor {last} ends"):
        GGUFCheckpoint(cut)
    cut.write_bytes(data[:200])
    with pytest.raises(CheckpointError, match="truncated or corrupt GGUF header"):
        GGUFCheckpoint(cut)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        GGUFCheckpoint(path)
    with pytest.raises(CheckpointError, match="no such GGUF file"):
        GGUFCheckpoint(tmp_path / "absent.gguf")


def test_unsupported_tensor_types_are_named(tmp_path: Path) -> None:
    model = make_reference(HYBRID)
    extra = {"blk.0.extra.weight": np.zeros((2, 4), dtype=np.int32)}
    path = write_gguf(tmp_path / "i32.gguf", model, "nemotron_h", {}, extra_tensors=extra)[0]
    with pytest.raises(CheckpointError, match=r"tensor blk\.0\.extra\.weight has ggml type I32"):
        GGUFCheckpoint(path)

    # a type id no ggml version defines: patch the type field of one tensor in place
    path = write_gguf(tmp_path / "bad.gguf", model, "nemotron_h", {})[0]
    tensor = gguf.GGUFReader(path).tensors[3]
    offset = tensor.field.offset + sum(int(p.nbytes) for p in tensor.field.parts[:4])
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = np.uint32(99).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=f"tensor {tensor.name} has ggml type unknown type id 99"
    ):
        GGUFCheckpoint(path)


# ----------------------------------------------------------------------------- config
CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "ssm_state_size",
    "mamba_num_heads",
    "mamba_head_dim",
    "n_groups",
    "conv_kernel",
    "use_conv_bias",
    "tie_word_embeddings",
)
MOE_FIELDS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "n_shared_experts",
    "moe_latent_size",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
)


@pytest.mark.parametrize("key", ["hybrid_f32", "moe_f32", "moe_wide"])
def test_config_from_gguf_equals_the_transformers_config(written: dict[str, Any], key) -> None:
    model, files = written[key]
    hf = model.config
    source = GGUFCheckpoint(files[0])
    ours = NemotronHConfig.from_dict(config_from_checkpoint(source))
    reference = NemotronHConfig.from_dict(_hf_json(model))
    assert ours.pattern == reference.pattern
    fields = CONFIG_FIELDS + (MOE_FIELDS if LayerKind.MOE in ours.layers_block_type else ())
    if LayerKind.MLP in ours.layers_block_type:
        fields += ("intermediate_size",)
    for field in fields:
        assert getattr(ours, field) == getattr(hf, field), field
    assert np.float32(ours.layer_norm_epsilon) == np.float32(hf.layer_norm_epsilon)
    assert ours.max_position_embeddings == 2**20  # the converter's no-RoPE placeholder

    # with config.json: every field equal, placeholders and defaults replaced
    full = NemotronHConfig.from_dict(config_from_checkpoint(source, _hf_json(model)))
    assert full == reference
    assert full.layers == reference.layers


def test_config_json_disagreement_is_named(written: dict[str, Any]) -> None:
    model, files = written["moe_f32"]
    source = GGUFCheckpoint(files[0])
    for field, value in (("ssm_state_size", 16), ("n_group", 1), ("routed_scaling_factor", 1.0)):
        bad = {**_hf_json(model), field: value}
        with pytest.raises(ConfigError, match=f"disagree on {field}: GGUF gives .* gives {value}"):
            config_from_checkpoint(source, bad)
    pattern = {**_hf_json(model)}
    pattern.pop("layers_block_type")
    pattern["hybrid_override_pattern"] = "MEM*"
    with pytest.raises(ConfigError, match="disagree on layers_block_type"):
        config_from_checkpoint(source, pattern)


def test_config_needs_the_llama_cpp_keys(written: dict[str, Any]) -> None:
    metadata = dict(GGUFCheckpoint(written["moe_f32"][1][0]).metadata)
    del metadata["nemotron_h_moe.expert_count"]
    with pytest.raises(ConfigError, match="nemotron_h_moe.expert_count"):
        config_from_gguf(metadata)
    with pytest.raises(ConfigError, match="general.architecture='llama'"):
        config_from_gguf({**metadata, "general.architecture": "llama"})


def test_tied_model_has_no_output_tensor(tmp_path: Path) -> None:
    model = make_reference({**HYBRID, "tie_word_embeddings": True})
    model.lm_head.weight = model.model.embeddings.weight
    path = write_gguf(tmp_path / "tied.gguf", model, "nemotron_h", {})[0]
    source = GGUFCheckpoint(path)
    assert "output.weight" not in source.names()
    assert config_from_checkpoint(source)["tie_word_embeddings"] is True
    names = {m.checkpoint_name for m in nemotron_h_gguf_mapping(source)}
    assert "lm_head.weight" not in names and "backbone.embeddings.weight" in names


# ----------------------------------------------------------------------------- name map
@pytest.mark.parametrize("key", ["hybrid_f32", "moe_f32"])
def test_name_map_covers_every_tensor_once(written: dict[str, Any], key: str) -> None:
    model, files = written[key]
    source = GGUFCheckpoint(files[0])
    mapping = nemotron_h_gguf_mapping(source)
    assert sorted(m.gguf_name for m in mapping) == sorted(source.names())
    targets = [m.checkpoint_name for m in mapping]
    assert len(set(targets)) == len(targets)

    # the checkpoint side is the saved checkpoint's names and shapes (backbone., stacked experts)
    original = {
        k.replace("model.", "backbone.", 1) if k.startswith("model.") else k: v.numpy()
        for k, v in model.state_dict().items()
    }
    assert {m.checkpoint_name: m.checkpoint_shape for m in mapping} == {
        k: tuple(v.shape) for k, v in original.items()
    }
    # applying the recorded transforms to the stored values gives the checkpoint values
    arrays, _ = dequantized_arrays(files[0])
    permuted = 0
    for m in mapping:
        stored = arrays[m.gguf_name][m.row_order()].reshape(m.checkpoint_shape)
        expected = original[m.checkpoint_name]
        if m.values is ValueTransform.NEGATED_EXP:
            expected = -np.exp(expected)
        np.testing.assert_array_equal(stored, expected, err_msg=m.gguf_name)
        permuted += m.layout is LayoutTransform.HEAD_ROW_PERMUTE
    attention = sum(k == "full_attention" for k in model.config.layers_block_type)
    assert attention and permuted == 2 * attention  # q and k of every attention layer


def test_unknown_tensors_are_listed_together(tmp_path: Path) -> None:
    model = make_reference(HYBRID)
    extra = {
        "blk.0.ssm_x.weight": np.ones((4, 32), dtype=np.float32),
        "rope_freqs.weight": np.ones((4,), dtype=np.float32),
    }
    path = write_gguf(tmp_path / "extra.gguf", model, "nemotron_h", {}, extra_tensors=extra)[0]
    with pytest.raises(CheckpointError, match=r"2 GGUF tensor\(s\).*blk\.0\.ssm_x\.weight.*rope"):
        nemotron_h_gguf_mapping(GGUFCheckpoint(path))


# ----------------------------------------------------------------------------- reference
@pytest.mark.parametrize("key", ["hybrid_f32", "moe_f32"])
def test_dequantized_reference_reproduces_the_logits(written: dict[str, Any], key: str) -> None:
    model, files = written[key]
    state = dequantized_state_dict(files[0])
    config = HFNemotronHConfig(**model.config.to_dict())
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    rebuilt = NemotronHForCausalLM(config).eval()
    rebuilt.load_state_dict(state, strict=True)
    ids = torch.tensor([[3, 17, 42, 5, 88, 9, 60, 1, 2, 71, 33]])
    with pinned_torch():
        expected = model(ids).logits
        actual = rebuilt(ids).logits
    torch.testing.assert_close(actual, expected, atol=LOGIT_ATOL, rtol=LOGIT_RTOL)


@pytest.mark.parametrize("key", ["wide", "moe_wide"])
def test_quantized_reference_loads_strictly(written: dict[str, Any], key: str) -> None:
    model, files = written[key]
    state = dequantized_state_dict(files[0])
    rebuilt = NemotronHForCausalLM(HFNemotronHConfig(**model.config.to_dict())).eval()
    rebuilt.load_state_dict(state, strict=True)
    with pinned_torch():
        logits = rebuilt(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


# ----------------------------------------------------------------------------- tokenizer
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hybrid Mamba2 and attention layers, 1234 tokens per second!",
    "state space models keep a state; attention keeps a cache",
    "naïve café — ünïcødé text ✓ and tabs\tand\nnew lines",
] * 4
TEXTS = [
    "The lazy fox keeps a state.",
    "  leading spaces and 98765 digits",
    "ünïcødé ✓ café\n\tindent",
    "<s>special tokens</s> stay whole",
    "unseen wörds zzqx",
]


def test_tokenizer_round_trip(tmp_path: Path) -> None:
    source = build_bpe_tokenizer(CORPUS, vocab_size=300)
    model = make_reference({**HYBRID, "vocab_size": 304})
    path = write_gguf(
        tmp_path / "tok.gguf",
        model,
        "nemotron_h",
        {},
        tokenizer=source,
        special_tokens={"pad": 0, "bos": 1, "eos": 2},
    )[0]
    checkpoint = GGUFCheckpoint(path)
    files = gguf_tokenizer_files(checkpoint.metadata)
    config = json.loads(files["tokenizer_config.json"])
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (
        "<s>",
        "</s>",
        "<pad>",
    )
    assert config["add_bos_token"] is True
    rebuilt = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    for text in TEXTS:
        assert rebuilt.encode(text).ids == source.encode(text).ids, text
        plain = source.encode(text, add_special_tokens=False).ids
        assert rebuilt.encode(text, add_special_tokens=False).ids == plain, text
    out = tmp_path / "tokenizer"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    loaded = PreTrainedTokenizerFast.from_pretrained(out)
    assert [loaded(t)["input_ids"] for t in TEXTS] == [source.encode(t).ids for t in TEXTS]
    derived = config_from_checkpoint(checkpoint)
    assert (derived["bos_token_id"], derived["eos_token_id"], derived["pad_token_id"]) == (1, 2, 0)
    assert derived["vocab_size"] == 304
    listed = {**_hf_json(model), "eos_token_id": [7, 2]}
    assert config_from_checkpoint(checkpoint, listed)["eos_token_id"] == [7, 2]
    with pytest.raises(ConfigError, match="disagree on eos_token_id: GGUF gives 2"):
        config_from_checkpoint(checkpoint, {**listed, "eos_token_id": 7})
