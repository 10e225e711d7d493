"""Small random checkpoints of every kind the exporter reads (`mobius demo KIND OUT`).

Each is written from numpy, the `tokenizers` package and gguf-py alone (the base install; no
torch), in the layout the real checkpoints have: config.json, model.safetensors under the
released names, tokenizer.json. See write.py."""

from mobius_lite.demo.write import DEMO_KINDS, write_demo

__all__ = ["DEMO_KINDS", "write_demo"]
