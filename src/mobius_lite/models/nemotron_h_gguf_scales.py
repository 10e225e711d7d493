"""The `.scale` / `.input_scale` tensors llama.cpp writes beside NVFP4 weights of a Nemotron-H
GGUF, and which weights they belong to.

llama.cpp's converter turns ModelOpt's per-tensor `weight_scale_2` into an F32 tensor named
after the weight with `.weight` replaced by `.scale`: shape [1], or [n_expert] for stacked
experts (one value per expert), written only when it is not 1 (within 1e-6). Its graph
multiplies the weight's matmul output by it (for experts, by the selected experts' values).
Its loader reads a `.scale` for attention q/k/v/o, ffn up/down, the shared and stacked
experts, ssm_in/ssm_out, and `output.scale` when `output` is NVFP4.

- The latent projections (ffn_latent_down / ffn_latent_up): the converter writes their
  `.scale` too, and llama.cpp's loader then refuses the file (its latent matmuls take no
  scale). This export applies it with the converter's meaning: the weight is
  `blocks x scale`, as ModelOpt's `weight_scale_2` says.
- `.input_scale` is ModelOpt's static activation scale, for 4-bit activations. llama.cpp
  reads it and no graph uses it; this export computes weight-only, so it is recorded as
  deliberately unused (sources/gguf_open.py's rule), after the checks here.
- A scale beside any other tensor, one without its weight, a mis-shaped or non-F32 one, or
  `output.scale` on an output that is not NVFP4 (llama.cpp would not read it): one error
  listing them, raised from the headers before anything is read.
"""

from __future__ import annotations

import re
from typing import Any

from mobius_lite.errors import CheckpointError
from mobius_lite.listing import format_names

SCALE, INPUT_SCALE = ".scale", ".input_scale"
WEIGHT = ".weight"
OUTPUT = "output"
NVFP4 = "NVFP4"

# Block tensors (after `blk.N.`) whose matmul llama.cpp scales by `<name>.scale`.
SCALED_BLOCK_WEIGHTS = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_up",
    "ffn_down",
    "ffn_up_shexp",
    "ffn_down_shexp",
    "ffn_up_exps",
    "ffn_down_exps",
    "ssm_in",
    "ssm_out",
    # not read by llama.cpp's loader (it refuses the file); applied here (module docstring)
    "ffn_latent_down",
    "ffn_latent_up",
)
STACKED_WEIGHTS = ("ffn_up_exps", "ffn_down_exps")
BLOCK_SIDECAR = re.compile(r"^blk\.\d+\.(?P<base>[a-z_]+)(?:\.scale|\.input_scale)$")


def sidecar_kind(name: str) -> str | None:
    """SCALE or INPUT_SCALE when `name` is a sidecar tensor's name, else None."""
    for kind in (INPUT_SCALE, SCALE):
        if name.endswith(kind):
            return kind
    return None


def weight_of(name: str) -> str:
    """The weight a sidecar belongs to: `.scale` / `.input_scale` replaced by `.weight`."""
    kind = sidecar_kind(name)
    assert kind is not None
    return name.removesuffix(kind) + WEIGHT


def _problem(checkpoint: Any, name: str, available: set[str]) -> str | None:
    """Why sidecar `name` is not one this export applies (or deliberately ignores)."""
    weight = weight_of(name)
    match = BLOCK_SIDECAR.match(name)
    if name.startswith(OUTPUT + "."):
        if weight not in available:
            return f"{name} (there is no {weight}: a tied output takes no scale)"
        stored = checkpoint.ggml_type(weight).name
        if stored != NVFP4:
            return f"{name} ({weight} is {stored}; llama.cpp reads output scales of NVFP4 only)"
    elif match is None or match["base"] not in SCALED_BLOCK_WEIGHTS:
        base = match["base"] if match else name.removesuffix(sidecar_kind(name) or "")
        return f"{name} ({base} takes no scale)"
    elif weight not in available:
        return f"{name} (there is no {weight})"
    stored_type = checkpoint.ggml_type(name).name
    if stored_type != "F32":
        return f"{name} (stored {stored_type}, llama.cpp's scales are F32)"
    shape = tuple(checkpoint.logical_shape(name))
    stacked = match is not None and match["base"] in STACKED_WEIGHTS
    expected = (checkpoint.logical_shape(weight)[0],) if stacked else (1,)
    if shape != expected:
        what = "one per expert" if stacked else "one value"
        return f"{name} (shape {list(shape)}, expected {list(expected)}: {what})"
    return None


def output_scales(checkpoint: Any) -> dict[str, str]:
    """weight GGUF name -> its `.scale` tensor, for every scale the export applies.

    One CheckpointError lists every sidecar that cannot be applied (see the module docstring);
    `.input_scale` tensors are checked the same way, then left unused.
    """
    names = checkpoint.names()
    available = set(names)
    problems = [
        problem
        for problem in (_problem(checkpoint, n, available) for n in names if sidecar_kind(n))
        if problem is not None
    ]
    if problems:
        shown = format_names(problems)
        raise CheckpointError(
            f"{len(problems)} GGUF scale tensor(s) cannot be applied: {shown}. Scales "
            "are F32 [1] ([n_expert] for stacked experts) beside attention q/k/v/o, ffn "
            "up/down, shared and stacked experts, ssm_in/ssm_out, the latent projections or "
            "an NVFP4 output; re-convert the checkpoint with llama.cpp's converter"
        )
    return {weight_of(n): n for n in names if sidecar_kind(n) == SCALE}
