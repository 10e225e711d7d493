"""`mobius build`: export a checkpoint (local directory or pinned hub id) to an ONNX package."""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path

from mobius_lite.build import SUPPORTED_TASKS, BuildWarning, build
from mobius_lite.cli import COMMANDS
from mobius_lite.configs.model_types import MODEL_TYPES
from mobius_lite.enums import Backend, Precision
from mobius_lite.formats.quantize.recipe import QuantType
from mobius_lite.genai_config import genai_limitations
from mobius_lite.hub_pins import KNOWN_MODELS
from mobius_lite.media.tokenizer import TOKENIZER_FILE, vocabulary_mismatch
from mobius_lite.routes import EXECUTION_PROVIDERS
from mobius_lite.sizes import parse_size
from mobius_lite.weights.publish import check_destination
from mobius_lite.weights.writer import DEFAULT_SHARD_SIZE

DTYPES = tuple(p.value for p in Precision)

EPILOG = textwrap.dedent(
    """\
    examples:
      # a local checkpoint directory (config.json + *.safetensors)
      mobius build --model ./Nemotron-H-8B-Base-8K --output ./nemotron-h-8b-onnx

      # a hub id: fetched at its pinned commit (see the list below), config checked first
      mobius build --model nvidia/NVIDIA-Nemotron-Nano-9B-v2 --output ./nano9b --dtype f16

      # another commit, bf16 weights for onnxruntime's CUDA provider, 512 MB shards
      mobius build --model nvidia/NVIDIA-Nemotron-Nano-9B-v2 --revision main \\
          --output ./nano9b-cuda --dtype bf16 --ep cuda --shard-size 512MB --overwrite

      # offline, from an existing Hugging Face cache
      HF_HUB_OFFLINE=1 HF_HUB_CACHE=/data/hf/hub mobius build --model ORG/NAME --output ./pkg

    routes: --ep cpu runs f32 and f16; --ep cuda runs f32, f16 and bf16.
    Every check (config, tensor names and shapes, dtype/provider) runs before any weight is
    downloaded, read or written; on error nothing is left at --output.

    hub ids pinned by default (--revision overrides):
    """
) + "\n".join(
    f"  {m.model_id:<52} {m.revision[:12]}  {m.family}"
    for m in KNOWN_MODELS
    if m.family in MODEL_TYPES
)


