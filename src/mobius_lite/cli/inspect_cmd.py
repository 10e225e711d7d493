"""`mobius inspect`: describe an exported package without loading its weights.

Models are read with onnx.load(load_external_data=False), so only the graph protos are in
memory. External data files are derived from the models' own external-data references (every
graph, subgraphs included), never from a glob, and each is checked against the disk.
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from mobius_lite.cli import COMMANDS
from mobius_lite.errors import PackageError
from mobius_lite.layout import GRAPH_FILES, MANIFEST_FILE
from mobius_lite.listing import format_names
from mobius_lite.sizes import human_bytes
from mobius_lite.weights.external_data import external_ref

EPILOG = textwrap.dedent(
    """\
    examples:
      mobius inspect ./nano9b                 # every *.onnx in the package directory
      mobius inspect ./nano9b/model.onnx      # one model file
      mobius inspect ./nano9b --json | jq '.models[0].nodes.main'
    """
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help=COMMANDS["inspect"],
        description="Describe an exported package without loading its weights: per model, "
        "the graph and its subgraphs, inputs and outputs with element types and shapes, node "
        "counts by op type (top-level graph and subgraphs reported separately), weight element "
        "types with tensor counts and bytes, and the external data files the model references "
        "(with their size on disk). Reads genai_config.json and manifest.json if present.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "package", metavar="PACKAGE", help="package directory (built by mobius build) or .onnx file"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (for machines)")
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="list every subgraph on its own line (by default: one line per kind of subgraph, "
        "with counts; --json always lists them all)",
    )
    p.set_defaults(run=run)


# --------------------------------------------------------------------------- report
def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    return d.dim_param or "?"


def _value_info(v: onnx.ValueInfoProto) -> dict[str, Any]:
    t = v.type.tensor_type
    shape = [_dim(d) for d in t.shape.dim] if t.HasField("shape") else None
    return {"name": v.name, "dtype": _dtype_name(t.elem_type), "shape": shape}


def _input_info(v: onnx.ValueInfoProto, graph: onnx.GraphProto) -> dict[str, Any]:
    """A graph input; one that also has a small initializer is optional, with that default."""
    info = _value_info(v)
    for t in graph.initializer:
        if t.name == v.name and not t.external_data:
            info["default"] = onnx.numpy_helper.to_array(t).tolist()
    return info


def _dtype_name(elem_type: int) -> str:
    """numpy-style element type names (float32, bfloat16, int64, ...)."""
    try:
        name = ir.DataType(elem_type).name.lower()
    except ValueError:
        return f"type{elem_type}"
    return {"float": "float32", "double": "float64"}.get(name, name)


def _subgraphs(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """(node/attribute path, subgraph) for every nested graph, depth first."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                graphs = [attr.g]
            elif attr.type == onnx.AttributeProto.GRAPHS:
                graphs = list(attr.graphs)
            else:
                continue
            for i, sub in enumerate(graphs):
                suffix = f"[{i}]" if attr.type == onnx.AttributeProto.GRAPHS else ""
                label = f"{node.op_type}:{node.name or '?'}.{attr.name}{suffix}"
                yield label, sub
                for inner_label, inner in _subgraphs(sub):
                    yield f"{label}/{inner_label}", inner


