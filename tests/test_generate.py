"""`mobius generate` as a user runs it, and the host-side media processing it relies on.

References: torch's antialiased bicubic interpolate (the kernel torchvision's resize uses for
tensors), transformers' own get_patch_grid_size (read from its source: the processor module
itself needs torchvision, which does not import here), transformers' ParakeetFeatureExtractor,
and transformers' Omni model generating greedily from the same pixel values / features.
"""

from __future__ import annotations

import ast
import json
import math
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import ParakeetFeatureExtractor

from mobius_lite.cli.main import main
from mobius_lite.media.image import ImageProcessorConfig, patch_grid, preprocess, resize
from mobius_lite.media.prompt import expand
from reference_fixtures.nemotron_reference import pinned_torch
from reference_fixtures.omni_fixtures import pack_images
from test_omni_package import AUDIO_TOKEN, IMAGE_TOKEN, make_omni

PROCESSOR = dict(
    patch_size=4, downsample_ratio=0.5, min_num_patches=16, max_num_patches=48, max_model_len=64
)
WORDS = [f"w{i}" for i in range(80)]


def reference_grid_function():
    """transformers' get_patch_grid_size, compiled from its source file alone."""
    path = (
        Path(transformers.__file__).parent
        / "models/nemotron_h_omni/image_processing_nemotron_h_omni.py"
    )
    tree = ast.parse(path.read_text())
    (node,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_patch_grid_size"
    ]
    namespace = {"math": math}
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace["get_patch_grid_size"]


@pytest.mark.parametrize(
    "size", [(37, 53, 32, 48), (100, 80, 64, 48), (20, 30, 64, 96), (513, 700, 512, 640)]
)
def test_resize_equals_torch_antialiased_bicubic(size) -> None:
    h, w, out_h, out_w = size
    image = (np.random.default_rng(h).random((3, h, w)) * 255).astype(np.float32)
    ours = resize(image, out_h, out_w)
    reference = torch.nn.functional.interpolate(
        torch.from_numpy(image)[None], size=(out_h, out_w), mode="bicubic", antialias=True
    )[0].numpy()
    # float32 accumulation order differs: a few ulps of the 0..255 range, fixed up front
    assert np.abs(ours - reference).max() <= 1e-3


@pytest.mark.parametrize("budget", [13312, 4096, 1024])
def test_patch_grid_equals_the_processor(budget: int) -> None:
    reference = reference_grid_function()
    config = ImageProcessorConfig()
    for h, w in [(512, 512), (100, 3000), (37, 53), (1080, 1920), (16, 16), (3000, 40), (333, 777)]:
        expected = reference(
            h, w, config.patch_size, config.merge_size, config.min_num_patches, budget
        )
        assert patch_grid(h, w, config, budget) == expected, (h, w)


def test_preprocess_layout_matches_the_processor_layout() -> None:
    """An image already at its grid size is only rescaled, normalised and cut into patches:
    the layout omni_fixtures.pack_images builds from transformers' convert_image_to_patches."""
    config = ImageProcessorConfig.from_dict(PROCESSOR)
    image = np.random.default_rng(0).integers(0, 256, size=(16, 24, 3)).astype(np.uint8)
    pixels, grid = preprocess([image], config)
    normalised = (
        image.transpose(2, 0, 1) / 255.0 - np.array(config.image_mean)[:, None, None]
    ) / np.array(config.image_std)[:, None, None]
    expected, expected_grid = pack_images([torch.from_numpy(normalised.astype(np.float32))])
    np.testing.assert_array_equal(grid, expected_grid)
    np.testing.assert_allclose(pixels, expected, rtol=0, atol=2e-6)


def test_prompt_expansion() -> None:
    text = expand("<image> and <audio>!", [2], [3])
    assert text == "<img><image><image></img> and <so_start>" + "<so_embedding>" * 3 + "<so_end>!"
    assert expand("hi", [1], []) == "<img><image></img>hi"


