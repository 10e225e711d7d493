r"""Where a decode step of the exported decoder goes: the real package next to graphs edited for
timing only, on onnxruntime CPU, in alternating fresh processes.

Variants (docs/performance.md, "Where a decode step goes"):
  standard          the package built with --backend standard
  ort               the package built with --backend ort (the fast CPU route)
  ort-no-experts    ort with each MoE layer's routed experts replaced by zeros
  ort-no-mamba      ort-no-experts with the Mamba conv and SSD kernels replaced by identities
  ort-moe-kernel    ort with each MoE layer's routed experts run by onnxruntime's com.microsoft
                    MoE CPU kernel on the same stacked weights and routing, with ReLU in place
                    of ReLU^2 (the CPU kernel has no relu2): what a ReLU^2 kernel would cost
  ort-fused         the real package built with --backend ort --activations exact-fused
                    (issue 22): the routed experts on that MoE kernel in its SwiGLU form of
                    ReLU^2, exact (fc1 rows twice, built at session creation)
  gemm-twin         one graph holding only the matrices a decode step reads (every constant
                    Gemm weight of the package, plus top-k slices of each stacked expert
                    tensor), random values, each as Gemm(x, W, transB=1)
  matmul-twin       the same matrices as MatMul(W, x^T)
  llama.cpp         llama.cpp on the workdir's F32 GGUF of the same weights
The edited graphs compute wrong numbers on purpose; only their time is read. Each process
measures prefill of --prompt-length tokens with every position's logits and with
logits_to_keep=1, then the median of --decode-tokens cached steps (wall and process CPU time).

Usage (the workdir keeps the checkpoint, F32 GGUF and packages; makes what is missing):
    python benchmarks/investigations/decode_breakdown.py --workdir /tmp/bench_cpu --rounds 3 \
        --json /tmp/decode_breakdown.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.formats.contrib import CONTRIB_DOMAIN
from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from common import export, make_checkpoint, open_package, prompt_ids, run_llamacpp, write_f32_gguf  # noqa: E402

from mobius_lite.bench.attribution import package_with_graph  # noqa: E402
from mobius_lite.bench.package_peer import session_options  # noqa: E402

PACKAGES = ("standard", "ort", "ort-fused", "ort-no-experts", "ort-no-mamba", "ort-moe-kernel")
TWINS = ("gemm-twin", "matmul-twin")
LLAMA_CPP = "llama.cpp"
MAMBA_KERNELS = ("LinearAttention", "CausalConvWithState")


# ----------------------------------------------------------------------------- graph edits
def without_experts(package: Path, out: Path) -> Path:
    """Each MoE layer's routed-experts If replaced by zeros shaped like its input rows."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    norm_out: dict[str, str] = {}
    nodes = []
    for node in model.graph.node:
        layer = re.search(r"layers\.(\d+)/", node.name)
        if layer and "/norm/RMSNormalization" in node.name:
            norm_out[layer[1]] = node.output[0]
        if node.op_type == "If" and "/mixer/experts/If" in node.name:
            assert layer is not None
            node = helper.make_node("Mul", [norm_out[layer[1]], "zero"], [node.output[0]])
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return package_with_graph(package, out, model)


