"""A package of two graphs: the decoder plus an embedding graph over the same embedding table.

The shared table is declared, written once and referenced by both graphs; the package saves,
verifies, is inspected, and both graphs run (the embedding graph's output equals the rows of
the checkpoint's table, read independently with safetensors). Sharing that is not declared is
refused before publishing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.components.context import BuildContext
from mobius_lite.enums import GraphRole
from mobius_lite.errors import PackageError
from mobius_lite.graphs.embedding import build_embedding_graph
from mobius_lite.models.nemotron_h_names import EMBEDDING_WEIGHT, SafetensorsNames
from mobius_lite.package import GraphRecord, ModelPackage
from mobius_lite.weights.binding import bind_model, graph_parameters, plan_bindings
from mobius_lite.weights.external_data import external_references
from mobius_lite.weights.verify import verify_package

LAYERS = dict(layers_block_type=["linear_attention", "full_attention", "moe"])


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(LAYERS["layers_block_type"], seed=4).path


def two_graph_package(checkpoint: Path, declare: bool) -> ModelPackage:
    package = mobius_lite.build(checkpoint)
    embedding = build_embedding_graph(package.config, BuildContext.dense(package.precision))
    # The embedding graph uses part of the checkpoint: the package accounts for the rest.
    plan = plan_bindings(
        graph_parameters(embedding), package.source, SafetensorsNames(), account_for_all=False
    )
    bind_model(embedding, plan, package.source)
    package.graphs.append(GraphRecord(GraphRole.EMBEDDING, embedding, plan))
    if declare:
        package.shared = {EMBEDDING_WEIGHT: ["decoder", "embedding"]}
    return package


def test_saves_verifies_inspects_and_runs(checkpoint: Path, tmp_path: Path, capsys) -> None:
    out = two_graph_package(checkpoint, declare=True).save(tmp_path / "pkg", quiet=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["graphs"]) == {"decoder", "embedding"}
    assert manifest["graphs"]["embedding"]["file"] == "embedding.onnx"
    assert manifest["shared"] == {EMBEDDING_WEIGHT: ["decoder", "embedding"]}
    assert manifest["sources"][EMBEDDING_WEIGHT]["graphs"] == ["decoder", "embedding"]
    decoder_entry = manifest["graphs"]["decoder"]["initializers"][EMBEDDING_WEIGHT]
    embedding_entry = manifest["graphs"]["embedding"]["initializers"][EMBEDDING_WEIGHT]
    assert decoder_entry == embedding_entry  # one copy, referenced twice

    # the graphs' own references (an independent reader: onnx) point at the same bytes
    refs = {
        role: {r.name: r for r in external_references(out / f)}
        for role, f in (("decoder", "model.onnx"), ("embedding", "embedding.onnx"))
    }
    a, b = refs["decoder"][EMBEDDING_WEIGHT], refs["embedding"][EMBEDDING_WEIGHT]
    assert (a.location, a.offset, a.length) == (b.location, b.offset, b.length)
    table = load_file(checkpoint / "model.safetensors")["backbone.embeddings.weight"]
    data_bytes = sum(p.stat().st_size for p in out.glob("*.data"))
    written = sum(e["length"] for e in manifest["graphs"]["decoder"]["initializers"].values())
    assert data_bytes < written + table.nbytes  # the table is not stored twice

    report = verify_package(out, checkpoint)
    assert report.ok, report.mismatches
    assert main(["verify", str(out), "--source", str(checkpoint), "-q"]) == 0

    assert main(["inspect", str(out), "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert [m["file"] for m in inspected["models"]] == ["model.onnx", "embedding.onnx"]
    (embedding_io,) = inspected["models"][1]["outputs"]
    assert embedding_io["name"] == "inputs_embeds"

    ids = np.array([[5, 0, 96, 17]], dtype=np.int64)
    session = ort.InferenceSession(str(out / "embedding.onnx"), providers=["CPUExecutionProvider"])
    (embeds,) = session.run(None, {"input_ids": ids})
    np.testing.assert_array_equal(embeds, table[ids])


def test_undeclared_sharing_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="not declared shared"):
        two_graph_package(checkpoint, declare=False).save(tmp_path / "pkg", quiet=True)
    assert not (tmp_path / "pkg").exists()


def test_a_flipped_byte_in_the_shared_table_is_found_for_both(
    checkpoint: Path, tmp_path: Path
) -> None:
    out = two_graph_package(checkpoint, declare=True).save(tmp_path / "pkg", quiet=True)
    ref = {r.name: r for r in external_references(out / "embedding.onnx")}[EMBEDDING_WEIGHT]
    with open(out / ref.location, "r+b") as handle:
        handle.seek(ref.offset + 10)
        value = handle.read(1)[0]
        handle.seek(ref.offset + 10)
        handle.write(bytes([value ^ 0x40]))
    report = verify_package(out, checkpoint)
    assert not report.ok
    assert any(EMBEDDING_WEIGHT in m for m in report.mismatches)