def tokenizer_json(path: Path) -> None:
    """A word-level tokenizer whose media tokens have the config's ids."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    specials = {"<img>": 85, "</img>": 86, "<so_start>": 87, "<so_end>": 88, "<image>": IMAGE_TOKEN}
    specials["<so_embedding>"] = AUDIO_TOKEN
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tok.save(str(path))


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("generate")
    model = make_omni(audio=True, final_layernorm=False, rate=0.0, seed=5)
    model.save_pretrained(root / "checkpoint")
    tokenizer_json(root / "checkpoint" / "tokenizer.json")
    (root / "checkpoint" / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    assert (
        main(["build", "--model", str(root / "checkpoint"), "--output", str(root / "pkg"), "-q"])
        == 0
    )
    return model, root


def reference_greedy(model, ids: np.ndarray, steps: int, **media) -> list[int]:
    tokens = []
    with pinned_torch():
        out = model(input_ids=torch.from_numpy(ids), use_cache=True, **media)
        length = ids.shape[1]
        for _ in range(steps):
            tokens.append(int(out.logits[0, -1].argmax()))
            length += 1
            out = model(
                input_ids=torch.tensor([[tokens[-1]]]),
                cache=out.cache,
                use_cache=True,
                attention_mask=torch.ones(1, length, dtype=torch.long),
                position_ids=torch.tensor([[length - 1]]),
            )
    return tokens


def test_generate_with_an_image(package, tmp_path: Path, capsys) -> None:
    model, root = package
    picture = np.random.default_rng(7).integers(0, 256, size=(21, 30, 3)).astype(np.uint8)
    Image.fromarray(picture).save(tmp_path / "picture.png")
    args = ["generate", str(root / "pkg"), "--prompt", "w3 <image> w5 w9", "--image"]
    code = main([*args, str(tmp_path / "picture.png"), "--max-new-tokens", "4", "--ids"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    ours = [int(t) for t in captured.out.split()]

    config = ImageProcessorConfig.from_dict(PROCESSOR)
    pixels, grid = preprocess([picture], config)
    count = int(grid.prod() // 4)
    tok = Tokenizer.from_file(str(root / "pkg" / "tokenizer.json"))
    ids = np.array([tok.encode("w3 <img>" + "<image>" * count + "</img> w5 w9").ids])
    assert (ids == IMAGE_TOKEN).sum() == count
    expected = reference_greedy(
        model, ids, 4, pixel_values=torch.from_numpy(pixels), image_grid_hw=torch.from_numpy(grid)
    )
    assert ours == expected


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def test_generate_with_audio(package, tmp_path: Path, capsys) -> None:
    model, root = package
    rng = np.random.default_rng(8)
    clip = (0.3 * rng.standard_normal(4000)).astype(np.float32)
    write_wav(tmp_path / "clip.wav", clip, 16000)
    args = ["generate", str(root / "pkg"), "--prompt", "w4 <so_embedding> w6", "--audio"]
    code = main([*args, str(tmp_path / "clip.wav"), "--max-new-tokens", "4", "--ids"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    ours = [int(t) for t in captured.out.split()]

    samples = np.frombuffer((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes(), "<i2") / 32768
    extractor = ParakeetFeatureExtractor(feature_size=16)
    features = extractor([samples.astype(np.float32)], sampling_rate=16000, return_tensors="pt")
    mask = features["attention_mask"]
    with pinned_torch():
        rows = model.get_audio_features(features["input_features"], mask).pooler_output.shape[0]
    tok = Tokenizer.from_file(str(root / "pkg" / "tokenizer.json"))
    ids = np.array([tok.encode("w4 <so_start>" + "<so_embedding>" * rows + "<so_end> w6").ids])
    expected = reference_greedy(
        model, ids, 4, input_features=features["input_features"], input_features_mask=mask
    )
    assert ours == expected


def test_wrong_sampling_rate_is_one_clear_error(package, tmp_path: Path, capsys) -> None:
    _, root = package
    write_wav(tmp_path / "clip.wav", np.zeros(800, np.float32), 8000)
    code = main(
        ["generate", str(root / "pkg"), "--prompt", "w1", "--audio", str(tmp_path / "clip.wav")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "8000 Hz" in err and "16000 Hz" in err and "Traceback" not in err


@pytest.mark.parametrize("extra", [[], ["--speculative", "2"]])
def test_empty_omni_prompt_is_one_line(package, capsys, extra) -> None:
    """Before: an onnxruntime Reshape traceback (exit 1) from the decoder's prefill."""
    _, root = package
    code = main(["generate", str(root / "pkg"), "--prompt", "", *extra])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured.err
    assert captured.err.startswith("mobius generate: error: the prompt '' encodes to no tokens")
    assert captured.err.count("\n") == 1


def test_empty_omni_prompt_in_the_api(package) -> None:
    from mobius_lite.errors import ConfigError
    from mobius_lite.run.omni_session import OmniSession

    _, root = package
    session = OmniSession(root / "pkg")
    with pytest.raises(ConfigError, match="the prompt is empty"):
        session.generate(np.zeros((1, 0), dtype=np.int64), max_new_tokens=2)
    with pytest.raises(ConfigError, match="the prompt is empty"):
        list(session.generate_tokens(np.zeros((1, 0), dtype=np.int64), max_new_tokens=2))


def test_omni_prompt_ids_stream_the_same_tokens(package, capsys) -> None:
    """--prompt-ids on an Omni package (no media) gives the tokens --prompt gives, which are
    transformers' greedy continuation; stderr has the prompt's length and the speed."""
    model, root = package
    tok = Tokenizer.from_file(str(root / "pkg" / "tokenizer.json"))
    ids = tok.encode("w3 w5 w9").ids
    expected = reference_greedy(model, np.array([ids]), 4)
    for prompt in (["--prompt", "w3 w5 w9"], ["--prompt-ids", ",".join(map(str, ids))]):
        code = main(["generate", str(root / "pkg"), *prompt, "--max-new-tokens", "4", "--ids"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert [int(t) for t in captured.out.split()] == expected
        assert "prompt: 3 tokens" in captured.err and "tokens/s" in captured.err