def _tensor_bytes(t: onnx.TensorProto) -> int:
    """Stored size of an initializer, from its external-data length or its own fields."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        if "length" in info:
            return int(info["length"])
    elif t.raw_data:
        return len(t.raw_data)
    count = 1
    for d in t.dims:
        count *= int(d)
    try:
        return int(count * ir.DataType(t.data_type).itemsize + 0.5)
    except ValueError:
        return 0


def _weights(graphs: list[onnx.GraphProto], base: Path) -> tuple[dict, dict]:
    """Initializer bytes by element type (main graph and subgraphs), and per external-data
    file the tensors that reference it."""
    by_dtype: dict[str, dict[str, int]] = {}
    files: dict[str, dict[str, Any]] = {}
    for t in (t for graph in graphs for t in graph.initializer):
        dtype = _dtype_name(t.data_type)
        size = _tensor_bytes(t)
        entry = by_dtype.setdefault(dtype, {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += size
        ref = external_ref(t)
        if ref is not None:
            rec = files.setdefault(ref.location, {"tensors": 0, "bytes_referenced": 0, "end": 0})
            rec["tensors"] += 1
            rec["bytes_referenced"] += size
            rec["end"] = max(rec["end"], ref.offset + size)
    for location, rec in files.items():
        path = base / location
        end = rec.pop("end")
        rec["exists"] = path.is_file()
        rec["regular_file"] = rec["exists"] and not path.is_symlink() and path.stat().st_nlink == 1
        rec["size_on_disk"] = path.stat().st_size if rec["exists"] else None
        # every referenced byte range lies inside the file
        rec["complete"] = rec["exists"] and rec["size_on_disk"] >= end
    return by_dtype, dict(sorted(files.items()))


PACKED_DTYPES = ("UINT8", "FLOAT8E4M3FN", "FLOAT4E2M1")


def _weight_routes(graphs: list[onnx.GraphProto]) -> dict[str, str]:
    """initializer -> how the graph computes with it: the contrib op consuming it (ort route),
    "standard decode" for packed bytes decoded with standard ops, or "dense"."""
    consumers: dict[str, set[tuple[str, str]]] = {}
    for graph in graphs:
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, set()).add((node.domain, node.op_type))
    routes = {}
    for graph in graphs:
        for t in graph.initializer:
            contrib = sorted(op for domain, op in consumers.get(t.name, ()) if domain)
            if contrib:
                routes[t.name] = "ort " + "/".join(contrib)
            elif _dtype_name(t.data_type).upper() in PACKED_DTYPES:
                routes[t.name] = "standard decode"
            else:
                routes[t.name] = "dense"
    return dict(sorted(routes.items()))


def inspect_model(path: Path) -> dict[str, Any]:
    """The report for one .onnx file (graph protos only; no tensor data is loaded)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError / OSError variants
        raise PackageError(f"{path} is not a readable ONNX model: {exc}") from None
    graph = model.graph
    subgraphs = list(_subgraphs(graph))
    sub_ops: Counter[str] = Counter()
    for _, sub in subgraphs:
        sub_ops.update(n.op_type for n in sub.node)
    weights, files = _weights([graph] + [g for _, g in subgraphs], path.parent)
    return {
        "file": path.name,
        "size_on_disk": path.stat().st_size,
        "ir_version": model.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "graph": graph.name,
        "subgraphs": [{"path": label, "nodes": len(g.node)} for label, g in subgraphs],
        "inputs": [_input_info(v, graph) for v in graph.input],
        "outputs": [_value_info(v) for v in graph.output],
        "nodes": {
            "main": dict(sorted(Counter(n.op_type for n in graph.node).items())),
            "main_total": len(graph.node),
            "subgraphs": dict(sorted(sub_ops.items())),
            "subgraphs_total": sum(sub_ops.values()),
        },
        "weights": dict(sorted(weights.items())),
        "weights_total_bytes": sum(w["bytes"] for w in weights.values()),
        "weight_routes": _weight_routes([graph] + [g for _, g in subgraphs]),
        "external_data": files,
    }


def inspect_package(target: str | Path) -> dict[str, Any]:
    """The report for a package directory (every *.onnx in it) or a single .onnx file."""
    target = Path(target)
    if target.is_file():
        root, models = target.parent, [target]
    elif target.is_dir():
        root, models = target, _package_models(target)
        if not models:
            from mobius_lite.run.package_reader import not_a_package_hint

            hint = not_a_package_hint(target)
            if hint:
                raise PackageError(hint)
            raise PackageError(
                f"{target} holds no .onnx model; pass a package directory written by "
                "mobius build, or a .onnx file"
            )
    else:
        raise PackageError(f"{target}: no such package directory or .onnx file")
    report: dict[str, Any] = {"package": str(target), "models": [inspect_model(m) for m in models]}
    for name in ("genai_config.json", "manifest.json"):
        path = root / name
        if path.is_file():
            report[name] = _summary(name, path)
    return report


def _package_models(directory: Path) -> list[Path]:
    """The package's graph files: as its manifest lists them, else the known graph names, else
    every .onnx file (a directory that is not a mobius package)."""
    try:
        graphs = json.loads((directory / MANIFEST_FILE).read_text()).get("graphs") or {}
        listed = [directory / g["file"] for g in graphs.values()]
    except (OSError, json.JSONDecodeError, TypeError, KeyError):
        listed = []
    known = [directory / name for name in GRAPH_FILES if (directory / name).is_file()]
    return listed or known or sorted(directory.glob("*.onnx"))


