"""The Omni package end to end: `mobius build` on a saved tiny transformers Omni checkpoint
(RADIO with registers and class tokens, EVS, a Parakeet audio tower, a hybrid text model) gives
separate graphs whose chained run (mobius_lite.run.omni_session) equals transformers'
NemotronH_Omni_Reasoning_V3 (torch FP32): image / video / audio features, the EVS mask, the merged
embeddings, and prefill + 5 cached decode steps (logits and every cache array within the
foundation gates, greedy tokens identical)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3_Config,
)
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3,
    compute_retention_mask,
)

from mobius_lite.cli.main import main
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.run.omni_session import Media, OmniSession, PlaceholderError
from mobius_lite.weights.binding import graph_parameters
from mobius_lite.weights.verify import verify_package
from omni_audio_fixtures import SMALL_AUDIO, WIDER_AUDIO
from reference_fixtures.nemotron_reference import (
    TINY_BASE,
    pinned_torch,
    randomize,
    reference_cache_arrays,
)
from reference_fixtures.omni_fixtures import TINY_VISION, pack_images, pack_video

# end-to-end: builds packages and runs them against their reference (`-m "not slow"`
# leaves them out of a quick run)
pytestmark = pytest.mark.slow

IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = 90, 91, 92
TEXT = {**TINY_BASE, "layers_block_type": ["mamba", "attention", "moe", "mamba"]}
STEPS = 5


def make_omni(
    audio: bool,
    final_layernorm: bool,
    rate: float,
    seed: int,
    audio_config: dict | None = None,
    text_overrides: dict | None = None,
) -> Any:
    """A tiny FP32 eager Omni model with every tensor non-trivial (LayerScale too);
    `text_overrides` change its text config (TEXT)."""
    text = {**TEXT, **(text_overrides or {}), "num_nextn_predict_layers": int(final_layernorm)}
    config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=dict(TINY_VISION),
        text_config=text,
        audio_config=dict(audio_config or SMALL_AUDIO) if audio else None,
        vision_hidden_size=TINY_VISION["hidden_size"],
        projector_hidden_size=40,
        downsample_ratio=0.5,
        video_pruning_rate=rate,
        video_temporal_patch_size=2,
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        audio_token_id=AUDIO_TOKEN if audio else None,
    )
    config._attn_implementation = "eager"
    config.text_config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = NemotronH_Omni_Reasoning_V3(config).eval()
    randomize(model.language_model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.startswith("language_model.") or name.endswith("num_batches_tracked"):
                continue
            if name.endswith(("running_var", "lambda1")):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
            elif name.endswith(("position_embedding", "cls_register_token")):
                tensor.copy_(torch.randn(tensor.shape, generator=gen))
            elif tensor.ndim == 1 and tensor.is_floating_point():
                base = 1.0 if name.endswith("weight") else 0.0
                tensor.copy_(base + 0.2 * torch.randn(tensor.shape, generator=gen))
            elif tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=gen) / tensor[0].numel() ** 0.5)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    root = tmp_path_factory.mktemp("omni")
    model = make_omni(audio=True, final_layernorm=True, rate=0.4, seed=0)
    model.save_pretrained(root / "checkpoint")
    code = main(["build", "--model", str(root / "checkpoint"), "--output", str(root / "pkg"), "-q"])
    assert code == 0
    return model, root / "checkpoint", root / "pkg"


def images(seed: int) -> tuple[np.ndarray, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    return pack_images(
        [torch.randn(3, 16, 24, generator=gen), torch.randn(3, 40, 24, generator=gen)]
    )


def prompt(placeholders: list[tuple[int, int]], seed: int) -> np.ndarray:
    """Text tokens around runs of placeholder tokens: (token, count) per run."""
    rng = np.random.default_rng(seed)
    ids: list[int] = [int(t) for t in rng.integers(3, 80, size=3)]
    for token, count in placeholders:
        ids += [token] * count + [int(t) for t in rng.integers(3, 80, size=2)]
    return np.array([ids], dtype=np.int64)


def gate(name: str, actual: np.ndarray, expected: np.ndarray) -> None:
    result = compare(name, actual, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


def drive(model: Any, session: OmniSession, ids: np.ndarray, media: Media, ref_kwargs: dict):
    """Prefill + STEPS cached greedy steps on both sides, each fed its own token."""
    kinds = [layer.kind for layer in session.config.text.layers]
    tokens_ours, tokens_ref = [], []
    with pinned_torch():
        prepared = session.prepare(ids, media)
        length = prepared.input_ids.shape[1]
        session.decoder.reset(1)
        ours = session.decoder.step(prepared.inputs_embeds)
        ref = model(input_ids=torch.from_numpy(ids), use_cache=True, **ref_kwargs)
        for step in range(STEPS + 1):
            gate(f"{step}/logits", ours["logits"], ref.logits.float().numpy())
            for name, expected in reference_cache_arrays(ref.cache, kinds).items():
                gate(f"{step}/{name}", ours[name], expected)
            tokens_ours.append(int(ours["logits"][0, -1].argmax()))
            tokens_ref.append(int(ref.logits[0, -1].argmax()))
            if step == STEPS:
                break
            length += 1
            ours = session.decoder.step(session.embed(np.array([[tokens_ours[-1]]])))
            ref = model(
                input_ids=torch.tensor([[tokens_ref[-1]]]),
                cache=ref.cache,
                use_cache=True,
                attention_mask=torch.ones(1, length, dtype=torch.long),
                position_ids=torch.tensor([[length - 1]]),
            )
    assert tokens_ours == tokens_ref
    return prepared


def test_package_layout_and_fidelity(exported) -> None:
    model, checkpoint, package = exported
    manifest = json.loads((package / "manifest.json").read_text())
    assert set(manifest["graphs"]) == {
        "decoder",
        "embedding",
        "vision_encoder",
        "video_encoder",
        "audio_encoder",
    }
    # save_pretrained writes the released layout (mlp1.*, sound_encoder.*, radio_model.*,
    # fused attn.qkv); every tensor is bound or unused with a reason, never silently dropped
    with safe_open(checkpoint / "model.safetensors", "np") as handle:
        stored = set(handle.keys())
    assert "mlp1.1.weight" in stored and any(n.endswith("attn.qkv.weight") for n in stored)
    assert set(manifest["sources"]) | set(manifest["unused"]) == stored
    assert any(n.endswith("layer_scale1.lambda1") for n in manifest["sources"])
    assert not any("lambda1" in n for n in manifest["unused"])
    # the towers are shared by the image and video graphs, written once
    assert manifest["shared"] and all(
        n.startswith(("vision_model.", "mlp1.", "vision_projector.")) for n in manifest["shared"]
    )
    assert all(set(r) == {"vision_encoder", "video_encoder"} for r in manifest["shared"].values())
    report = verify_package(package, checkpoint)
    assert report.ok, report.mismatches
    config = json.loads((package / "config.json").read_text())
    assert config["model_type"] == "nemotron_h_omni" and config["image_token_id"] == IMAGE_TOKEN


def test_two_images_match_transformers(exported) -> None:
    model, _, package = exported
    session = OmniSession(package)
    pixels, grid = images(1)
    tokens = [int(n) for n in grid.prod(-1) // 4]
    ids = prompt([(IMAGE_TOKEN, tokens[0]), (IMAGE_TOKEN, tokens[1])], seed=2)
    media = Media(pixel_values=pixels, image_grid_hw=grid)
    with pinned_torch():
        expected = model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid))
    prepared = drive(
        model,
        session,
        ids,
        media,
        dict(pixel_values=torch.from_numpy(pixels), image_grid_hw=torch.from_numpy(grid)),
    )
    gate(
        "image_features",
        prepared.features["image_features"],
        torch.cat(expected.pooler_output).numpy(),
    )
    # the merge: the reference's masked_scatter of our features is exactly our embeddings
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.from_numpy(ids))
        mask = torch.from_numpy(ids == IMAGE_TOKEN)[..., None].expand_as(embeds)
        merged = embeds.masked_scatter(mask, torch.from_numpy(prepared.features["image_features"]))
    np.testing.assert_array_equal(prepared.inputs_embeds, merged.numpy())
    # a step without media is the plain embedding lookup
    plain = session.embed(np.array([[5, 17]]))
    np.testing.assert_array_equal(
        plain[0], model.get_input_embeddings().weight[[5, 17]].detach().numpy()
    )


@pytest.mark.parametrize("frames", [5, 6])
def test_video_with_evs_matches_transformers(exported, frames: int) -> None:
    model, _, package = exported
    session = OmniSession(package)
    gen = torch.Generator().manual_seed(frames)
    videos = pack_video(torch.randn(frames, 3, 16, 16, generator=gen))
    tubelets = videos.shape[1]
    per_tubelet = (16 // 4) * (16 // 4) // 4
    ids = prompt([(IMAGE_TOKEN, tubelets * per_tubelet)], seed=frames)
    with pinned_torch():
        expected = model.get_video_features(torch.from_numpy(videos))
        (features,) = expected.pooler_output
        keep = compute_retention_mask(features, tubelets, model.video_pruning_rate).numpy()
    prepared = drive(
        model,
        session,
        ids,
        Media(pixel_values_videos=videos),
        dict(pixel_values_videos=torch.from_numpy(videos)),
    )
    np.testing.assert_array_equal(prepared.video_retention_mask, keep)
    assert prepared.input_ids.shape[1] == ids.shape[1] - int((~keep).sum())
    gate("video_features", prepared.features["image_features"], features.numpy()[keep])


@pytest.fixture(scope="module")
def exported_wider_audio(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """A second audio tower: another size, no attention bias, no input scaling."""
    root = tmp_path_factory.mktemp("omni-wider-audio")
    model = make_omni(True, False, 0.0, seed=9, audio_config=WIDER_AUDIO)
    model.save_pretrained(root / "checkpoint")
    assert (
        main(["build", "--model", str(root / "checkpoint"), "--output", str(root / "pkg"), "-q"])
        == 0
    )
    return model, root / "checkpoint", root / "pkg"


@pytest.mark.parametrize("which", ["exported", "exported_wider_audio"])
def test_two_audio_clips_match_transformers(which: str, request: pytest.FixtureRequest) -> None:
    model, _, package = request.getfixturevalue(which)
    session = OmniSession(package)
    rng = np.random.default_rng(3)
    bins = model.config.audio_config.num_mel_bins
    features = rng.standard_normal((2, 48, bins)).astype(np.float32)
    mask = np.zeros((2, 48), dtype=np.int64)
    mask[0, :48] = 1
    mask[1, :29] = 1
    with pinned_torch():
        expected = model.get_audio_features(torch.from_numpy(features), torch.from_numpy(mask))
    rows = expected.pooler_output.shape[0]
    first = int(model.audio_tower._get_subsampling_output_length(torch.tensor(49)))
    ids = prompt([(AUDIO_TOKEN, first), (AUDIO_TOKEN, rows - first)], seed=4)
    media = Media(input_features=features, input_features_mask=mask)
    prepared = drive(
        model,
        session,
        ids,
        media,
        dict(input_features=torch.from_numpy(features), input_features_mask=torch.from_numpy(mask)),
    )
    gate("audio_features", prepared.features["audio_features"], expected.pooler_output.numpy())


def test_placeholder_mismatch_is_one_clear_error(exported) -> None:
    _, _, package = exported
    session = OmniSession(package)
    pixels, grid = images(1)
    ids = prompt([(IMAGE_TOKEN, 3)], seed=5)
    rows = int((grid.prod(-1) // 4).sum())  # 2 x 2 pixel shuffle: a token per 4 patches
    with pytest.raises(
        PlaceholderError, match=rf"3 image placeholder tokens .* gives {rows} feature rows"
    ):
        session.prepare(ids, Media(pixel_values=pixels, image_grid_hw=grid))


def test_a_generated_placeholder_token_keeps_its_table_row(exported) -> None:
    """A random model may generate a placeholder id: fed back with no media, it is embedded
    as transformers' generation steps embed it (its row of the table), not refused by the
    embedding graph's scatter."""
    model, _, package = exported
    session = OmniSession(package)
    table = model.get_input_embeddings().weight.detach().numpy()
    for token in (IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN, 5):
        embedded = session.embed_token(token)
        assert embedded.shape == (1, 1, table.shape[1])
        np.testing.assert_array_equal(embedded[0, 0], table[token])


