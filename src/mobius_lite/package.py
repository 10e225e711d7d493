"""ModelPackage: the exported graphs plus everything needed to save them as a runnable package.

A package holds one or more graphs (decoder; later embedding, vision and audio encoders), each
a `GraphRecord` with its role, model and binding plan. Saving streams every graph's weights
into one set of shards (a tensor shared by two graphs is written once), writes the graph
files, genai_config.json (assembled from the graphs' sections), config.json and the
tokenizer files, checks the result and publishes it atomically with the manifest last.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir
from tqdm import tqdm

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphId, GraphRole, Precision
from mobius_lite.errors import PackageError, VerificationError
from mobius_lite.genai_config import genai_config, graph_section, mtp_head_overlay
from mobius_lite.layout import CONFIG_FILE, GENAI_CONFIG_FILE, GENAI_MTP_OVERLAY_FILE
from mobius_lite.listing import format_names
from mobius_lite.sizes import parse_size
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import BindingPlan
from mobius_lite.weights.manifest import GraphPlan, build_manifest, write_manifest
from mobius_lite.weights.publish import check_destination, publish, staging_directory
from mobius_lite.weights.summary import SaveSummary
from mobius_lite.weights.verify import check_references, verify_package
from mobius_lite.weights.writer import (
    DEFAULT_SHARD_SIZE,
    WriteResult,
    external_initializers,
    write_graphs,
)


@dataclass
class GraphRecord:
    """One graph of a package: its role and depth (enums.GraphId, which names its file and
    its manifest key), model and binding plan. `depth` is nonzero only for a further depth
    of an MTP head of distinct depths."""

    role: GraphRole
    model: ir.Model
    plan: BindingPlan
    depth: int = 0

    @property
    def graph_id(self) -> GraphId:
        return GraphId(self.role, self.depth)

    @property
    def key(self) -> str:
        """The graph's key in manifest.json."""
        return self.graph_id.key

    @property
    def file_name(self) -> str:
        return self.graph_id.file_name