def _summary(name: str, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as exc:
        return {"error": f"unreadable: {exc}"}
    if name == "genai_config.json":
        model = data.get("model", {})
        options = model.get("decoder", {}).get("session_options", {}).get("provider_options", [])
        providers = [k for opt in options for k in opt] or ["cpu"]
        return {"type": model.get("type"), "providers": providers}
    storage: dict[str, dict[str, Any]] = {}
    for entry in data.get("sources", {}).values():
        key = f"{entry.get('dtype')} -> {entry.get('transform')}"
        if "quantize" in entry:  # quantized at export: its recipe
            recipe = entry["quantize"]
            kind = "symmetric" if recipe.get("symmetric") else "asymmetric"
            key += f" {recipe.get('type')} (block {recipe.get('block')}, {kind})"
        row = storage.setdefault(key, {"tensors": 0, "bytes": 0})
        row["tensors"] += 1
        row["bytes"] += int(entry.get("nbytes", 0))
    summary = {"source": data.get("source"), "keys": sorted(data), "storage": storage}
    if "quantization" in data:
        summary["quantization"] = data["quantization"]
    return summary


# --------------------------------------------------------------------------- text output


def _shape(shape: list | None) -> str:
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


MAX_SCOPES = 3  # module scopes named on a subgraph-summary line


_SEGMENT = re.compile(r"(?:^|/)[A-Za-z]+:")
PLURAL = {"branch": "branches", "body": "bodies"}


def _segments(path: str) -> list[tuple[str, str, str]]:
    """A subgraph path's `Op:node.attribute` segments (inspect_model's labels, joined by "/")
    as (op, node name, attribute). Node names hold "/" too, so segments are cut at `Op:`."""
    starts = [m.start() for m in _SEGMENT.finditer(path)] + [len(path)]
    out = []
    for start, end in zip(starts[:-1], starts[1:], strict=True):
        op, rest = path[start:end].lstrip("/").split(":", 1)
        node, _, attribute = rest.rpartition(".")
        out.append((op, node, attribute))
    return out


def _subgraph_kind(path: str) -> tuple[str, str]:
    """(kind, module scope) of a subgraph: the innermost segment gives the kind ("If branch",
    "Scan body", "Loop body"), the outermost node's name scope the module it belongs to
    ("backbone/layers.1/mixer/experts")."""
    segments = _segments(path)
    op, _, attribute = segments[-1]
    kind = f"{op} {'branch' if attribute.endswith('_branch') else attribute}"
    node = segments[0][1]
    return kind, node.rsplit("/", 1)[0] if "/" in node else "the top level"


def subgraph_summary(subgraphs: list[dict[str, Any]]) -> list[str]:
    """One line per kind of subgraph: how many, their nodes, the module scopes they sit in."""
    kinds: dict[str, list[tuple[str, int]]] = {}
    for s in subgraphs:
        kind, scope = _subgraph_kind(s["path"])
        kinds.setdefault(kind, []).append((scope, s["nodes"]))
    lines = []
    for kind, members in sorted(kinds.items()):
        scopes = list(dict.fromkeys(scope for scope, _ in members))
        named = format_names(scopes, MAX_SCOPES, more=" and {} more")
        op, noun = kind.split(" ", 1)
        noun = noun if len(members) == 1 else PLURAL.get(noun, noun + "s")
        nodes = sum(n for _, n in members)
        lines.append(f"    {len(members)} {op} {noun}, {nodes} nodes, in {named}")
    return lines


def format_report(report: dict[str, Any], verbose: bool = False) -> str:
    lines = [f"package: {report['package']}"]
    if "manifest.json" in report and report["manifest.json"].get("source"):
        src = report["manifest.json"]["source"]
        lines.append(f"source: {src.get('model')} @ {src.get('revision') or '(local)'}")
    if "genai_config.json" in report:
        g = report["genai_config.json"]
        lines.append(f"genai_config: type {g['type']}, providers {', '.join(g['providers'])}")
    for m in report["models"]:
        opsets = ", ".join(f"{d} {v}" for d, v in m["opsets"].items())
        lines += [
            "",
            f"{m['file']} ({human_bytes(m['size_on_disk'])}; ir {m['ir_version']}; {opsets})",
        ]
        lines.append(f"  graph {m['graph']!r}, {len(m['subgraphs'])} subgraph(s)")
        if verbose:
            lines += [f"    {s['path']}: {s['nodes']} nodes" for s in m["subgraphs"]]
        else:
            lines += subgraph_summary(m["subgraphs"])
        for kind in ("inputs", "outputs"):
            lines.append(f"  {kind} ({len(m[kind])}):")
            lines += [
                f"    {v['name']}: {v['dtype']} {_shape(v['shape'])}"
                + (f" (optional, default {v['default']})" if "default" in v else "")
                for v in m[kind]
            ]
        nodes = m["nodes"]
        lines.append(f"  nodes in the main graph: {nodes['main_total']}")
        lines += [f"    {op}: {n}" for op, n in nodes["main"].items()]
        lines.append(f"  nodes inside subgraphs: {nodes['subgraphs_total']}")
        lines += [f"    {op}: {n}" for op, n in nodes["subgraphs"].items()]
        lines.append(f"  weights: {human_bytes(m['weights_total_bytes'])}")
        for dtype, w in m["weights"].items():
            lines.append(f"    {dtype}: {w['tensors']} tensors, {human_bytes(w['bytes'])}")
        routes = Counter(m["weight_routes"].values())
        lines.append("  weight routes: " + ", ".join(f"{r} {n}" for r, n in sorted(routes.items())))
        lines.append(f"  external data files ({len(m['external_data'])}):")
        for name, f in m["external_data"].items():
            state = "ok" if f["complete"] else ("MISSING" if not f["exists"] else "TRUNCATED")
            lines.append(
                f"    {name}: {f['tensors']} tensors, "
                f"{human_bytes(f['bytes_referenced'])} referenced, "
                f"{human_bytes(f['size_on_disk'])} on disk [{state}]"
            )
    lines += _quantization_lines(report.get("manifest.json", {}).get("quantization"))
    storage = report.get("manifest.json", {}).get("storage", {})
    if storage:
        lines += ["", "source tensors by storage -> transform (manifest.json):"]
        for key, row in sorted(storage.items()):
            lines.append(f"  {key}: {row['tensors']} tensors, {human_bytes(row['bytes'])}")
    return "\n".join(lines)


def _quantization_lines(plan: dict[str, Any] | None) -> list[str]:
    """What `--quantize` / `--quantize-output` asked for, and the tensors it kept dense (rows
    not whole blocks). `weights` null: an output-only plan (lm_head alone)."""
    if not plan:
        return []
    weights, output = plan.get("weights"), plan.get("output", {})
    asked = (
        f"lm_head {output.get('type')} only (every other tensor as the checkpoint stores it)"
        if weights is None
        else f"weights {weights.get('type')}, lm_head {output.get('type')}"
    )
    lines = [
        "",
        f"quantized at export: {asked} "
        "(per tensor: source sha256 and recipe in manifest.json; mobius verify re-derives them)",
    ]
    lines += [f"  kept dense: {f}" for f in plan.get("fallbacks", [])]
    return lines


def incomplete_files(report: dict[str, Any]) -> list[str]:
    """The report's external data files that are missing or shorter than referenced."""
    problems = []
    for model in report["models"]:
        for name, f in model["external_data"].items():
            if not f["exists"]:
                problems.append(f"external data file {name} is missing")
            elif not f["complete"]:
                problems.append(
                    f"external data file {name} is truncated ({f['size_on_disk']} bytes on disk, "
                    f"{model['file']} references more)"
                )
    return problems


def run(args: argparse.Namespace) -> int:
    """Print the report; then, for an incomplete package, one error line (exit status 2): the
    report still describes it, but nothing can run it."""
    from mobius_lite.run.package_reader import incomplete_package, read_package

    report = inspect_package(args.package)
    text = json.dumps(report, indent=2) if args.json else format_report(report, args.verbose)
    print(text, flush=True)
    target = Path(args.package)
    if target.is_dir() and (target / MANIFEST_FILE).is_file():
        read_package(target).raise_if_incomplete()
    problems = incomplete_files(report)
    if problems:
        raise incomplete_package(target, problems)
    return 0
