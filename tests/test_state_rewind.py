"""The state rewind (run/state_rewind.py, graphs/state_rewind.py) against onnxruntime's own
kernels and the recurrence's definition: what a rejected draft's Mamba states are re-derived
with must be what plain decoding's one-position calls leave.

- The premise: onnxruntime's CPU LinearAttention ("gated") over T positions leaves the state
  that T one-position calls leave, bit for bit, in both domains (the graphs here are written
  with onnx.helper, not with the library's builders).
- conv_state equals CausalConvWithState's present after the kept positions, bit for bit.
- StateRewind's SSM states equal one-position kernel calls bit for bit and the recurrence
  S_t = exp(g_t) S_{t-1} + k_t v_t^T (numpy, float64) under the FP32 gates.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mobius_lite.enums import RecurrenceInput, StateRole
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.graphs.state_rewind import ONNX_DOMAIN, RewindLayer, build_state_rewind
from mobius_lite.io_contract import present_of
from mobius_lite.run.cached_session import CacheInput
from mobius_lite.run.state_rewind import StateRewind, conv_state

HEADS, STATE, HEAD_DIM, CHANNELS, KERNEL = 4, 8, 6, 10, 4
DOMAINS = ["com.microsoft", ONNX_DOMAIN]


def _session(node: helper.NodeProto, inputs, outputs) -> ort.InferenceSession:
    graph = helper.make_graph([node], "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 27), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=11)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _value(name: str, shape: list) -> helper.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def linear_attention(domain: str) -> ort.InferenceSession:
    """One LinearAttention ("gated", scale 1) node, written by hand."""
    node = helper.make_node(
        "LinearAttention",
        ["q", "k", "v", "past", "g"],
        ["y", "present"],
        domain="" if domain == ONNX_DOMAIN else domain,
        update_rule="gated",
        q_num_heads=HEADS,
        kv_num_heads=HEADS,
        scale=1.0,
    )
    inputs = [
        _value("q", ["B", "T", HEADS * STATE]),
        _value("k", ["B", "T", HEADS * STATE]),
        _value("v", ["B", "T", HEADS * HEAD_DIM]),
        _value("past", ["B", HEADS, STATE, HEAD_DIM]),
        _value("g", ["B", "T", HEADS]),
    ]
    return _session(node, inputs, [_value("y", None), _value("present", None)])


def operands(rng: np.random.Generator, batch: int, positions: int) -> dict[str, np.ndarray]:
    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "q": normal(batch, positions, HEADS * STATE),
        "k": normal(batch, positions, HEADS * STATE, scale=0.3),
        "v": normal(batch, positions, HEADS * HEAD_DIM),
        "past": normal(batch, HEADS, STATE, HEAD_DIM),
        "g": -np.abs(normal(batch, positions, HEADS)),
    }


def stepped(session: ort.InferenceSession, feeds: dict[str, np.ndarray], kept: int) -> np.ndarray:
    """The state after `kept` one-position calls, as plain decoding leaves it."""
    state = feeds["past"]
    for t in range(kept):
        one = {name: feeds[name][:, t : t + 1] for name in ("q", "k", "v", "g")}
        state = session.run(["present"], {**one, "past": state})[0]
    return state


@pytest.mark.parametrize("domain", DOMAINS)
def test_one_call_over_t_positions_leaves_the_steps_state(domain: str) -> None:
    """The premise of the rewind's exactness, in onnxruntime 1.32's CPU kernels."""
    session = linear_attention(domain)
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        for positions in range(2, 9):
            feeds = operands(rng, batch, positions)
            present = session.run(["present"], feeds)[0]
            np.testing.assert_array_equal(present, stepped(session, feeds, positions))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_state_is_the_conv_ops_present(dtype) -> None:
    """conv_state(past, inputs[:kept]) is CausalConvWithState's present after those inputs."""
    node = helper.make_node(
        "CausalConvWithState",
        ["x", "w", "", "past"],
        ["y", "present"],
        domain="com.microsoft",
        activation="silu",
    )
    inputs = [
        _value("x", ["B", CHANNELS, "T"]),
        _value("w", [CHANNELS, 1, KERNEL]),
        _value("past", ["B", CHANNELS, KERNEL - 1]),
    ]
    session = _session(node, inputs, [_value("y", None), _value("present", None)])
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((CHANNELS, 1, KERNEL)).astype(np.float32)
    for kept in range(1, 6):
        # values exact in `dtype`, as the cache holds them
        x = rng.standard_normal((2, CHANNELS, kept)).astype(dtype).astype(np.float32)
        past = rng.standard_normal((2, CHANNELS, KERNEL - 1)).astype(dtype)
        present = session.run(["present"], {"x": x, "w": weight, "past": past.astype(np.float32)})
        window = x.transpose(2, 0, 1).astype(dtype)  # [positions, batch, channels]
        rewound = conv_state(past, window)
        assert rewound.dtype == dtype
        np.testing.assert_array_equal(rewound, present[0].astype(dtype))


