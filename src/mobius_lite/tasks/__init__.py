"""Tasks: which graphs a model type exports, and how each is bound to the checkpoint.

TASKS is the registry a model type's task (configs/model_types.py) is looked up in: each
entry takes the build's one parsed config, the tensor source, its kind's layout and the
export options, and gives the package's graphs.
"""

from __future__ import annotations

from collections.abc import Callable

from mobius_lite.configs.model_type_entry import ModelConfig
from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.configs.omni import OmniConfig
from mobius_lite.enums import Task
from mobius_lite.models.nemotron_h_names import SourceLayout
from mobius_lite.sources.base import TensorSource
from mobius_lite.tasks.omni import IMAGE_TEXT_TO_TEXT, omni_graphs
from mobius_lite.tasks.options import ExportOptions, TaskGraphs
from mobius_lite.tasks.text_generation import TEXT_GENERATION, text_generation_graphs

TaskExport = Callable[[ModelConfig, TensorSource, SourceLayout, ExportOptions], TaskGraphs]


def _text_generation(
    config: ModelConfig, source: TensorSource, layout: SourceLayout, options: ExportOptions
) -> TaskGraphs:
    assert isinstance(config, NemotronHConfig)
    graphs, shared = text_generation_graphs(config, source, layout, options)
    return TaskGraphs(config, graphs, shared)


def _image_text_to_text(
    config: ModelConfig, source: TensorSource, layout: SourceLayout, options: ExportOptions
) -> TaskGraphs:
    assert isinstance(config, OmniConfig)
    return omni_graphs(config, source, layout, options)


TASKS: dict[Task, TaskExport] = {
    Task.TEXT_GENERATION: _text_generation,
    Task.IMAGE_TEXT_TO_TEXT: _image_text_to_text,
}
SUPPORTED_TASKS = tuple(task.value for task in TASKS)

__all__ = [
    "IMAGE_TEXT_TO_TEXT",
    "SUPPORTED_TASKS",
    "TASKS",
    "TEXT_GENERATION",
    "TaskGraphs",
    "omni_graphs",
    "text_generation_graphs",
]
