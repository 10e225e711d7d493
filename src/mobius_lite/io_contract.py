"""The names of a package's graph inputs and outputs (docs/decoder_contract.md, docs/omni.md).

Graph builders (graphs/) name their tensors with these and the runtime (run/) feeds and reads
them by the same constants, so one spelling serves both sides. The names are the package
format: changing one changes every package's bytes and breaks onnxruntime-genai.
"""

from __future__ import annotations

# The decoder (and the MTP head: input_ids, hidden_states, attention_mask -> logits)
INPUT_IDS = "input_ids"
INPUTS_EMBEDS = "inputs_embeds"  # a decoder fed embeddings (Omni), the embedding graph's output
ATTENTION_MASK = "attention_mask"  # past + current positions
LOGITS = "logits"
# Optional int64 scalar: logits of the last that many positions only (0, its default: all).
LOGITS_TO_KEEP = "logits_to_keep"
# The decoder's final-normed hidden state [batch, sequence, hidden], the MTP head's input.
HIDDEN_STATES = "hidden_states"
# The head's own hidden state, fed back with the previous draft for the next draft.
MTP_HIDDEN_STATES = "mtp_hidden_states"
# Per-block outputs of an instrumented decoder: hidden_states.{i}.
LAYER_HIDDEN_PREFIX = "hidden_states."

# The cache: past_key_values.{layer}.{role} in, present.{layer}.{role} out. Packages with a
# speculation window also return, for a short call, either a Mamba layer's recurrence inputs
# at each position, window_input.{layer}.{input} (the runtime re-derives the state after any
# prefix from them: run/state_rewind.py), or, from onnxruntime's state_window kernels (CUDA),
# each Mamba state after each position, present_window.{layer}.{role}.
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
WINDOW_PREFIX = "present_window."
WINDOW_INPUT_PREFIX = "window_input."
# Decoder metadata of a package with window inputs: the domain of its recurrence op
# (LinearAttention), which the runtime's state rewind must run for the same kernel.
RECURRENCE_DOMAIN = "mobius_lite.recurrence_domain"
# Decoder metadata: calls of up to this many positions compute each position exactly as a
# one-position call does (an int8-activation decoder's experts run row by row:
# components/row_by_row.py); absent, a verifying call agrees with steps to rounding only.
ROW_BY_ROW_WINDOW = "mobius_lite.row_by_row_window"

# The Omni media graphs and the embedding graph's media inputs.
PIXEL_VALUES = "pixel_values"
IMAGE_GRID_HW = "image_grid_hw"
IMAGE_FEATURES = "image_features"
PIXEL_VALUES_VIDEOS = "pixel_values_videos"
VIDEO_FEATURES = "video_features"
VIDEO_RETENTION_MASK = "video_retention_mask"
INPUT_FEATURES = "input_features"
INPUT_FEATURES_MASK = "input_features_mask"
AUDIO_FEATURES = "audio_features"


def past_name(layer: int | str, role: str) -> str:
    """past_key_values.{layer}.{role}: a cache input."""
    return f"{PAST_PREFIX}{layer}.{role}"


def present_name(layer: int | str, role: str) -> str:
    """present.{layer}.{role}: the cache output that is the next call's past."""
    return f"{PRESENT_PREFIX}{layer}.{role}"


def window_name(layer: int | str, role: str) -> str:
    """present_window.{layer}.{role}: a state after each position of a short call."""
    return f"{WINDOW_PREFIX}{layer}.{role}"


def window_input_name(layer: int | str, recurrence_input: str) -> str:
    """window_input.{layer}.{input}: a Mamba layer's recurrence input at each position of a
    short call."""
    return f"{WINDOW_INPUT_PREFIX}{layer}.{recurrence_input}"


def layer_of(past: str) -> str:
    """The layer part of a past_key_values.{layer}.{role} name ("3", "mtp.0")."""
    return past.removeprefix(PAST_PREFIX).rsplit(".", 1)[0]


def is_window_output(name: str) -> bool:
    """Whether a decoder output is a speculation window's (present_window.* or
    window_input.*): a runtime aid with no reference array."""
    return name.startswith((WINDOW_PREFIX, WINDOW_INPUT_PREFIX))


def present_of(past: str) -> str:
    """The present output paired with a past_key_values.* input."""
    return PRESENT_PREFIX + past.removeprefix(PAST_PREFIX)


def window_of(past: str) -> str:
    """The present_window output of a past_key_values.* input (when the graph has one)."""
    return WINDOW_PREFIX + past.removeprefix(PAST_PREFIX)
