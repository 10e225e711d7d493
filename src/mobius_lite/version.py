"""The library's version, in the base layer so that any module may record it."""

__version__ = "0.1.0"
