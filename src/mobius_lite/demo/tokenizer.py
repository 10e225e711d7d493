"""The demo checkpoints' tokenizer: a byte-level BPE (GPT-2's pre-tokenizer and byte alphabet)
trained with the `tokenizers` package on a few built-in sentences, so that every string
encodes and the files are what a real checkpoint ships (tokenizer.json, tokenizer_config.json).

Special tokens come first (ids 0, 1, 2 are pad, bos, eos, as Nemotron-H's config defaults
say), then the 256 byte tokens, then the learned merges up to `VOCAB_SIZE`."""

from __future__ import annotations

import json
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
# The Omni prompt markers (media/prompt.py's spelling) and its image / video placeholders.
OMNI_TOKENS = ("<image>", "<img>", "</img>", "<video>")
VOCAB_SIZE = 320  # specials + 256 bytes + merges learned from CORPUS
CORPUS = (
    "hello world, this is a tiny demo model with random weights.",
    "the quick brown fox jumps over the lazy dog.",
    "Nemotron-H mixes Mamba layers, attention layers and MLP or mixture-of-experts layers.",
    "export it to ONNX, verify the weights, qualify the package, then generate text.",
)


def make_tokenizer(extra_special: tuple[str, ...] = ()) -> Any:
    """A trained `tokenizers.Tokenizer` of exactly VOCAB_SIZE + len(extra_special) tokens
    (the extra special tokens last, as added tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 8, trainer=trainer)
    if extra_special:
        tokenizer.add_special_tokens(list(extra_special))
    return tokenizer


def tokenizer_files(tokenizer: Any) -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json, as a checkpoint directory holds them."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[1],
        "eos_token": SPECIAL_TOKENS[2],
        "pad_token": SPECIAL_TOKENS[0],
        "add_bos_token": False,
        "model_max_length": 4096,
    }
    return {
        "tokenizer.json": tokenizer.to_str(pretty=True).encode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2).encode("utf-8"),
    }
