"""What the benchmark scripts share, each once: the "mid" model (its config, its random
checkpoint and export), one timed pass of llama.cpp on a GGUF file (mobius_lite.bench's
peer; a package's is mobius_lite.bench's PackagePeer), opening a package's decoder,
timing calls, a timed greedy decode and a timed `mobius build` in a child process, and
llama.cpp's own tools on a checkpoint: a save_pretrained byte-level BPE tokenizer beside it,
the converter (convert_hf_to_gguf.py of a llama.cpp source tree) and the quantizer
(llama-cpp-python's llama_model_quantize); and the CPU a recorded run ran on.

The onnxruntime session options, the --workdir guard and the decode-attribution graph edits
are mobius_lite.bench's (session_options, workdir, attribution).
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.layout import DECODER_FILE, MANIFEST_FILE

# The "mid" config (issue 2): hidden 1024, 12 layers, 64 routed experts top-4, vocab 32000;
# 383.7 M parameters. Letters of PATTERNS: M Mamba2, E MoE, * attention, - MLP.
MID: dict[str, Any] = dict(
    vocab_size=32000,
    hidden_size=1024,
    mamba_num_heads=32,
    mamba_head_dim=64,
    ssm_state_size=64,
    n_groups=4,
    conv_kernel=4,
    chunk_size=128,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=2048,
    n_routed_experts=64,
    num_experts_per_tok=4,
    moe_intermediate_size=512,
    moe_shared_expert_intermediate_size=1024,
    moe_latent_size=None,
    n_group=1,
    topk_group=1,
)
# smoke-run widths (--size tiny): the same layer patterns, small matrices
TINY: dict[str, Any] = {
    **MID,
    "hidden_size": 256,
    "moe_intermediate_size": 256,
    "n_routed_experts": 8,
    "intermediate_size": 256,
    "vocab_size": 512,
    "mamba_num_heads": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "moe_shared_expert_intermediate_size": 256,
    "chunk_size": 16,
}
# "no-mlp": llama.cpp builds every nemotron_h_moe FFN layer as MoE, so the GGUF comparisons
# drop the dense MLP layers
PATTERNS = {"mid": "ME*-MEME*ME-", "no-mlp": "ME*MEME*ME"}
LAYER_KINDS = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
MID["layers_block_type"] = [LAYER_KINDS[c] for c in PATTERNS["mid"]]
TINY["layers_block_type"] = MID["layers_block_type"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "state space models, 1234!"] * 8

PEAK_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")

# llama.cpp's converter run from a source tree (argv: TREE, then the converter's arguments),
# its conversion package and gguf-py first on the path. The converter identifies a BPE
# vocabulary by a hash of its pre-tokenizer, and a random test vocabulary has none it knows:
# this answers that one question "gpt-2" (get_vocab_base_pre); the tensors are converted by
# the converter's own code.
CONVERT_HF = """
import runpy, sys
tree = sys.argv[1]
sys.path[:0] = [tree, tree + "/gguf-py"]
import conversion.base as base
for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
        cls.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(tree + "/convert_hf_to_gguf.py", run_name="__main__")
