"""Tasks: which graphs a model type exports, and how each is bound to the checkpoint."""

from mobius_lite.tasks.omni import IMAGE_TEXT_TO_TEXT, omni_graphs
from mobius_lite.tasks.text_generation import TEXT_GENERATION, text_generation_graphs

SUPPORTED_TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)

__all__ = [
    "IMAGE_TEXT_TO_TEXT",
    "SUPPORTED_TASKS",
    "TEXT_GENERATION",
    "omni_graphs",
    "text_generation_graphs",
]
