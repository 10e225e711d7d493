"""`mobius inspect` summarises a model's subgraphs (issue 30): one line per kind with its count,
nodes and module scopes, checked against a walk of the graph with onnx itself; `--verbose`
lists every subgraph, `--json` always does."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import onnx
import pytest

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.demo import write_demo


@pytest.fixture(scope="module")
def moe_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect")
    checkpoint = write_demo("moe", root / "checkpoint")
    return mobius_lite.build(checkpoint).save(root / "package", quiet=True)


def _subgraph_kinds(graph: onnx.GraphProto) -> Counter:
    """(op, "branch" | attribute name) -> (count, nodes), for every nested graph."""
    found: Counter = Counter()
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                noun = "branch" if attr.name.endswith("_branch") else attr.name
                found[(node.op_type, noun, "count")] += 1
                found[(node.op_type, noun, "nodes")] += len(attr.g.node)
                found.update(_subgraph_kinds(attr.g))
    return found


def _run(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().out


def test_subgraphs_are_summarised_by_kind(moe_package: Path, capsys) -> None:
    graph = onnx.load(str(moe_package / "model.onnx"), load_external_data=False).graph
    expected = _subgraph_kinds(graph)
    total = sum(v for (_, _, what), v in expected.items() if what == "count")
    assert total > 20  # the MoE layers' If / Scan / Loop bodies

    code, out = _run(["inspect", str(moe_package)], capsys)
    assert code == 0
    lines = out.splitlines()
    at = lines.index(f"  graph 'nemotron_h_decoder', {total} subgraph(s)")
    summary = []
    for line in lines[at + 1 :]:
        if not line.startswith("    "):
            break
        summary.append(line)
    kinds = {(op, noun) for op, noun, _ in expected}
    assert len(summary) == len(kinds) <= 4
    plural = {"branch": "branches", "body": "bodies"}
    for op, noun in kinds:
        count, nodes = expected[(op, noun, "count")], expected[(op, noun, "nodes")]
        word = noun if count == 1 else plural[noun]
        (line,) = [s for s in summary if s.startswith(f"    {count} {op} {word}, ")]
        assert f", {nodes} nodes, in backbone/layers.1/mixer/experts, " in line
        assert len(line) < 120

    code, verbose = _run(["inspect", str(moe_package), "--verbose"], capsys)
    assert code == 0
    path_line = re.compile(r"^    (If|Loop|Scan):\S+: \d+ nodes$")
    listed = [s for s in verbose.splitlines() if path_line.match(s)]
    assert len(listed) == total
    code, as_json = _run(["inspect", str(moe_package), "--json"], capsys)
    assert len(json.loads(as_json)["models"][0]["subgraphs"]) == total
