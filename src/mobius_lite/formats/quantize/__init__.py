"""Quantization at export: a dense source tensor written as quantized blocks.

recipe.py names what is asked (a typed `Recipe`: type, block, symmetry); ggml_rows.py is
ggml's reference quantizer for Q8_0 / Q4_0, written from ggml-quants.c; conversion.py is the
`Conversion` that applies it while the writer streams (and re-derives it for verify with
gguf-py's independent quantizer); storage.py is the `Storage` a quantized source tensor
takes, which hands the graph side to the ggml block type it becomes (formats/ggml/), so every
existing route of that type computes with it unchanged.
"""
