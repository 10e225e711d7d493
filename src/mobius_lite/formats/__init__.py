"""Storage formats: how a source tensor's bytes are laid out and how graphs compute with them.

One module (or sub-package) per format family: ggml/ (GGUF block types), modelopt/ (NVFP4,
FP8). Each owns its byte layout, a numpy reference decode written from the format's
definition, its graph emitters and any lossless re-layout. Model code never branches on a
format: a layer asks its weight's format to emit.
"""
