"""Which Nemotron-H tensors `--quantize` quantizes: llama.cpp's rules, on checkpoint names.

llama-quantize (src/llama-quant.cpp, tensor_allows_quantization) quantizes a tensor only when
it has at least 2 dimensions, its name ends in "weight" and it is none of: a norm
(`*_norm.weight`), the MoE router (`ffn_gate_inp.weight`), the Mamba conv1d (`ssm_conv1d`).
With `--pure` every such tensor takes the one type, the embedding (`token_embd`) and the
output projection (`output.weight`) included; `--output-tensor-type` sets lm_head's.
`--quantize-output` alone (an output-only plan) quantizes lm_head only, by the same rules.
For Nemotron-H's checkpoint names (docs/quantize.md has the table):
- quantized: the embedding (not Omni's, whose embedding graph looks rows up in the build's
  dtype), lm_head (or the output recipe), every projection of the Mamba, attention, MLP and
  MoE layers (experts, latent and shared-expert projections), and the MTP head's;
- kept: norms (norm, norm_f, enorm, hnorm, final_layernorm, the Mamba gated norm), the MoE
  router (mixer.gate.weight), conv1d, the 1-D tensors (A_log, D, dt_bias, biases) and
  everything outside the language model (Omni's towers and projectors: llama.cpp's mmproj).

A row (the last axis: ggml's ne[0]) that does not hold whole 32-element blocks has no Q8_0 /
Q4_0 form: llama-quantize stops with "no tensor type fallback is defined" for these types and
falls back to F16 for the others. The export keeps such a tensor in the build's dtype and
names it (`QuantizeChoice.fallbacks`).

int4 / int8 follow onnxruntime-genai's builder, which quantizes the MatMul weights: the same
tensors but the embedding table (a Gather there), with the recipe's block for the rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mobius_lite.formats.quantize.recipe import QuantizePlan, Recipe
from mobius_lite.sources.base import TensorSource

OMNI_LANGUAGE = "language_model."
LANGUAGE_PREFIXES = ("backbone.", "model.", "lm_head.", "mtp.")
OUTPUT_WEIGHT = "lm_head.weight"
EMBEDDING = re.compile(r"^(backbone|model)\.embeddings\.weight$")
STACKED_EXPERTS = re.compile(r"\.experts\.(up|down)_proj$")
# (pattern, why llama.cpp keeps it), tried on the name without the Omni prefix
KEPT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"norm(_f)?\.weight$"), "a norm (llama.cpp keeps *_norm.weight)"),
    (re.compile(r"\.conv1d\."), "the Mamba conv1d (llama.cpp keeps ssm_conv1d)"),
    (re.compile(r"\.mixer\.gate\.weight$"), "the MoE router (llama.cpp keeps ffn_gate_inp)"),
)


@dataclass(frozen=True)
class QuantizeChoice:
    """The recipe of every tensor to quantize, and the tensors kept dense because their rows
    are not whole blocks (name -> the sentence said about it)."""

    recipes: dict[str, Recipe]
    fallbacks: dict[str, str] = field(default_factory=dict)


def kept_reason(name: str, shape: tuple[int, ...]) -> str | None:
    """Why llama.cpp keeps this checkpoint tensor unquantized, or None when it quantizes it."""
    omni = name.startswith(OMNI_LANGUAGE)
    bare = name.removeprefix(OMNI_LANGUAGE)
    if not bare.startswith(LANGUAGE_PREFIXES):
        return "not the language model (encoders and projectors keep the build's dtype)"
    if len(shape) < 2:
        return "1-D"
    if not (bare.endswith("weight") or STACKED_EXPERTS.search(bare)):
        return "not a weight"
    for pattern, reason in KEPT:
        if pattern.search(bare):
            return reason
    if omni and EMBEDDING.match(bare):
        return "Omni's embedding graph looks its rows up in the build's dtype"
    return None


def choose_quantization(source: TensorSource, plan: QuantizePlan) -> QuantizeChoice:
    """The tensors of `source` llama-quantize --pure would quantize, with their recipes
    (lm_head: the plan's output recipe; an output-only plan: lm_head alone), from the index
    alone (no tensor data is read)."""
    recipes: dict[str, Recipe] = {}
    fallbacks: dict[str, str] = {}
    for name in source.names():
        shape = tuple(source.info(name).shape)
        if kept_reason(name, shape) is not None:
            continue
        bare = name.removeprefix(OMNI_LANGUAGE)
        recipe = plan.recipe_of(output=bare == OUTPUT_WEIGHT)
        if recipe is None:
            continue  # an output-only plan: kept as the checkpoint stores it
        if EMBEDDING.match(bare) and not recipe.type.is_ggml:
            continue  # onnxruntime-genai's builder quantizes MatMul weights, not the Gather
        block = recipe.block
        if shape[-1] % block:
            fallbacks[name] = (
                f"{name}: rows of {shape[-1]} elements are not whole {block}-element blocks; "
                f"kept in the build's dtype instead of {recipe.type.value}"
            )
            continue
        recipes[name] = recipe
    return QuantizeChoice(recipes, fallbacks)
