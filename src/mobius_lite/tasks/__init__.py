"""Tasks: which graphs a model type exports, and how each is bound to the checkpoint."""

from mobius_lite.tasks.text_generation import TEXT_GENERATION, text_generation_graphs

# task name -> graph builder (config, source, source kind, precision) -> (graphs, shared)
TASKS = {TEXT_GENERATION: text_generation_graphs}
SUPPORTED_TASKS = tuple(TASKS)

__all__ = ["SUPPORTED_TASKS", "TASKS", "text_generation_graphs"]