def test_puzzle_text_config_builds_the_puzzle_decoder(tmp_path: Path) -> None:
    """A Puzzle text config inside an Omni config gives a decoder with per-layer topology."""
    from mobius_lite.configs.omni import OmniConfig
    from mobius_lite.configs.puzzle import NemotronHPuzzleConfig
    from reference_fixtures.puzzle_fixtures import HETEROGENEOUS_BLOCKS, puzzle_raw_config

    text = puzzle_raw_config(HETEROGENEOUS_BLOCKS)
    text.pop("model_type")
    raw = {
        "model_type": "nemotron_h_omni",
        "llm_config": text,  # released spelling
        "vision_config": dict(TINY_VISION),
        "vit_hidden_size": TINY_VISION["hidden_size"],
        "img_context_token_id": 3,
    }
    config = OmniConfig.from_dict(raw)
    assert isinstance(config.text, NemotronHPuzzleConfig)
    direct = NemotronHPuzzleConfig.from_dict(puzzle_raw_config(HETEROGENEOUS_BLOCKS))
    assert config.text.layers == direct.layers
    decoder, _ = build_decoder(config.text, inputs_embeds=True)
    assert [i.name for i in decoder.graph.inputs][0] == "inputs_embeds"
    assert graph_parameters(decoder).keys() == graph_parameters(build_decoder(direct)[0]).keys() - {
        "backbone.embeddings.weight"
    }


