"""Comparison metrics and fixed gates for numerical verdicts."""