"""
# llama_quantize (below) in a child process (argv: this folder, SOURCE, OUT, FTYPE, THREADS)
QUANTIZE = """
import sys
sys.path.insert(0, sys.argv[1])
from common import llama_quantize
llama_quantize(sys.argv[2], sys.argv[3], sys.argv[4], threads=int(sys.argv[5]))
"""


def open_package(package: Path, options: Any, model_file: Path | None = None) -> tuple[Any, float]:
    """(DecoderSession over the package's decoder, seconds its creation took); `model_file`:
    another decoder graph. The session reads its inputs' dtypes and cache shapes itself."""
    from mobius_lite.run.decoder_session import DecoderSession

    start = time.perf_counter()
    session = DecoderSession(model_file or package / DECODER_FILE, session_options=options)
    return session, time.perf_counter() - start


# the CPU features the int8 and f32 kernels' speed depends on (int8 dot products, AVX-512, AMX)
CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_description() -> str:
    """The CPU as a recorded run should name it: model name, logical CPU count and which of
    CPU_FEATURES it has (/proc/cpuinfo; the platform's processor string where that is
    missing). The int8 routes' ratios to f32 depend on these, so runs on different CPUs are
    told apart."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()}, {platform.processor() or 'cpu'}, {os.cpu_count()} CPUs"
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    have = [feature for feature in CPU_FEATURES if feature in flags]
    name = fields.get("model name", platform.processor() or platform.machine())
    return f"{name}, {os.cpu_count()} CPUs, {' '.join(have) or 'none of ' + str(CPU_FEATURES)}"


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of fn()."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class TimedDecode:
    """Wall seconds of each greedy decode step and the tokens it chose (batch row 0)."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def median_after_first(self) -> float:
        """The median step time without the first step (its allocations stay out)."""
        return statistics.median(self.seconds[1:])


def timed_decode(
    session: Any,
    logits: np.ndarray,
    steps: int,
    each: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> TimedDecode:
    """`steps` greedy decode calls of a DecoderSession after the call that gave `logits`
    ([batch, sequence, vocab]); `each` sees every step's outputs."""
    timed = TimedDecode()
    token = logits[:, -1].argmax(-1)[:, None]
    for _ in range(steps):
        start = time.perf_counter()
        out = session.step(token.astype(np.int64))
        timed.seconds.append(time.perf_counter() - start)
        if each is not None:
            each(out)
        token = out["logits"][:, -1].argmax(-1)[:, None]
        timed.tokens.append(int(token[0, 0]))
    return timed


def timed_command(cmd: Sequence[str], what: str) -> tuple[float, float | None]:
    """(wall seconds, peak resident MiB) of `cmd` in a child process under /usr/bin/time -v;
    SystemExit naming `what` with the end of its stderr when it fails."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-4000:]}")
    rss = PEAK_RSS.search(proc.stderr)
    return wall, int(rss[1]) / 1024 if rss else None


def timed_export(model: Path, output: Path, flags: Sequence[str] = ()) -> dict[str, Any]:
    """`mobius build --model MODEL --output OUTPUT --overwrite -q FLAGS...` in a child process
    under /usr/bin/time: wall seconds, peak resident MiB and the weight bytes written."""
    cmd = [sys.executable, "-m", "mobius_lite.cli.main", "build"]
    cmd += ["--model", str(model), "--output", str(output), "--overwrite", "--quiet", *flags]
    wall, rss = timed_command(cmd, "export")
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    return {
        "export_wall_s": wall,
        "export_peak_rss_mib": rss,
        "package_weight_bytes": manifest["totals"]["bytes_written"],
    }


def mid_config(pattern: str = "mid", size: str = "mid") -> dict[str, Any]:
    """The transformers NemotronHConfig keywords of MID (or TINY) with a PATTERNS layer pattern
    (a PATTERNS key or the letters themselves)."""
    letters = PATTERNS.get(pattern, pattern)
    widths = TINY if size == "tiny" else MID
    return {**widths, "layers_block_type": [LAYER_KINDS[c] for c in letters]}


def make_checkpoint(
    directory: Path, pattern: str = "mid", size: str = "mid", seed: int = 0, **overrides: Any
) -> Any:
    """A random transformers NemotronH checkpoint of the mid config at `directory`, eager
    attention and experts, the routers spread (normal, std 0.05) so that routing is not
    degenerate; returns the model. `overrides`: further config keywords (widths, an MTP
    layer: num_nextn_predict_layers=1)."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(**{**mid_config(pattern, size), **overrides})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.block_type == "moe":
                layer.mixer.gate.weight.normal_(0.0, 0.05)
    model.save_pretrained(directory)
    return model


def export(checkpoint: Path, package: Path, backend: str = "standard") -> Path:
    """checkpoint -> package (f32, weights on `backend`) with the library's Python entry point."""
    import mobius_lite

    built = mobius_lite.build(checkpoint, dtype="f32", weights_backend=backend)
    return built.save(package, overwrite=True, quiet=True)


def write_f32_gguf(path: Path, model: Any) -> Path:
    """`model` (a transformers NemotronH without dense MLP layers) as an F32 nemotron_h_moe
    GGUF in the converter's layout, with a small BPE vocabulary (llama.cpp refuses a file
    without one)."""
    from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, write_gguf

    tokenizer = build_bpe_tokenizer(["the quick brown fox jumps over the lazy dog"] * 8)
    write_gguf(path, model, "nemotron_h_moe", tokenizer=tokenizer)
    return path


def prompt_ids(length: int, vocab_size: int = MID["vocab_size"], seed: int = 0) -> list[int]:
    """`length` token ids drawn with a fixed seed (ids 0-2 left out: the special tokens)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab_size, size=length)]


def run_llamacpp(
    gguf: Path, prompt: list[int], decode_tokens: int, threads: int, gpu: bool = False
) -> dict[str, Any]:
    """One warmed-up greedy pass of llama.cpp on a GGUF file (llama-cpp-python, every layer
    on the GPU with `gpu`), as `mobius bench --gguf` times it: load seconds, prefill ms,
    median decode ms/token, the tokens."""
    from mobius_lite.bench.llamacpp_peer import LlamaCppPeer

    peer = LlamaCppPeer(gguf, gpu, threads, len(prompt), decode_tokens)
    start = time.perf_counter()
    peer.open()
    load_s = time.perf_counter() - start
    peer.run(prompt, decode_tokens, lambda: None)  # warm-up
    timed = peer.run(prompt, decode_tokens, lambda: None)
    return {
        "load_s": load_s,
        "prefill_ms": timed.prefill_s * 1e3,
        "decode_ms_per_token": timed.ms_per_token,
        "tokens": timed.tokens,
    }


def save_bpe_tokenizer(directory: Path, corpus: list[str], vocab_size: int = 300) -> None:
    """A byte-level BPE trained on `corpus` (reference_fixtures' build_bpe_tokenizer: <pad>,
    <s>, </s> as ids 0-2), saved into `directory` as save_pretrained writes it
    (tokenizer.json, tokenizer_config.json): what llama.cpp's converter reads. The converter
    pads a vocabulary smaller than the config's vocab_size with unused [PAD<i>] tokens."""
    from transformers import PreTrainedTokenizerFast

    from reference_fixtures.gguf_fixtures import build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer(corpus, vocab_size=vocab_size)
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(directory)


def convert_command(tree: Path, checkpoint: Path, outfile: Path, outtype: str) -> list[str]:
    """The command line running `tree`'s convert_hf_to_gguf.py on `checkpoint` (CONVERT_HF):
    `--outtype OUTTYPE --outfile OUTFILE`."""
    script = [sys.executable, "-c", CONVERT_HF, str(tree), str(checkpoint)]
    return [*script, "--outtype", outtype, "--outfile", str(outfile)]


def llama_quantize(
    source: Path | str,
    out: Path | str,
    ftype: str,
    output_type: str | None = None,
    threads: int = 2,
) -> None:
    """llama.cpp's quantizer (llama-cpp-python's llama_model_quantize, as `llama-quantize
    --pure`: every tensor it quantizes at `ftype`, a LLAMA_FTYPE_* name) from the GGUF
    `source` to `out`; `output_type` (a GGML_TYPE_* name): the output tensor's type."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.pure = True
    params.nthread = threads
    if output_type is not None:
        params.output_tensor_type = getattr(llama_cpp, output_type)
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} as {ftype}")


def quantize_command(source: Path, out: Path, ftype: str, threads: int) -> list[str]:
    """The command line running llama_quantize (no output_type) in a child process."""
    here = str(Path(__file__).resolve().parent)
    return [sys.executable, "-c", QUANTIZE, here, str(source), str(out), ftype, str(threads)]
