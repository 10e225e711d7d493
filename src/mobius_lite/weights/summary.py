"""The one-screen report printed at the end of an export, read back from the manifest."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius_lite.layout import MANIFEST_FILE
from mobius_lite.sizes import human_bytes


@dataclass
class SaveSummary:
    """What a save produced, for the one-screen report at the end of an export."""

    directory: Path
    dtype: str
    files: dict[str, int] = field(default_factory=dict)  # every file but the manifest
    data_files: list[str] = field(default_factory=list)  # the external-data shards, in order
    initializers: int = 0
    source_tensors: int = 0
    unused_tensors: int = 0
    bytes_written: int = 0
    seconds: float = 0.0

    @classmethod
    def from_manifest(cls, directory: Path, manifest: dict[str, Any], seconds: float):
        totals = manifest["totals"]
        files = manifest["files"]
        return cls(
            directory=Path(directory),
            dtype=manifest["dtype"],
            files={name: f["bytes"] for name, f in files.items()},
            data_files=[n for n, f in files.items() if f.get("role") == "external-data"],
            initializers=totals["initializers"],
            source_tensors=totals["source_tensors"],
            unused_tensors=totals["unused_tensors"],
            bytes_written=totals["bytes_written"],
            seconds=seconds,
        )

    def render(self, max_other: int = 8) -> str:
        """At most about 16 lines however many shards: the shards are listed as one line."""
        total = sum(self.files.values())
        rate = self.bytes_written / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"package   {self.directory}  ({self.dtype})",
            f"files     {len(self.files) + 1} files, {human_bytes(total)} (+ {MANIFEST_FILE})",
        ]
        shards = self.data_files
        others = [n for n in self.files if n not in set(shards)]
        for name in others[:1]:  # the model file
            lines.append(f"          {human_bytes(self.files[name]):>12}  {name}")
        if len(shards) == 1:
            lines.append(f"          {human_bytes(self.files[shards[0]]):>12}  {shards[0]}")
        elif shards:
            sizes = [self.files[n] for n in shards]
            pattern = re.sub(r"-\d{5}-of-", "-*-of-", shards[0])
            lines.append(
                f"          {human_bytes(sum(sizes)):>12}  {pattern}: {len(shards)} shards, "
                f"largest {human_bytes(max(sizes))}"
            )
        for name in others[1 : 1 + max_other]:
            lines.append(f"          {human_bytes(self.files[name]):>12}  {name}")
        if len(others) > 1 + max_other:
            rest = sum(self.files[n] for n in others[1 + max_other :])
            lines.append(
                f"          {human_bytes(rest):>12}  ... {len(others) - 1 - max_other} more"
            )
        lines.append(
            f"tensors   {self.initializers} initializers from {self.source_tensors} source "
            f"tensors; {self.unused_tensors} intentionally unused (see {MANIFEST_FILE})"
        )
        lines.append(
            f"time      {self.seconds:.1f} s, {human_bytes(self.bytes_written)} of weights "
            f"({human_bytes(rate)}/s)"
        )
        return "\n".join(lines)
