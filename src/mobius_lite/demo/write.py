"""Writing a demo checkpoint: each kind's config, tensors and tokenizer, published atomically
(written into a hidden sibling, then renamed into place) so an interrupted run leaves nothing."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mobius_lite.demo import configs
from mobius_lite.demo.tensors import Random, Tensors, decoder_tensors, mtp_head_tensors
from mobius_lite.demo.tokenizer import OMNI_TOKENS, make_tokenizer, tokenizer_files
from mobius_lite.errors import PackageError

DEMO_KINDS: dict[str, str] = {
    "text": "dense hybrid Nemotron-H: Mamba, attention and MLP layers",
    "moe": "Nemotron-H with mixture-of-experts layers (8 experts, top 2, a shared expert)",
    "puzzle": "a Puzzle (nemotron_h_puzzle) checkpoint whose blocks differ in shape",
    "mtp": "the text model with a multi-token-prediction head (mtp.* tensors)",
    "omni": "Nemotron-H Omni: a C-RADIO vision tower, projector and the text model",
    "gguf": "the text model as one Q8_0 GGUF file, as llama.cpp's converter writes it",
}
WEIGHTS_FILE = "model.safetensors"


def write_demo(kind: str, out: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write a demo checkpoint of `kind` (a DEMO_KINDS key) at `out`: a new or empty
    directory (gguf: a new file whose name ends in .gguf). Returns the path written."""
    if kind not in DEMO_KINDS:
        raise PackageError(f"no demo kind {kind!r}; the kinds are {', '.join(DEMO_KINDS)}")
    path = Path(out)
    _check_destination(kind, path)
    rng = Random(seed)
    if kind == "gguf":
        from mobius_lite.demo.gguf_file import write_gguf

        tokenizer = make_tokenizer()
        config = configs.nemotron_h_config(tokenizer.get_vocab_size(), configs.TEXT_LAYERS)
        tensors = decoder_tensors(config, configs.TEXT_LAYERS, rng)
        with _staged(path, directory=False) as staging:
            write_gguf(staging, config, tensors, tokenizer)
        return path
    with _staged(path, directory=True) as staging:
        WRITERS[kind](staging, rng)
    return path


def _check_destination(kind: str, path: Path) -> None:
    if kind == "gguf":
        if path.suffix != ".gguf":
            raise PackageError(f"{path}: a GGUF demo is one file; give a name ending in .gguf")
        if path.exists():
            raise PackageError(f"{path} exists; choose a new file name or remove it first")
    elif path.exists() and (not path.is_dir() or any(path.iterdir())):
        what = "is not a directory" if not path.is_dir() else "exists and is not empty"
        raise PackageError(f"{path} {what}; choose a new directory or remove it first")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise PackageError(f"{parent} does not exist; create it first or choose another path")
    if not os.access(parent, os.W_OK):
        raise PackageError(f"{parent} is not writable; choose another path")


@contextlib.contextmanager
def _staged(path: Path, *, directory: bool) -> Iterator[Path]:
    """A hidden sibling of `path` to write into, renamed onto `path` when the body ends; removed
    when it raises (an interrupt too)."""
    parent = path.absolute().parent
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=parent))
    target = staging if directory else staging / path.name
    try:
        yield target
        if directory:
            if path.is_dir():
                path.rmdir()  # an empty directory given as OUT
            staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private
            staging.rename(path)
        else:
            target.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _save(directory: Path, config: dict[str, Any], tensors: Tensors, tokenizer: Any) -> None:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    for name, data in tokenizer_files(tokenizer).items():
        (directory / name).write_bytes(data)
    text = config.get("text_config", config)
    generation = {k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _text(directory: Path, rng: Random) -> None:
    tokenizer = make_tokenizer()
    config = configs.nemotron_h_config(tokenizer.get_vocab_size(), configs.TEXT_LAYERS)
    _save(directory, config, decoder_tensors(config, configs.TEXT_LAYERS, rng), tokenizer)


def _moe(directory: Path, rng: Random) -> None:
    tokenizer = make_tokenizer()
    config = configs.nemotron_h_config(tokenizer.get_vocab_size(), configs.MOE_LAYERS)
    _save(directory, config, decoder_tensors(config, configs.MOE_LAYERS, rng), tokenizer)


def _mtp(directory: Path, rng: Random) -> None:
    """The text model declaring one MTP layer, its head's tensors beside the decoder's."""
    tokenizer = make_tokenizer()
    config = configs.nemotron_h_config(
        tokenizer.get_vocab_size(), configs.TEXT_LAYERS, num_nextn_predict_layers=1
    )
    tensors = decoder_tensors(config, configs.TEXT_LAYERS, rng)
    tensors.update(mtp_head_tensors(config, rng))
    _save(directory, config, tensors, tokenizer)


def _puzzle(directory: Path, rng: Random) -> None:
    tokenizer = make_tokenizer()
    config = configs.puzzle_config(tokenizer.get_vocab_size())
    kinds = [block["block_type"] for block in config["block_configs"]]
    layers = configs.puzzle_layer_configs(config)
    tensors = decoder_tensors(config, kinds, rng, root="model.", layer_configs=layers)
    _save(directory, config, tensors, tokenizer)


def _omni(directory: Path, rng: Random) -> None:
    from mobius_lite.demo.omni_tensors import vision_tensors

    tokenizer = make_tokenizer(OMNI_TOKENS)
    text = configs.nemotron_h_config(tokenizer.get_vocab_size(), configs.TEXT_LAYERS)
    image, video = (tokenizer.token_to_id(t) for t in ("<image>", "<video>"))
    config = configs.omni_config(text, image, video)
    tensors = decoder_tensors(
        text,
        configs.TEXT_LAYERS,
        rng,
        root="language_model.backbone.",
        head="language_model.lm_head.weight",
    )
    tensors.update(
        vision_tensors(
            configs.VISION,
            text["hidden_size"],
            configs.PROJECTOR_HIDDEN,
            configs.DOWNSAMPLE_RATIO,
            rng,
        )
    )
    _save(directory, config, tensors, tokenizer)
    processor = json.dumps(configs.IMAGE_PROCESSOR, indent=2) + "\n"
    (directory / "preprocessor_config.json").write_text(processor)


WRITERS: dict[str, Callable[[Path, Random], None]] = {
    "text": _text,
    "moe": _moe,
    "puzzle": _puzzle,
    "mtp": _mtp,
    "omni": _omni,
}
