r"""Where the exported decoder spends CPU time: onnxruntime's profiler per op type and layer kind.

Builds the "mid" random config of common.py (MID) (or its variant without dense MLP layers, the
one issue 14 compares with llama.cpp), exports it in f32 with mobius_lite.build, then runs a
prefill of --prompt-length tokens and --decode-tokens cached steps in onnxruntime CPU with
SessionOptions.enable_profiling. Kernel times are summed per op type and per layer kind (node
names carry the module scope, e.g. ``backbone/layers.3/mixer/...``); nodes inside If / Loop
subgraphs are counted under their own op type, and the If / Loop node's own time is reported
exclusive of them. Also records session creation time and resident memory next to the
weight bytes.

Usage:
    python benchmarks/investigations/profile_decoder.py --variant no-mlp --threads 2 \
        --json docs/profile_no_mlp.json --markdown /tmp/profile_no_mlp.md
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import MID, PATTERNS, export, make_checkpoint  # noqa: E402

from mobius_lite.bench import package_peer, workdir  # noqa: E402
from mobius_lite.bench.measure import rss_bytes  # noqa: E402

LAYER = re.compile(r"layers\.(\d+)/")
KIND = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


def weight_bytes(package: Path) -> int:
    """Bytes of the package's external weight data."""
    return sum(p.stat().st_size for p in package.iterdir() if p.name.endswith(".data"))


SPINNING = {"value": "1"}  # session.intra_op.allow_spinning, set from --allow-spinning


def session_options(threads: int, profile_prefix: str | None = None, level: str = "all") -> Any:
    """CPU session options: `threads` intra-op threads, one inter-op thread, the optimization
    level, intra-op spinning as --allow-spinning says, the profiler when a prefix is given."""
    import onnxruntime as ort

    options = package_peer.session_options(threads)
    options.add_session_config_entry("session.intra_op.allow_spinning", SPINNING["value"])
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def top_level_names(package: Path) -> set[str]:
    """Names of every node the exported model declares (top level and in subgraphs)."""
    import onnx

    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    names: set[str] = set()

    def walk(graph: Any) -> None:
        for node in graph.node:
            names.add(node.name)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g)

    walk(model.graph)
    return names


def kernel_events(trace: Path) -> list[dict[str, Any]]:
    """The profiler's per-node kernel events, with the time of nested events (the nodes of an
    If / Loop / Scan body, including function bodies onnxruntime inlined) taken out of their
    parent: `us` is exclusive time, `parent` the enclosing event's node or None."""
    raw = [
        e
        for e in json.loads(trace.read_text())
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    ]
    raw.sort(key=lambda e: (e["ts"], -e["dur"]))
    out: list[dict[str, Any]] = []
    stack: list[dict[str, Any]] = []
    for e in raw:
        while stack and e["ts"] >= stack[-1]["end"]:
            stack.pop()
        item = {
            "node": e["name"][: -len("_kernel_time")],
            "op": e["args"].get("op_name", "?"),
            "us": float(e["dur"]),
            "end": e["ts"] + e["dur"],
            "parent": stack[-1] if stack else None,
        }
        if stack:
            stack[-1]["us"] -= item["us"]
        out.append(item)
        stack.append(item)
    return out


def last_calls(events: list[dict[str, Any]], calls: int) -> list[dict[str, Any]]:
    """The events of the last `calls` runs: every run starts with the same top-level node."""
    first = events[0]["node"]
    starts = [i for i, e in enumerate(events) if e["node"] == first and e["parent"] is None]
    return events[starts[-calls] :]


def layer_of(item: dict[str, Any], pattern: str, declared: set[str]) -> tuple[str, str]:
    """(layer label, layer kind) from the node's own scope or its nearest scoped ancestor.

    Nodes onnxruntime created by inlining a function op at the top level carry no scope: on
    the standard backend Mamba's opset-27 CausalConvWithState and LinearAttention, and (before
    the ort backend's grouped attention, components/attention.py) the opset-27 Attention."""
    node: dict[str, Any] | None = item
    while node is not None:
        match = LAYER.search(node["node"])
        if match:
            index = int(match.group(1))
            return f"layers.{index:02d} ({KIND[pattern[index]]})", KIND[pattern[index]]
        node = node["parent"]
    if item["node"] in declared:
        return "top (embedding, norm_f, lm_head)", "top (embedding, norm_f, lm_head)"
    return "unscoped (inlined function bodies)", "unscoped (inlined function bodies)"


def breakdown(
    events: list[dict[str, Any]], pattern: str, declared: set[str], calls: int
) -> dict[str, Any]:
    """Exclusive kernel time per op type / layer kind / layer, in ms per call."""
    by_op: collections.Counter[str] = collections.Counter()
    by_kind: collections.Counter[str] = collections.Counter()
    by_layer: collections.Counter[str] = collections.Counter()
    by_kind_op: collections.Counter[str] = collections.Counter()
    for e in events:
        layer, kind = layer_of(e, pattern, declared)
        by_op[e["op"]] += e["us"]
        by_kind[kind.split(" (")[0]] += e["us"]
        by_layer[layer] += e["us"]
        by_kind_op[f"{kind.split(' (')[0]} / {e['op']}"] += e["us"]
    total = sum(by_op.values())

    def table(counter: collections.Counter[str]) -> list[dict[str, Any]]:
        return [
            {"name": k, "ms": v / 1000 / calls, "share": v / total}
            for k, v in counter.most_common()
        ]

    return {
        "kernel_ms_per_call": total / 1000 / calls,
        "by_op": table(by_op),
        "by_kind": table(by_kind),
        "by_layer": sorted(table(by_layer), key=lambda r: r["name"]),
        "by_kind_op": table(by_kind_op)[:25],
    }


