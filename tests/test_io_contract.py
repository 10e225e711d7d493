"""io_contract.py is the one spelling of the graphs' I/O names: the cache names StateRole
writes pair up through it the way the runtime pairs a session's inputs with its outputs."""

from __future__ import annotations

import pytest

from mobius_lite.enums import StateRole
from mobius_lite.io_contract import PAST_PREFIX, PRESENT_PREFIX, present_of, window_of


@pytest.mark.parametrize("layer", [0, 7, "mtp.0"])
@pytest.mark.parametrize("role", list(StateRole))
def test_cache_names_pair_through_the_contract(role: StateRole, layer: int | str) -> None:
    past = role.past_name(layer)
    assert past == f"past_key_values.{layer}.{role.value}" and past.startswith(PAST_PREFIX)
    assert present_of(past) == role.present_name(layer) == f"present.{layer}.{role.value}"
    assert role.present_name(layer).startswith(PRESENT_PREFIX)
    assert window_of(past) == role.window_name(layer) == f"present_window.{layer}.{role.value}"
