"""How a user-facing message lists many names: the first few, then how many more.

One helper so every error, warning and report line that names found items cuts the list the
same way (a message naming a thousand tensors is unreadable; naming none is useless).
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_LISTED = 20  # names a message shows before "(and N more)"


def format_names(
    names: Sequence[str],
    limit: int = MAX_LISTED,
    *,
    separator: str = ", ",
    more: str = " (and {} more)",
) -> str:
    """The first `limit` names joined by `separator`; when some are left out, `more` with
    their count in place of `{}` (e.g. " and {} more tensors")."""
    shown = separator.join(names[:limit])
    left_out = len(names) - limit
    return shown + (more.format(left_out) if left_out > 0 else "")
