"""Qualification: comparison metrics and fixed gates (metrics, scoring), the transformers
reference (reference, cache_layout), the instrumented graph (instrument), and `mobius qualify`
itself (qualify, validity)."""
