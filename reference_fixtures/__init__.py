"""Independent reference writers and models, shared by tests/ and benchmarks/ (development only,
not part of the installed library: the wheel packages src/ alone).

They stand for the other side of every comparison, written without mobius_lite's readers:
a GGUF writer laid out as llama.cpp's converter writes (gguf_fixtures, gguf_nvfp4_fixtures), a
ModelOpt NVFP4 / FP8 / MIXED_PRECISION checkpoint writer (modelopt_fixtures), the transformers
reference models (nemotron_reference, omni_fixtures, puzzle_fixtures), the multi-token-prediction
head's reference and checkpoints (mtp_reference, mtp_fixtures) and plain greedy decoding with a
scripted draft head (speculative_fixtures).

tests/ reach the package through pytest's `pythonpath = ["."]` (pyproject.toml); the benchmark
scripts put the repository root on sys.path. Neither imports the other.
"""
