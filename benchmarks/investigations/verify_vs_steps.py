r"""Whether a verifying call computes each position as one-position steps do, and if not,
where it starts to differ (docs/speculative.md, "`--activations int8` packages").

A verifying call feeds K + 1 positions at once; plain decoding feeds them one call each. From
the same state after a prompt, this compares the logits of each position both ways (NRMSE),
then finds the first tensor whose first row differs between a one-position and a
four-position call (every MatMulNBits / QMoE / Add / RMSNormalization input and output made a
graph output), and repeats the comparison with every int8-activation kernel moved to
accuracy_level 0 (f32 activations). With speculation windows it also compares the Mamba
states a rewind keeps after each prefix with the states one-position steps leave.

Usage (a package built with a decoder that has no speculation windows or with them):
    python benchmarks/investigations/verify_vs_steps.py PACKAGE [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mobius_lite.bench.package_peer import session_options
from mobius_lite.io_contract import ATTENTION_MASK, INPUT_IDS, LOGITS
from mobius_lite.layout import DECODER_FILE
from mobius_lite.run.decoder_session import DecoderSession

PROMPT = 32
POSITIONS = 4
FLOAT = onnx.TensorProto.FLOAT  # every probed tensor of an f32 package
PROBED_OPS = ("MatMulNBits", "QMoE", "Add", "RMSNormalization")


def nrmse(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.sqrt(((actual - expected) ** 2).mean()) / np.sqrt((expected**2).mean()))


def nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from nodes(attr.g)
        yield node


def prefilled(path: Path, threads: int) -> tuple[DecoderSession, int, tuple[Any, Any]]:
    """A decoder after the prompt, its first greedy token and its state."""
    decoder = DecoderSession(path, session_options=session_options(threads))
    ids = np.random.default_rng(10).integers(3, decoder.vocab_size, size=(1, PROMPT))
    decoder.reset(1)
    out = decoder.step(ids.astype(np.int64), logits_to_keep=1)
    return decoder, int(out[LOGITS][0, -1].argmax()), (dict(decoder.past), decoder.mask)


def steps_vs_call(path: Path, threads: int) -> list[float]:
    """Per position: NRMSE of the verifying call's logits against one-position steps'."""
    decoder, token, state = prefilled(path, threads)
    tokens, single = [token], []
    for _ in range(POSITIONS):
        out = decoder.step(np.array([[tokens[-1]]]), logits_to_keep=1)
        single.append(out[LOGITS][0, -1])
        tokens.append(int(single[-1].argmax()))
    decoder.past, decoder.mask = dict(state[0]), state[1]
    multi = decoder.step(np.array([tokens[:POSITIONS]]), logits_to_keep=POSITIONS)[LOGITS][0]
    return [nrmse(multi[j], single[j]) for j in range(POSITIONS)]


def windows_vs_steps(path: Path, threads: int) -> dict[str, list[float]] | None:
    """Per state kind (conv_state, recurrent_state) and kept prefix j = 1..POSITIONS-1: the
    largest absolute difference between the state a rewind keeps after the verifying call's
    first j positions (its window inputs, run/state_rewind.py; or its state windows' slot
    j - 1) and the state j one-position steps leave; None without either."""
    decoder, token, state = prefilled(path, threads)
    if not decoder.windows and decoder.rewind is None:
        return None
    tokens = np.array([[token] + [3 + i for i in range(POSITIONS - 1)]], dtype=np.int64)
    call = decoder.step(tokens, logits_to_keep=POSITIONS)
    call_past = decoder.call_past
    worst: dict[str, list[float]] = {}
    for kept in range(1, POSITIONS):
        if decoder.rewind is not None:
            kept_states = decoder.rewind.states(call_past, call, POSITIONS, kept) or {}
        else:
            kept_states = {past: call[window][kept - 1] for past, window in decoder.windows.items()}
        decoder.past, decoder.mask = dict(state[0]), state[1]
        for j in range(kept):
            decoder.step(tokens[:, j : j + 1], logits_to_keep=1)
        for past_name, kept_state in kept_states.items():
            kind = past_name.rsplit(".", 1)[-1]
            gap = float(np.abs(kept_state - decoder.past[past_name]).max())
            row = worst.setdefault(kind, [0.0] * (POSITIONS - 1))
            row[kept - 1] = max(row[kept - 1], gap)
    return worst


def first_divergence(package: Path, threads: int) -> dict[str, Any] | None:
    """The first probed tensor (graph order) whose first row differs between a one-position
    and a POSITIONS-position call from the same state."""
    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    probed: list[str] = []
    for node in model.graph.node:
        if node.op_type in PROBED_OPS:
            for name in (*node.input[:1], *node.output[:1]):
                if name and name not in probed:
                    probed.append(name)
                    model.graph.output.append(onnx.helper.make_tensor_value_info(name, FLOAT, None))
    probe = package / "verify_vs_steps_probe.onnx"
    onnx.save(model, str(probe))
    try:
        decoder, token, state = prefilled(probe, threads)
        rows = []
        for feed in ([[token]], [[token, *range(5, 4 + POSITIONS)]]):
            decoder.past, decoder.mask = dict(state[0]), state[1]
            ids = np.array(feed, np.int64)
            feeds = {INPUT_IDS: ids, ATTENTION_MASK: np.ones((1, PROMPT + ids.shape[1]), np.int64)}
            rows.append(decoder.session.run(probed, {**feeds, **decoder.past}))
    finally:
        probe.unlink()
    for name, one, many in zip(probed, *rows, strict=True):
        if one.shape[-1] != many.shape[-1]:
            continue  # not a per-position tensor (the attention mask's sums)
        one, many = one.reshape(-1, one.shape[-1])[0], many.reshape(-1, many.shape[-1])[0]
        if not np.array_equal(one, many):
            return {"tensor": name, "max_abs_difference": float(np.abs(one - many).max())}
    return None


def f32_activations(package: Path) -> Path:
    """The decoder with every accuracy_level 4 kernel at 0 (same weights), beside it."""
    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    for node in nodes(model.graph):
        for attr in node.attribute:
            if attr.name == "accuracy_level":
                attr.i = 0
    path = package / "verify_vs_steps_f32_activations.onnx"
    onnx.save(model, str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    plain = f32_activations(args.package)
    try:
        report = {
            "package": str(args.package),
            "positions": POSITIONS,
            "logits_nrmse_call_vs_steps": steps_vs_call(args.package / DECODER_FILE, args.threads),
            "first_divergence": first_divergence(args.package, args.threads),
            "window_slots_max_abs_vs_steps": windows_vs_steps(
                args.package / DECODER_FILE, args.threads
            ),
            "accuracy_level_0_logits_nrmse": steps_vs_call(plain, args.threads),
        }
    finally:
        plain.unlink()
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
