"""Every re-layout part an export can write, found by the name suffix its typed plan makes.

`verify` holds a package (its names and manifest) and the source, not the build's typed plan:
the manifest records no plan, and its bytes stay as they are. So it looks a written parameter
up here: each format's re-layouts are listed as typed objects, and each part's suffix is the
one `PartOf.suffix` generates for the build, never a string read back into a plan.
"""

from __future__ import annotations

from functools import cache
from itertools import product

from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import NBITS_BLOCKS
from mobius_lite.formats.ggml.relayout.exact_parts import PARTS as CODE_PARTS
from mobius_lite.formats.ggml.relayout.qmoe_min_term import MinTermOperand, MinTermPlan
from mobius_lite.formats.parts import CodeLayout, Operand, PartOf
from mobius_lite.formats.quantize.nbits_weight import PARTS as NBITS_PARTS
from mobius_lite.formats.quantize.nbits_weight import Q_BLOCKS


@cache
def written_parts() -> dict[str, PartOf]:
    """Suffix -> part, for every part any format can create."""
    parts = [PartOf(NBITS_BLOCKS, p) for p in ("b", "scales")]
    parts += [PartOf(Q_BLOCKS, p) for p in NBITS_PARTS]
    parts += [PartOf(CodeLayout(op), p) for op in Operand for p in CODE_PARTS]
    slots = (Operand.FC1, Operand.FC2)
    for slot, bits, block, augmented, copies in product(slots, (4, 8), (16, 32), (1, 0), (1, 2, 3)):
        layout = MinTermOperand(slot, MinTermPlan(bits, block, bool(augmented), copies))
        parts += [PartOf(layout, p) for p in ("b", "scales", "zero_points")]
    return {part.suffix: part for part in parts}


def part_of_parameter(name: str) -> PartOf | None:
    """The part a written parameter holds (the longest suffix that names one), or None."""
    found = [part for suffix, part in written_parts().items() if name.endswith(suffix)]
    return max(found, key=lambda part: len(part.suffix), default=None)
