"""ModelPackage: the exported graphs plus everything needed to save them as a runnable package."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir
from tqdm import tqdm

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import Precision
from mobius_lite.errors import PackageError, VerificationError
from mobius_lite.genai_config import genai_config
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import BindingPlan
from mobius_lite.weights.manifest import SaveSummary, build_manifest, write_manifest
from mobius_lite.weights.publish import check_destination, publish, staging_directory
from mobius_lite.weights.verify import check_references, verify_package
from mobius_lite.weights.writer import (
    DEFAULT_SHARD_SIZE,
    external_initializers,
    parse_size,
    write_model,
)

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
    # The summary of the last save() (files, sizes, tensors, time); not a constructor argument.
    last_save: SaveSummary | None = field(default=None, init=False, repr=False, compare=False)

    def genai_config(self) -> dict:
        return genai_config(self.config, DECODER_FILE, provider=self.provider)

    def save(
        self,
        directory: str | Path,
        *,
        shard_size: int | str = DEFAULT_SHARD_SIZE,
        overwrite: bool = False,
        quiet: bool = False,
        verify: bool = False,
    ) -> Path:
        """Stream the package into `directory` and publish it atomically; returns `directory`.

        Built in a hidden sibling directory, checked (every external reference resolves; with
        `verify` also every byte against the source), then renamed into place with
        manifest.json as the last file. A non-empty `directory` is refused unless `overwrite`,
        and is replaced only once the new package is complete. A progress bar over bytes
        written and a one-screen summary go to stderr unless `quiet`; the summary is also kept
        in `self.last_save`.
        """
        directory = Path(directory)
        try:
            shard_size = parse_size(shard_size)
        except ValueError as exc:
            raise PackageError(f"shard size: {exc}") from None
        check_destination(directory, overwrite)
        start = time.perf_counter()
        total = sum(v.const_value.nbytes for v in external_initializers(self.decoder))
        with staging_directory(directory) as stage:
            with tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"writing {directory.name}",
                disable=quiet,
                mininterval=0.5,
                leave=False,
            ) as bar:
                result = write_model(
                    self.decoder, stage, DECODER_FILE, shard_size=shard_size, on_bytes=bar.update
                )
            aux = {
                "genai_config.json": json.dumps(self.genai_config(), indent=2).encode(),
                "config.json": json.dumps(self.config.to_dict(), indent=2).encode(),
            }
            aux.update({extra.name: extra.read_bytes() for extra in self.extra_files})
            for name, data in aux.items():
                _write_new_file(stage / name, data)
            manifest = build_manifest(
                result,
                self.plan,
                self.source,
                self.precision.value,
                stage,
                list(aux),
                self.metadata,
            )
            problems = check_references(stage, manifest)
            if problems:
                raise PackageError("the written package is inconsistent: " + "; ".join(problems))
            if verify:
                report = verify_package(stage, self.source, manifest=manifest, quiet=quiet)
                if not report.ok:
                    raise VerificationError(
                        "written weights differ from the source: " + "; ".join(report.mismatches)
                    )
            write_manifest(stage, manifest)
            publish(stage, directory, overwrite)
        self.last_save = SaveSummary.from_manifest(directory, manifest, time.perf_counter() - start)
        if not quiet:
            print(self.last_save.render(), file=sys.stderr)
        return directory


def _write_new_file(path: Path, data: bytes) -> None:
    """Create `path` (never through an existing name or link) and flush it to disk."""
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