def test_onnxruntime_genai_runs_text_prompts_of_the_omni_package(exported) -> None:
    """genai_config.json uses genai's VLM layout (phi3v type, vision + embedding sections):
    onnxruntime-genai chains embedding -> decoder for a text prompt, with the same greedy tokens
    as the package's own host runtime."""
    import onnxruntime_genai as og

    _, _, package = exported
    config = json.loads((package / "genai_config.json").read_text())["model"]
    assert config["type"] == "phi3v" and set(config) >= {"vision", "embedding", "decoder"}
    assert "inputs_embeds" in config["decoder"]["inputs"]
    prompt_ids = np.array([[5, 17, 33, 8]], dtype=np.int64)
    ours, _ = OmniSession(package).generate(prompt_ids, None, max_new_tokens=6)

    model = og.Model(str(package))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt_ids.shape[1] + len(ours), do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt_ids.astype(np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    assert tokens == ours


def test_qualify_gives_four_verdicts_for_the_omni_package(exported, tmp_path: Path) -> None:
    from mobius_lite.evaluation.qualify import qualify, rescore

    _, checkpoint, package = exported
    report = qualify(package, checkpoint, steps=2, output=tmp_path / "q")
    statuses = {k: v.status for k, v in report.verdicts.items()}
    assert statuses == dict.fromkeys(statuses, "PASS"), {
        k: v.summary for k, v in report.verdicts.items()
    }
    families = report.verdicts["numerical_parity"].evidence["families"]
    assert {"logits", "attention_kv", "conv_state", "recurrent_state"} <= set(families)
    names = {c["name"] for c in report.verdicts["numerical_parity"].evidence["worst"]} | {
        k for k in np.load(tmp_path / "q" / "arrays.npz").files
    }
    assert {"package/prefill/image_features", "package/prefill/video_features"} <= names
    assert "package/prefill/audio_features" in names
    assert report.run["omni"]["evs_mask_equal"]
    again = rescore(tmp_path / "q")
    assert {k: v.status for k, v in again.verdicts.items()} == statuses


def test_qualify_catches_a_changed_vision_weight(exported, tmp_path: Path) -> None:
    import shutil

    from mobius_lite.evaluation.qualify import qualify
    from mobius_lite.weights.external_data import external_references

    _, checkpoint, package = exported
    broken = tmp_path / "pkg"
    shutil.copytree(package, broken)
    ref = next(
        r
        for r in external_references(broken / "vision_encoder.onnx")
        if r.name.endswith("mlp.fc1.weight")
    )
    with open(broken / ref.location, "r+b") as handle:
        handle.seek(ref.offset)
        values = np.frombuffer(handle.read(64), np.float32) * 3.0
        handle.seek(ref.offset)
        handle.write(values.tobytes())
    report = qualify(broken, checkpoint, steps=1, output=tmp_path / "q", quiet=True)
    assert report.verdicts["graph_validity"].status == "PASS"
    assert report.verdicts["source_fidelity"].status == "FAIL"
    assert report.verdicts["numerical_parity"].status == "FAIL"


def test_build_from_module_binds_the_transformers_names(exported, tmp_path: Path) -> None:
    """An in-memory Omni model names its tensors the transformers way (q_proj / k_proj /
    v_proj, multi_modal_projector, audio_tower, language_model.model.*); the package built from
    it holds exactly the bytes of the one built from save_pretrained's released layout
    (transformers' own conversion fuses attn.qkv) and records the released names."""
    import onnx
    from onnx import numpy_helper

    import mobius_lite

    model, _, package = exported
    out = mobius_lite.build_from_module(model).save(tmp_path / "pkg", quiet=True)
    for graph in ("vision_encoder.onnx", "video_encoder.onnx", "audio_encoder.onnx", "model.onnx"):
        ours = onnx.load(str(out / graph))
        theirs = onnx.load(str(package / graph))
        a = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
        b = {t.name: numpy_helper.to_array(t) for t in theirs.graph.initializer}
        assert a.keys() == b.keys(), graph
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{graph}: {name}")
    # the manifest records the names save_pretrained writes (so verify --source matches) ...
    manifest = json.loads((out / "manifest.json").read_text())
    source = manifest["sources"]["vision_model.radio_model.model.blocks.0.attn.qkv.weight"]
    assert source["transform"] == "identity"
    assert source["initializer"] == "vision_model.encoder.layer.0.attention.qkv.weight"
    # ... and the in-memory layout still binds, q_proj / k_proj / v_proj concatenated
    from mobius_lite.build import package_graphs
    from mobius_lite.configs.model_types import read_config
    from mobius_lite.enums import GraphRole
    from mobius_lite.sources import MemorySource
    from mobius_lite.tasks.options import ExportOptions

    model_type, parsed = read_config(model.config.to_dict())
    graphs = package_graphs(
        model_type, parsed, MemorySource(model.state_dict()), ExportOptions()
    ).graphs
    vision = next(g for g in graphs if g.role is GraphRole.VISION_ENCODER)
    qkv = vision.plan.by_target()["vision_model.encoder.layer.0.attention.qkv.weight"]
    assert qkv.transform == "concat" and qkv.sources[0].endswith("attention.q_proj.weight")


def test_qualify_media_make_evs_choose(exported) -> None:
    """qualify's synthetic video has enough tubelets for EVS to rank and drop tokens (the mask
    check is not trivially the first tubelet)."""
    from mobius_lite.configs.omni import OmniConfig
    from mobius_lite.evaluation.qualify_omni import synthetic_media

    model, _, _ = exported
    media = synthetic_media(OmniConfig.from_dict(model.config.to_dict()))
    with pinned_torch():
        (video,) = model.get_video_features(
            torch.from_numpy(media["pixel_values_videos"])
        ).pooler_output
        tubelets = media["pixel_values_videos"].shape[1]
        keep = compute_retention_mask(video, tubelets, model.video_pruning_rate).numpy()
    per_tubelet = len(keep) // tubelets
    assert tubelets >= 3 and per_tubelet < keep.sum() < len(keep)
