"""The re-layouts of ggml blocks for onnxruntime's fused CPU kernels, by family:
blocks_matmulnbits (Q8_0 / Q4_0 blocks as MatMulNBits blocks), exact_* (any type's exact code
form: codes, layout, MatMulNBits emission, the layout's parts as Conversions) and qmoe_*
(stacked experts as QMoE operands, and the min-term layouts of Q4_K experts)."""
