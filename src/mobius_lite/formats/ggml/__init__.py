"""ggml block types as stored in GGUF files (llama.cpp's quantization formats)."""