def with_relu_moe_kernel(package: Path, out: Path) -> Path:
    """Each routed-experts If replaced by com.microsoft MoE (activation relu) on the layer's
    stacked up/down initializers. Its router_probs hold log(weight) at the selected experts
    and -inf elsewhere, so the kernel's softmax over them returns the graph's own
    (normalized) routing weights for the same experts."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"))
    k = json.loads((package / "config.json").read_text())["num_experts_per_tok"]
    seen: dict[str, dict[str, str]] = {}
    nodes = []
    for node in model.graph.node:
        layer = re.search(r"layers\.(\d+)/", node.name)
        found = seen.setdefault(layer[1], {}) if layer else {}
        if "/norm/RMSNormalization" in node.name:
            found["x"] = node.output[0]
        elif "/mixer/gate/Sigmoid" in node.name:
            found["scores"] = node.output[0]
        elif "/mixer/experts/Reshape" in node.name:
            found["weights" if "indices" in found else "indices"] = node.input[0]
        if not (node.op_type == "If" and "/mixer/experts/If" in node.name):
            nodes.append(node)
            continue
        assert layer is not None
        scope, f = f"moe_kernel_{layer[1]}", found
        weights = f"backbone.layers.{layer[1]}.mixer.experts"
        nodes += [
            helper.make_node("Shape", [f["scores"]], [f"{scope}/shape"]),
            helper.make_node("Expand", ["ninf", f"{scope}/shape"], [f"{scope}/ninf"]),
            helper.make_node("Log", [f["weights"]], [f"{scope}/log_weights"]),
            helper.make_node(
                "ScatterElements",
                [f"{scope}/ninf", f["indices"], f"{scope}/log_weights"],
                [f"{scope}/probs"],
                axis=1,
            ),
            helper.make_node(
                "MoE",
                [f["x"], f"{scope}/probs", f"{weights}.up_proj", "", f"{weights}.down_proj"],
                [node.output[0]],
                domain=CONTRIB_DOMAIN,
                k=k,
                activation_type="relu",
                normalize_routing_weights=0,
            ),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return package_with_graph(package, out, model)


def without_mamba_kernels(package: Path, out: Path) -> Path:
    """LinearAttention / CausalConvWithState replaced by identities of their main input and
    past state (same shapes)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    nodes = []
    for node in model.graph.node:
        if node.op_type in MAMBA_KERNELS:
            main = node.input[2] if node.op_type == "LinearAttention" else node.input[0]
            nodes.append(helper.make_node("Identity", [main], [node.output[0]]))
            nodes.append(helper.make_node("Identity", [node.input[3]], [node.output[1]]))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return package_with_graph(package, out, model)


def step_matrices(package: Path) -> list[tuple[int, int]]:
    """[out, in] of every matrix one decode step reads: constant Gemm weights of the main graph
    and, per stacked expert tensor, top-k of its experts."""
    import onnx

    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    dims = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    shapes = [
        dims[n.input[1]] for n in model.graph.node if n.op_type == "Gemm" and n.input[1] in dims
    ]
    k = json.loads((package / "config.json").read_text())["num_experts_per_tok"]
    for name, d in dims.items():
        if name.endswith(("experts.up_proj", "experts.down_proj")):
            shapes += [d[1:]] * k
    return [s for s in shapes if len(s) == 2]


