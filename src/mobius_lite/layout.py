"""The names of the files in a package, written in this one place."""

from __future__ import annotations

from mobius_lite.enums import GraphRole

MANIFEST_FILE = "manifest.json"
GENAI_CONFIG_FILE = "genai_config.json"
# The overlay that makes genai_config.json the MTP head's own og.Model (docs/genai.md)
GENAI_MTP_OVERLAY_FILE = "genai_mtp_overlay.json"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
# Checkpoint files copied into the package unchanged when the source has them: tokenizer,
# generation and (Omni) processor configuration.
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
DECODER_FILE = GraphRole.DECODER.file_name
GRAPH_FILES = tuple(role.file_name for role in GraphRole)