def _rewind(domain: str) -> StateRewind:
    """A StateRewind over one Mamba layer "3" with the test's widths."""
    cache = [
        CacheInput(
            StateRole.CONV.past_name(3),
            present_of(StateRole.CONV.past_name(3)),
            np.dtype(np.float32),
            ("batch", CHANNELS, KERNEL - 1),
        ),
        CacheInput(
            StateRole.RECURRENT.past_name(3),
            present_of(StateRole.RECURRENT.past_name(3)),
            np.dtype(np.float32),
            ("batch", HEADS, STATE, HEAD_DIM),
        ),
    ]
    outputs = {which.window_name(3) for which in RecurrenceInput}
    return StateRewind(cache, outputs, domain, ["CPUExecutionProvider"])


def recurrence(past: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray) -> np.ndarray:
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T per head, in float64, from the definition."""
    state = past.astype(np.float64)
    batch, positions = k.shape[:2]
    keys = k.reshape(batch, positions, HEADS, STATE).astype(np.float64)
    values = v.reshape(batch, positions, HEADS, HEAD_DIM).astype(np.float64)
    for t in range(positions):
        decay = np.exp(g[:, t].astype(np.float64))[:, :, None, None]
        state = decay * state + keys[:, t, :, :, None] * values[:, t, :, None, :]
    return state


@pytest.mark.parametrize("domain", DOMAINS)
def test_rewound_states_are_the_steps_states(domain: str) -> None:
    """StateRewind over every prefix of a 5-position call: the SSM state bit for bit what
    one-position kernel calls leave and within the FP32 gates of the recurrence; the conv
    state the last kernel - 1 inputs; None for a call with no slots."""
    rewind = _rewind(domain)
    assert rewind.past_names == [StateRole.CONV.past_name(3), StateRole.RECURRENT.past_name(3)]
    session = linear_attention(domain)
    rng = np.random.default_rng(2)
    fed = 5
    feeds = operands(rng, 2, fed)
    conv_past = rng.standard_normal((2, CHANNELS, KERNEL - 1)).astype(np.float32)
    conv_inputs = rng.standard_normal((fed, 2, CHANNELS)).astype(np.float32)
    out = {
        RecurrenceInput.CONV_INPUT.window_name(3): conv_inputs,
        RecurrenceInput.KEY.window_name(3): feeds["k"].transpose(1, 0, 2),
        RecurrenceInput.VALUE.window_name(3): feeds["v"].transpose(1, 0, 2),
        RecurrenceInput.DECAY.window_name(3): feeds["g"].transpose(1, 0, 2),
    }
    past = {StateRole.CONV.past_name(3): conv_past, StateRole.RECURRENT.past_name(3): feeds["past"]}
    for kept in range(1, fed + 1):
        states = rewind.states(past, out, fed, kept)
        assert states is not None
        ssm = states[StateRole.RECURRENT.past_name(3)]
        np.testing.assert_array_equal(ssm, stepped(session, feeds, kept))
        expected = recurrence(
            feeds["past"], feeds["k"][:, :kept], feeds["v"][:, :kept], feeds["g"][:, :kept]
        )
        c = compare(f"ssm after {kept}", ssm, expected.astype(np.float32))
        assert c.passes(FP32_NRMSE, FP32_COSINE), c
        joined = np.concatenate([conv_past, conv_inputs[:kept].transpose(1, 2, 0)], axis=2)
        np.testing.assert_array_equal(
            states[StateRole.CONV.past_name(3)], joined[:, :, -(KERNEL - 1) :]
        )
    empty = {name: value[:0] for name, value in out.items()}
    assert rewind.states(past, empty, fed, 2) is None


def test_a_decoder_without_window_inputs_has_no_rewind_layers() -> None:
    """A Mamba layer is rewound only when the decoder returns all its window inputs."""
    rewind = _rewind(ONNX_DOMAIN)
    cache = [CacheInput(p, present_of(p), np.dtype(np.float32), ()) for p in rewind.past_names]
    partial = {RecurrenceInput.KEY.window_name(3)}
    assert not StateRewind(cache, partial, ONNX_DOMAIN, ["CPUExecutionProvider"]).layers


def test_an_unknown_recurrence_domain_is_refused() -> None:
    layer = RewindLayer("0", HEADS, STATE, HEAD_DIM, ir.DataType.FLOAT)
    with pytest.raises(ValueError, match="unknown recurrence domain 'org.example'"):
        build_state_rewind([layer], "org.example")