def matrices_twin(shapes: list[tuple[int, int]], form: str, out: Path) -> Path:
    """Random matrices of `shapes`, each applied to the graph input of its width."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, outputs, widths = [], [], [], sorted({k for _, k in shapes})
    for i, (n, k) in enumerate(shapes):
        w = f"W{i}"
        inits.append(numpy_helper.from_array(rng.standard_normal((n, k), np.float32) * 0.01, w))
        if form == "gemm-twin":
            nodes.append(helper.make_node("Gemm", [f"x{k}", w], [f"y{i}"], transB=1))
        else:
            nodes.append(helper.make_node("MatMul", [w, f"x{k}T"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    if form == "matmul-twin":
        nodes += [helper.make_node("Transpose", [f"x{k}"], [f"x{k}T"], perm=[1, 0]) for k in widths]
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in widths]
    graph = helper.make_graph(nodes, form, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / DECODER_FILE), save_as_external_data=True, location="model.data")
    return out


# ----------------------------------------------------------------------------- child runs
def time_variant(path: Path, config_dir: Path, threads: int, prompt: int, decode: int) -> dict:
    from mobius_lite.configs import NemotronHConfig

    config = NemotronHConfig.from_file(config_dir)
    session, _ = open_package(path, session_options(threads))
    ids = np.random.default_rng(0).integers(3, config.vocab_size, size=(1, prompt))
    prefill = {}
    for keep in (0, 1, 0, 1):
        session.reset(1)
        start = time.perf_counter()
        out = session.step(ids, logits_to_keep=keep)
        prefill.setdefault(keep, []).append(time.perf_counter() - start)
    token, wall, cpu = int(out["logits"][0, -1].argmax()), [], []
    for _ in range(decode):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = session.step(np.array([[token]]))
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        token = int(out["logits"][0, -1].argmax())
    return {
        "prefill_all_logits_s": min(prefill[0]),
        "prefill_last_logits_s": min(prefill[1]),
        "decode_s": statistics.median(wall[1:]),
        "decode_cpu_s": statistics.median(cpu[1:]),
    }


def run_twin(path: Path, threads: int, decode: int) -> dict:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path / DECODER_FILE), session_options(threads))
    feeds = {i.name: np.ones((1, i.shape[1]), np.float32) for i in session.get_inputs()}
    session.run(None, feeds)
    wall = []
    for _ in range(decode):
        start = time.perf_counter()
        session.run(None, feeds)
        wall.append(time.perf_counter() - start)
    return {"decode_s": statistics.median(wall[1:])}


# ----------------------------------------------------------------------------- driver
GGUF_FILE = "model-f32.gguf"


def package_dir(work: Path, backend: str) -> Path:
    return work / f"package-{backend}"


def prepare(work: Path) -> None:
    """The no-mlp mid checkpoint, its f32 packages (standard and ort) and its F32 GGUF, each
    made when missing."""
    model = None
    if not (work / "checkpoint" / "config.json").is_file():
        model = make_checkpoint(work / "checkpoint", "no-mlp")
    for backend in ("standard", "ort"):
        if not (package_dir(work, backend) / DECODER_FILE).is_file():
            export(work / "checkpoint", package_dir(work, backend), backend)
    if not (work / GGUF_FILE).is_file():
        if model is None:
            from transformers import NemotronHForCausalLM

            model = NemotronHForCausalLM.from_pretrained(work / "checkpoint")
        write_f32_gguf(work / GGUF_FILE, model)


def variants(work: Path) -> dict[str, Path]:
    """Every variant's directory, made when missing."""
    out = {name: package_dir(work, name) for name in ("standard", "ort")}
    edits = work / "breakdown"
    if not (edits / "ort-no-experts" / DECODER_FILE).is_file():
        without_experts(out["ort"], edits / "ort-no-experts")
    if not (edits / "ort-no-mamba" / DECODER_FILE).is_file():
        without_mamba_kernels(edits / "ort-no-experts", edits / "ort-no-mamba")
    if not (edits / "ort-moe-kernel" / DECODER_FILE).is_file():
        with_relu_moe_kernel(out["ort"], edits / "ort-moe-kernel")
    for name in ("ort-no-experts", "ort-no-mamba", "ort-moe-kernel"):
        out[name] = edits / name
    out["ort-fused"] = package_dir(work, "ort-fused")
    if not (out["ort-fused"] / "model.onnx").is_file():
        import mobius_lite

        built = mobius_lite.build(
            work / "checkpoint", weights_backend="ort", activations="exact-fused"
        )
        built.save(out["ort-fused"], overwrite=True, quiet=True)
    shapes = step_matrices(out["ort"])
    for twin in TWINS:
        if not (edits / twin / DECODER_FILE).is_file():
            matrices_twin(shapes, twin, edits / twin)
        out[twin] = edits / twin
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_cpu"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        path = Path(args.child)
        if args.child == LLAMA_CPP:
            ran = run_llamacpp(args.workdir / GGUF_FILE, prompt_ids(args.prompt_length),
                               args.decode_tokens, args.threads)  # fmt: skip
            result = {
                "prefill_last_logits_s": ran["prefill_ms"] / 1e3,
                "decode_s": ran["decode_ms_per_token"] / 1e3,
            }
        elif path.name in TWINS:
            result = run_twin(path, args.threads, args.decode_tokens)
        else:
            config_dir = package_dir(args.workdir, "ort")
            result = time_variant(path, config_dir, args.threads, args.prompt_length,
                                 args.decode_tokens)  # fmt: skip
        print(json.dumps(result))
        return

    prepare(args.workdir)
    paths = {**variants(args.workdir), LLAMA_CPP: Path(LLAMA_CPP)}
    names = [*PACKAGES, *TWINS, LLAMA_CPP]
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        record = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cmd = [sys.executable, __file__, "--child", str(paths[name]), "--workdir",
                   str(args.workdir), "--threads", str(args.threads), "--prompt-length",
                   str(args.prompt_length), "--decode-tokens", str(args.decode_tokens)]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            record[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"round {r} {name:16s} {json.dumps(record[name])}", file=sys.stderr, flush=True)
        rounds.append(record)
    summary = {
        name: {key: statistics.median(r[name][key] for r in rounds) for key in rounds[0][name]}
        for name in names
    }
    for name in names:  # what each decode figure is against llama.cpp's, round by round
        summary[name]["decode_ratio_to_llama_cpp"] = statistics.median(
            r[name]["decode_s"] / r[LLAMA_CPP]["decode_s"] for r in rounds
        )
    result = {
        "command": " ".join(["python", __file__, *sys.argv[1:]]),
        "load_average": os.getloadavg(),
        "median_over_rounds": summary,
        "rounds": rounds,
    }
    for name in names:
        figures = ", ".join(
            f"{k} {v:.2f}x" if k.endswith("ratio_to_llama_cpp") else f"{k} {v * 1e3:.1f} ms"
            for k, v in summary[name].items()
        )
        print(f"{name:16s} {figures}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