def run_profile(
    package: Path, pattern: str, prompt_length: int, decode_tokens: int, threads: int, level: str
) -> dict[str, Any]:
    """Profile one prefill (after a warm-up call) and `decode_tokens` cached steps; the decode
    session starts from caches a plain session filled, so its trace holds decode calls only."""
    from mobius_lite.run.decoder_session import DecoderSession

    prompt = np.random.default_rng(0).integers(3, MID["vocab_size"], size=(1, prompt_length))
    declared = top_level_names(package)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain = DecoderSession(
            package / DECODER_FILE, session_options=session_options(threads, None, level)
        )
        plain.reset(1)
        prefilled = plain.step(prompt)
        for phase in ("prefill", "decode"):
            options = session_options(threads, str(Path(tmp) / phase), level)
            session = DecoderSession(package / DECODER_FILE, session_options=options)
            wall = []
            if phase == "prefill":
                for _ in range(2):  # the first call's allocations stay out of the figure
                    session.reset(1)
                    start = time.perf_counter()
                    session.step(prompt)
                    wall.append(time.perf_counter() - start)
                wall, calls = wall[1:], 1
            else:
                session.past, session.mask = dict(plain.past), plain.mask.copy()
                token = prefilled["logits"][:, -1].argmax(-1)[:, None]
                for _ in range(decode_tokens + 1):
                    start = time.perf_counter()
                    out = session.step(token)
                    wall.append(time.perf_counter() - start)
                    token = out["logits"][:, -1].argmax(-1)[:, None]
                wall, calls = wall[1:], decode_tokens
            events = last_calls(kernel_events(Path(session.session.end_profiling())), calls)
            result = breakdown(events, pattern, declared, calls)
            result["wall_ms_per_call_median"] = float(np.median(wall) * 1000)
            results[phase] = result
    return results


def load_figures(package: Path, threads: int, level: str) -> dict[str, Any]:
    """Session creation time and resident memory (this process) against the weight bytes."""
    from mobius_lite.run.decoder_session import DecoderSession

    before = rss_bytes()
    start = time.perf_counter()
    session = DecoderSession(
        package / DECODER_FILE, session_options=session_options(threads, None, level)
    )
    created = time.perf_counter() - start
    after_create = rss_bytes()
    session.reset(1)
    session.step(np.ones((1, 16), dtype=np.int64))
    after_run = rss_bytes()
    weights = weight_bytes(package)
    return {
        "session_create_s": created,
        "weight_bytes": weights,
        "rss_before_session_mib": before / 2**20,
        "session_rss_mib": (after_create - before) / 2**20,
        "session_rss_over_weights": (after_create - before) / weights,
        "rss_after_first_call_over_weights": (after_run - before) / weights,
    }


def markdown(result: dict[str, Any], top: int = 12) -> str:
    """The breakdown as markdown tables (op type, layer kind, hottest kind/op pairs)."""
    lines = []
    for phase in ("prefill", "decode"):
        r = result["profile"][phase]
        lines.append(
            f"**{phase}** ({'per call of ' + str(result['prompt_length']) + ' tokens' if phase == 'prefill' else 'per token'}): "  # noqa: E501
            f"kernels {r['kernel_ms_per_call']:.2f} ms, wall {r['wall_ms_per_call_median']:.2f} ms"
        )
        lines.append("")
        for title, key in (
            ("op type", "by_op"),
            ("layer kind", "by_kind"),
            ("layer kind / op type", "by_kind_op"),
        ):
            lines.append(f"| {title} | ms | share |")
            lines.append("| --- | --- | --- |")
            for row in r[key][:top]:
                lines.append(f"| {row['name']} | {row['ms']:.3f} | {row['share'] * 100:.1f}% |")
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(PATTERNS), default="no-mlp")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/profile_decoder"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument(
        "--optimization", choices=["disable", "basic", "extended", "all"], default="all"
    )
    parser.add_argument(
        "--allow-spinning",
        choices=["0", "1"],
        default="1",
        help="onnxruntime's session.intra_op.allow_spinning (1 is its default)",
    )
    parser.add_argument(
        "--package", type=Path, help="profile this already exported package (of --variant)"
    )
    parser.add_argument("--reuse", action="store_true", help="keep and reuse the workdir")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()

    pattern = PATTERNS[args.variant]
    SPINNING["value"] = args.allow_spinning
    checkpoint, package = args.workdir / "checkpoint", args.workdir / "package"
    if args.package is None:
        workdir.claim_workdir(args.workdir, fresh=not args.reuse)
    export_s = None
    if args.package is not None:
        package = args.package
    else:
        if not (args.reuse and (checkpoint / "config.json").is_file()):
            make_checkpoint(checkpoint, pattern)
        start = time.perf_counter()
        export(checkpoint, package)
        export_s = time.perf_counter() - start
    result = {
        "variant": f"{args.variant} ({pattern})",
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "decode_tokens": args.decode_tokens,
        "graph_optimization": args.optimization,
        "allow_spinning": args.allow_spinning,
        "load_average_before": os.getloadavg(),
        "export_s": export_s,
        **load_figures(package, args.threads, args.optimization),
        "profile": run_profile(
            package,
            pattern,
            args.prompt_length,
            args.decode_tokens,
            args.threads,
            args.optimization,
        ),
    }
    result["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    table = markdown(result)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    print(table)
    print({k: v for k, v in result.items() if k != "profile"})
    if not args.reuse and args.package is None:
        workdir.release_workdir(args.workdir)


if __name__ == "__main__":
    main()
