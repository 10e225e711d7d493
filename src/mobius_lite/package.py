"""ModelPackage: the exported graphs plus everything needed to save them as a runnable package."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import Precision
from mobius_lite.errors import PackageError
from mobius_lite.genai_config import genai_config
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import BindingPlan
from mobius_lite.weights.writer import DEFAULT_SHARD_SIZE, write_model

DECODER_FILE = "model.onnx"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
)


@dataclass
class ModelPackage:
    """A decoder graph with lazily bound weights; `save` streams it into a package directory."""

    config: NemotronHConfig
    precision: Precision
    decoder: ir.Model
    source: TensorSource
    plan: BindingPlan
    source_dir: Path | None = None
    provider: str = "cpu"
    extra_files: list[Path] = field(default_factory=list)
    # Facts recorded in the package manifest (e.g. {"source": {"model": id, "revision": sha}}).
    metadata: dict = field(default_factory=dict)

    def genai_config(self) -> dict:
        return genai_config(self.config, DECODER_FILE, provider=self.provider)

    def save(
        self,
        directory: str | Path,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        overwrite: bool = False,
    ) -> Path:
        """Write the package into `directory`, built in a sibling temp dir and renamed into place."""
        directory = Path(directory)
        if directory.exists() and any(directory.iterdir()) and not overwrite:
            raise PackageError(
                f"{directory} exists and is not empty; choose another --output or pass --overwrite"
            )
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
        try:
            write_model(self.decoder, staging, DECODER_FILE, shard_size=shard_size)
            (staging / "genai_config.json").write_text(json.dumps(self.genai_config(), indent=2))
            (staging / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2))
            for extra in self.extra_files:
                shutil.copyfile(extra, staging / extra.name)
            if directory.exists():
                shutil.rmtree(directory)
            staging.rename(directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return directory
