"""NVIDIA ModelOpt checkpoint formats: NVFP4 (E2M1 codes, E4M3 block scales, an FP32 global
scale) and FP8 (E4M3 weights, an FP32 per-tensor scale), plus the quantization config that
says which module is stored how. Bytes are carried as stored; scales are never recomputed."""