def shard_size(text: str) -> int:
    """argparse type for --shard-size: a byte count or a size with a unit."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction) -> None:
    """The `build` subcommand and its options, in the order --help lists them."""
    p = sub.add_parser(
        "build",
        help=COMMANDS["build"],
        description="Export a Nemotron-H checkpoint to an ONNX package directory: model.onnx, "
        "its external weight shards, genai_config.json, config.json and the tokenizer files. "
        "Hub ids are resolved through huggingface_hub (HF_HOME, HF_HUB_CACHE and "
        "HF_HUB_OFFLINE apply) at a pinned commit for known models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_source_arguments(p)
    _add_route_arguments(p)
    _add_weight_arguments(p)
    _add_output_arguments(p)
    p.set_defaults(run=run)


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    """What to export and where: the checkpoint, its revision, the package directory, the task."""
    p.add_argument(
        "--model",
        required=True,
        metavar="ID_OR_PATH",
        help="checkpoint directory (config.json + *.safetensors), a llama.cpp .gguf file (or "
        "the first part of a split set), or a Hugging Face model id (org/name)",
    )
    p.add_argument(
        "--gguf-file",
        metavar="NAME",
        help="with a hub id: the GGUF file of that repository to export (e.g. model-Q4_K_M.gguf)",
    )
    p.add_argument(
        "--config",
        metavar="CONFIG_JSON",
        help="with a GGUF source: a config.json supplying the fields GGUF does not carry "
        "(chunk_size, time_step_limit, ...); every field GGUF does carry is cross-checked",
    )
    p.add_argument(
        "--revision",
        metavar="REV",
        help="hub commit SHA, branch or tag (default: the pinned commit for known ids, "
        "else main); not allowed with a local directory",
    )
    p.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="package directory to create (must not exist or be empty, unless --overwrite)",
    )
    p.add_argument(
        "--task",
        choices=SUPPORTED_TASKS,
        help="what to export (default: the model type's own: text-generation, the decoder with "
        "logits and cache I/O, for Nemotron-H and Puzzle; image-text-to-text, the Omni graphs, "
        "for nemotron_h_omni)",
    )


def _add_route_arguments(p: argparse.ArgumentParser) -> None:
    """How the graphs compute: element type, execution provider, operators, activations."""
    p.add_argument(
        "--dtype",
        default="f32",
        choices=DTYPES,
        help="element type of the exported weights and activations (default: %(default)s)",
    )
    p.add_argument(
        "--ep",
        default="cpu",
        choices=EXECUTION_PROVIDERS,
        help="onnxruntime execution provider the package targets; written into "
        "genai_config.json (default: %(default)s)",
    )
    p.add_argument(
        "--weights-backend",
        "--backend",
        dest="weights_backend",
        default=Backend.STANDARD.value,
        choices=[b.value for b in Backend],
        help="which operators the graphs use: standard = standard ONNX ops only (packed GGUF / "
        "NVFP4 / FP8 blocks decoded by them; any runtime), ort = onnxruntime's own com.microsoft "
        "ops where they exist (packed-weight kernels, and the Mamba conv and SSD kernels that "
        "onnxruntime's CPU provider runs natively: the faster CPU route) (default: %(default)s)",
    )
    p.add_argument(
        "--activations",
        default="exact",
        choices=["exact", "exact-fused", "int8"],
        help="with --backend ort (f32, cpu): exact = today's routes; exact-fused = packed "
        "matmuls on MatMulNBits over exact re-layouts and experts on the fused MoE / QMoE "
        "kernels, all with f32 activations (exact within f32 rounding); int8 = the same "
        "kernels quantizing activations to int8 per block, as llama.cpp does (not exact; "
        "docs/gguf.md). The fused experts store every up row twice: 1.5x their bytes. A weight "
        "with no exact re-layout stays on the exact route, said at build "
        "(default: %(default)s)",
    )


def _add_weight_arguments(p: argparse.ArgumentParser) -> None:
    """How the weights are stored: quantized at export, the MTP head's route, dequantized."""
    p.add_argument(
        "--quantize",
        choices=[t.value for t in QuantType],
        metavar="TYPE",
        help="quantize a dense safetensors checkpoint while writing it: q8_0 / q4_0 are "
        "llama.cpp's own, bit for bit, on the tensors llama-quantize --pure quantizes "
        "(docs/quantize.md); they then take every route of that ggml type (--backend, "
        "--activations) as a GGUF of it would. int4 / int8 are onnxruntime-genai's builder's "
        "MatMulNBits blocks. Refused for GGUF and ModelOpt sources (see --quantize-output)",
    )
    p.add_argument(
        "--quantize-block-size",
        type=int,
        metavar="N",
        help="int4 / int8: elements per block along K, 16 to 256 (default 32)",
    )
    p.add_argument(
        "--quantize-asymmetric",
        action="store_true",
        help="int4 / int8: asymmetric blocks with uint8 zero points (default symmetric)",
    )
    p.add_argument(
        "--quantize-output",
        choices=[t.value for t in QuantType],
        metavar="TYPE",
        help="with --quantize: lm_head's type instead (as llama-quantize --output-tensor-type; "
        "int8 with int4 as onnxruntime-genai's last_matmul:int8). Alone: lm_head only, every "
        "other tensor as the checkpoint stores it: for a ModelOpt (NVFP4 / FP8 / mixed) "
        "checkpoint, whose lm_head the releases keep dense (BF16), e.g. q8_0 as llama.cpp keeps "
        "it, on MatMulNBits under --backend ort (int8 activations with --activations int8). "
        "Refused for GGUF files and a ModelOpt lm_head stored packed",
    )
    p.add_argument(
        "--draft-head",
        default="exact",
        choices=["exact", "fast"],
        help="the MTP head's route (checkpoints with one): fast = its projections on the "
        "int8-activation kernels (packed weights as stored; dense ones as int8 blocks made when "
        "the head's session is created; --backend ort, f32, cpu): cheaper drafts, the same "
        "tokens (docs/speculative.md) (default: %(default)s)",
    )
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="store packed weights as dense --dtype weights instead (never done unless asked); "
        "ModelOpt FP8: the E4M3 values as float32 with each weight_scale applied to the "
        "output (4 bytes per weight); ModelOpt NVFP4 is refused",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """How the package is written: shard size, overwrite, non-finite weights, quiet."""
    p.add_argument(
        "--shard-size",
        type=shard_size,
        default=DEFAULT_SHARD_SIZE,
        metavar="SIZE",
        help="largest external-data shard: bytes, or with a unit (512MB, 1GiB; default 1GiB)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing non-empty --output (the old package stays until the new one "
        "is complete)",
    )
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="export even if weights hold NaN or infinite values (default: refuse, naming the "
        "tensors; the counts are recorded in manifest.json either way)",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="print nothing but errors (no progress bar)"
    )


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    check_destination(output, args.overwrite)  # before any download or read
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", BuildWarning)
        package = build(
            args.model,
            dtype=args.dtype,
            revision=args.revision,
            ep=args.ep,
            task=args.task,
            weights_backend=args.weights_backend,
            dequantize=args.dequantize,
            gguf_file=args.gguf_file,
            config=args.config,
            activations=args.activations,
            quantize=args.quantize,
            quantize_output=args.quantize_output,
            quantize_block_size=args.quantize_block_size,
            quantize_asymmetric=args.quantize_asymmetric,
            draft_head=args.draft_head,
        )
    for warning in said:  # the build's own warnings, one line each (e.g. an absent MTP head)
        if issubclass(warning.category, BuildWarning):
            print(f"warning: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    source = package.metadata.get("source", {})
    for fallback in package.metadata.get("quantization", {}).get("fallbacks", []):
        print(f"note: {fallback}", file=sys.stderr)
    if not args.quiet:
        revision = source.get("revision") or "(local directory, no revision)"
        print(f"source: {source.get('model', args.model)}")
        print(f"revision: {revision}")
    for problem in genai_limitations(package.config, package.precision):
        print(f"warning: {problem}; the package runs in onnxruntime", file=sys.stderr)
    tokenizer = package.extra_files.get(TOKENIZER_FILE)
    mismatch = tokenizer and vocabulary_mismatch(tokenizer, package.config.vocab_size)
    if mismatch:
        print(f"warning: {mismatch}", file=sys.stderr)
    try:
        out = package.save(
            output,
            shard_size=args.shard_size,
            overwrite=args.overwrite,
            quiet=args.quiet,
            allow_nonfinite=args.allow_nonfinite,
        )
    except KeyboardInterrupt as exc:
        args.published = getattr(exc, "published", None)  # arrived during the final renames
        raise
    args.published = out  # from here a signal no longer undoes anything (cli/main.py)
    if not args.quiet:
        print(f"wrote {out} ({args.dtype}, ep {args.ep})")
    return 0