@dataclass
class ModelPackage:
    """Graphs with lazily bound weights; `save` streams them into a package directory."""

    config: NemotronHConfig
    precision: Precision
    graphs: list[GraphRecord]
    source: TensorSource
    source_dir: Path | None = None
    provider: str = "cpu"
    # files copied into the package: name -> a source file, or bytes made from the source
    extra_files: dict[str, Path | bytes] = field(default_factory=dict)
    # What config.json holds (default: the decoder config); an Omni package keeps the full
    # Omni config, which its host runtime reads.
    config_json: dict[str, Any] | None = None
    # Source tensors bound in several graphs, with the roles of those graphs.
    shared: dict[str, list[str]] = field(default_factory=dict)
    # Facts recorded in the package manifest (e.g. {"source": {"model": id, "revision": sha}}).
    metadata: dict = field(default_factory=dict)
    # The summary of the last save() (files, sizes, tensors, time); not a constructor argument.
    last_save: SaveSummary | None = field(default=None, init=False, repr=False, compare=False)

    def graph(self, role: GraphRole) -> GraphRecord:
        for record in self.graphs:
            if record.role is role and not record.depth:
                return record
        raise KeyError(f"the package has no {role.value} graph")

    @property
    def decoder(self) -> ir.Model:
        return self.graph(GraphRole.DECODER).model

    @property
    def plan(self) -> BindingPlan:
        """The decoder's binding plan."""
        return self.graph(GraphRole.DECODER).plan

    def genai_config(self) -> dict[str, Any]:
        """genai_config.json: the decoder's section, plus the embedding and vision graphs'
        sections when the package has them (onnxruntime-genai's VLM layout)."""
        sections = {}
        roles = {g.role: g for g in self.graphs}
        for role, key in ((GraphRole.VISION_ENCODER, "vision"), (GraphRole.EMBEDDING, "embedding")):
            if role in roles and GraphRole.EMBEDDING in roles:
                graph = roles[role].model.graph
                sections[key] = graph_section(
                    key,
                    role.file_name,
                    [v.name for v in graph.inputs],
                    [v.name for v in graph.outputs],
                )
        return genai_config(
            self.config,
            GraphRole.DECODER.file_name,
            provider=self.provider,
            sections=sections,
            mtp_filename=self._genai_mtp_file(),
        )

    def _aux_files(self) -> dict[str, bytes]:
        """The package's files beside the graphs and their data, by name: the configs, the
        MTP head's genai overlay when there is one, the files copied from the source."""
        aux = {
            GENAI_CONFIG_FILE: json.dumps(self.genai_config(), indent=2).encode(),
            CONFIG_FILE: json.dumps(self.config_json or self.config.to_dict(), indent=2).encode(),
        }
        mtp_file = self._genai_mtp_file()
        if mtp_file is not None:
            overlay = mtp_head_overlay(self.config, mtp_file)
            aux[GENAI_MTP_OVERLAY_FILE] = json.dumps(overlay, indent=2).encode()
        for name, extra in self.extra_files.items():
            aux[name] = extra.read_bytes() if isinstance(extra, Path) else extra
        return aux

    def _genai_mtp_file(self) -> str | None:
        """mtp.onnx when onnxruntime-genai's MtpGenerator can be pointed at it: a text package
        (token ids in) with the head."""
        roles = {g.role for g in self.graphs}
        if GraphRole.MTP in roles and GraphRole.EMBEDDING not in roles:
            return GraphRole.MTP.file_name
        return None

    def save(
        self,
        directory: str | Path,
        *,
        shard_size: int | str = DEFAULT_SHARD_SIZE,
        overwrite: bool = False,
        quiet: bool = False,
        verify: bool = False,
        allow_nonfinite: bool = False,
    ) -> Path:
        """Stream the package into `directory` and publish it atomically; returns `directory`.

        Built in a hidden sibling directory, checked (every external reference resolves; no
        weight holds NaN or infinite values unless `allow_nonfinite`; with `verify` also
        every byte against the source), then renamed into place with manifest.json as the
        last file. A non-empty `directory` is refused unless `overwrite`, and is replaced
        only once the new package is complete. A progress bar over bytes written and a
        one-screen summary go to stderr unless `quiet`; the summary is also kept in
        `self.last_save`.
        """
        directory = Path(directory)
        try:
            shard_size = parse_size(shard_size)
        except ValueError as exc:
            raise PackageError(f"shard size: {exc}") from None
        check_destination(directory, overwrite)
        start = time.perf_counter()
        models = [(g.file_name, g.model) for g in self.graphs]
        total = sum(
            v.const_value.nbytes for _, model in models for v in external_initializers(model)
        )
        with staging_directory(directory, needed=total) as stage:
            result = _write_with_progress(models, stage, shard_size, total, directory.name, quiet)
            if not allow_nonfinite:
                _refuse_nonfinite(result.nonfinite)
            aux = self._aux_files()
            for name, data in aux.items():
                _write_new_file(stage / name, data)
            manifest = build_manifest(
                result,
                [GraphPlan(g.key, g.file_name, g.plan) for g in self.graphs],
                self.source,
                self.precision.value,
                stage,
                list(aux),
                self.metadata,
                self.shared,
            )
            self._check_written(stage, manifest, verify=verify, quiet=quiet)
            write_manifest(stage, manifest)
            publish(stage, directory, overwrite)
        self.last_save = SaveSummary.from_manifest(directory, manifest, time.perf_counter() - start)
        if not quiet:
            print(self.last_save.render(), file=sys.stderr)
        return directory

    def _check_written(
        self, stage: Path, manifest: dict[str, Any], *, verify: bool, quiet: bool
    ) -> None:
        """Raise unless every external reference of the staged package resolves and, with
        `verify`, every written byte matches the source."""
        problems = check_references(stage, manifest)
        if problems:
            raise PackageError("the written package is inconsistent: " + "; ".join(problems))
        if verify:
            report = verify_package(stage, self.source, manifest=manifest, quiet=quiet)
            if not report.ok:
                raise VerificationError(
                    "written weights differ from the source: " + "; ".join(report.mismatches)
                )


def _write_with_progress(
    models: list[tuple[str, ir.Model]],
    stage: Path,
    shard_size: int,
    total: int,
    name: str,
    quiet: bool,
) -> WriteResult:
    """write_graphs into `stage` under a progress bar over the `total` bytes (none if quiet)."""
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"writing {name}",
        disable=quiet,
        mininterval=0.5,
        leave=False,
    ) as bar:
        return write_graphs(models, stage, shard_size=shard_size, on_bytes=bar.update)


def _refuse_nonfinite(nonfinite: dict[str, int]) -> None:
    """PackageError naming the tensors that hold NaN or infinite values, if any do."""
    if not nonfinite:
        return
    shown = format_names(
        [f"{n} ({c} values)" for n, c in nonfinite.items()], 10, more=" and {} more tensors"
    )
    raise PackageError(
        f"the checkpoint holds NaN or infinite weights: {shown}"
        "; a model with non-finite weights computes non-finite logits. Use an "
        "intact checkpoint (re-download it), or pass --allow-nonfinite "
        "(allow_nonfinite=True) to export it anyway; nothing was written"
    )


def _write_new_file(path: Path, data: bytes) -> None:
    """Create `path` (never through an existing name or link) and flush it to disk."""
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
