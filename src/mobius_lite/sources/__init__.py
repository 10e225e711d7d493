"""Checkpoint sources: lazy tensor indexes that read nothing until the writer asks."""

from mobius_lite.sources.base import TensorInfo, TensorSource
from mobius_lite.sources.memory import MemorySource
from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint

__all__ = ["MemorySource", "SafetensorsCheckpoint", "TensorInfo", "TensorSource"]
