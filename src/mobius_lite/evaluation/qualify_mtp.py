"""`qualify`'s verdict on the multi-token-prediction head (mtp.onnx), apart from the decoder's.

Both heads, the package's graph and the torch reference (evaluation/mtp_reference.py), are fed
the same inputs at every step: the tokens the package decoded and the package decoder's own
`hidden_states`, so the verdict judges the head alone (the decoder has its own verdicts). The
head's logits, `mtp_hidden_states` and K/V caches are gated like the decoder's arrays; then
speculative greedy decoding with the package's head must give exactly the package's plain
greedy tokens, and its draft acceptance rate on the prompt is reported (not gated: a head
that drafts badly is slow, not wrong).

A head of distinct depths has one graph per depth (mtp.onnx, mtp_depth{j}.onnx), and each is
held to its own reference depth under the same gates: depth j is fed the tokens t+j+1 and the
package's depth j-1 `mtp_hidden_states` (the decoder's for depth 0), the same on both sides,
at the positions whose token t+j+1 the run knows. The verdict fails if any depth fails, naming
it.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.enums import GraphId, GraphRole
from mobius_lite.errors import MobiusError
from mobius_lite.evaluation import scoring
from mobius_lite.evaluation.dense_reference import ReferenceRequest, is_head_reference_tensor
from mobius_lite.evaluation.scoring import FAIL, NOT_GATED, NOT_RUN, PASS, Verdict
from mobius_lite.io_contract import HIDDEN_STATES, LOGITS, MTP_HIDDEN_STATES, present_of
from mobius_lite.source_kinds import SAFETENSORS_KIND, SourceKind

HEAD_PREFIX = "mtp/"
# a later depth's arrays: "mtp/depth{j}/{step}/{name}" (depth 0's are "mtp/{step}/{name}")
DEPTH_KEY = re.compile(r"depth(\d+)/(.+)")
SPECULATIVE_K = 2  # drafts a round in the acceptance run
VERDICT = "mtp_head"


def split_head_arrays(
    arrays: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the decoder's arrays, the head's arrays without their "mtp/" prefix)."""
    decoder = {k: v for k, v in arrays.items() if not k.startswith(HEAD_PREFIX)}
    head = {k[len(HEAD_PREFIX) :]: v for k, v in arrays.items() if k.startswith(HEAD_PREFIX)}
    return decoder, head


def depth_key(depth: int, step: str, name: str) -> str:
    """A head array's key under "mtp/": "{step}/{name}" for depth 0 (a one-depth head's),
    "depth{j}/{step}/{name}" for a later depth of a head of distinct depths."""
    return f"{step}/{name}" if depth == 0 else f"depth{depth}/{step}/{name}"


def split_depths(head: Mapping[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    """The head's arrays (keys without "mtp/") by depth, each keyed "{step}/{name}"."""
    out: dict[int, dict[str, np.ndarray]] = {}
    for key, value in head.items():
        match = DEPTH_KEY.fullmatch(key)
        depth, rest = (int(match[1]), match[2]) if match else (0, key)
        out.setdefault(depth, {})[rest] = value
    return out


def depth_spans(
    prompt_length: int, token_count: int, steps: list[str], depth: int
) -> list[tuple[str, int, int]]:
    """(step, first, end) for each decoder call (prefill: the prompt's positions, then one
    each): the positions of that call depth `depth` runs, those whose token t+depth+1 is among
    the prompt and the `token_count` decoded tokens (depth j: all but the last j); calls left
    with none are dropped."""
    known = prompt_length + token_count - 1 - depth
    spans, first = [], 0
    for i, step in enumerate(steps):
        end = prompt_length + i
        if min(end, known) > first:
            spans.append((step, first, min(end, known)))
        first = end
    return spans


# (head, new tokens, k) -> (tokens, SpeculationStats)
Speculate = Callable[[Any, int, int], tuple[list[int], Any]]
# a head's step: (input_ids, hidden_states, positions cached after the call) -> its outputs
_Step = Callable[[np.ndarray, np.ndarray, int], Mapping[str, np.ndarray]]


def _run_depth(
    step: _Step,
    depth: int,
    line: np.ndarray,
    inputs: np.ndarray,
    spans: list[tuple[str, int, int]],
    arrays: dict[str, np.ndarray],
) -> np.ndarray:
    """One depth over `spans`, from an empty cache: at positions a..b it is fed the tokens
    line[a+depth : b+depth] (line[:, t] = token t+1) and inputs[:, a:b]; its outputs go into
    `arrays` under "mtp/" + depth_key. Returns its mtp_hidden_states at every position run
    (the next depth's inputs)."""
    outputs = []
    for name, first, end in spans:
        ids = line[:, first + depth : end + depth]
        out = step(ids, inputs[:, first:end], end)
        for output, value in out.items():
            arrays[HEAD_PREFIX + depth_key(depth, name, output)] = value
        outputs.append(out[MTP_HIDDEN_STATES])
    return np.concatenate(outputs, axis=1) if outputs else inputs[:, :0]


def run_heads(
    package_dir: Path,
    source_dir: Path,
    prompt: list[int],
    tokens: list[int],
    decoder_arrays: Mapping[str, np.ndarray],
    steps: list[str],
    providers: list[str],
    speculate: Speculate | None = None,
    kind: SourceKind = SAFETENSORS_KIND,
    source_raw: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run the package's head and the reference head on the same inputs, then speculative
    decoding with the package's head (`speculate`; default: the text decoder on `prompt`);
    returns (facts, package head arrays, reference head arrays), keys "mtp/..." (a later
    depth's "mtp/depth{j}/..."). `prompt` is what the decoder saw (Omni: after video
    pruning). A head of distinct depths: every depth's graph against the reference of that
    depth, depth j fed the package's depth j-1 outputs on both sides. A source of a `kind`
    transformers cannot read (a GGUF file's nextn block, a ModelOpt head) is decoded to FP32
    first by its kind's reference function, the head's tensors only, with its config dict
    `source_raw`."""
    from mobius_lite.evaluation.mtp_reference import MtpReference
    from mobius_lite.evaluation.reference import pinned_torch
    from mobius_lite.run.mtp_head import head_files, head_session, open_head
    from mobius_lite.run.package_reader import open_package

    facts: dict[str, Any] = {
        "graph": GraphRole.MTP.file_name,
        "fed": "the package decoder's tokens and hidden_states, the same on both sides",
    }
    if any(f"{step}/{HIDDEN_STATES}" not in decoder_arrays for step in steps):
        facts["error"] = "the decoder has no hidden_states output for the head"
        return facts, {}, {}
    line = np.array([[*prompt[1:], *tokens]], np.int64)
    decoder_hidden = np.concatenate([decoder_arrays[f"{s}/{HIDDEN_STATES}"] for s in steps], 1)
    ours: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    where = "the package head did not run"
    try:
        files = head_files(open_package(package_dir))
        if not files:
            raise FileNotFoundError(f"the manifest lists no {GraphRole.MTP.file_name}")
        depths = len(files)
        facts["depth_count"] = depths
        spans = [depth_spans(len(prompt), len(tokens), steps, j) for j in range(depths)]
        kernels = [_int8_kernels(path) for path in files]
        facts["int8_activation_kernels"] = sum(kernels)
        if depths > 1:
            facts["graphs"] = [path.name for path in files]
            facts["depth_int8_activation_kernels"] = kernels
            facts["depths"] = (
                f"{depths} distinct depths, each graph against the reference of its depth: "
                "depth j fed the tokens t+j+1 and the package's depth j-1 mtp_hidden_states "
                "(the decoder's hidden_states for depth 0), the same on both sides, at the "
                "positions whose token t+j+1 is known (all but the last j)"
            )
            facts["depth_steps"] = [[name for name, _, _ in s] for s in spans]
        inputs = decoder_hidden
        package_inputs = [inputs]
        for j, path in enumerate(files):
            where = f"the package head's depth {j} ({path.name}) did not run"
            head = head_session(path, providers)
            head.reset(1)

            def package_step(ids: np.ndarray, hidden: np.ndarray, _end: int, head=head) -> dict:
                logits, mtp_hidden = head.step(ids, hidden, np.ones_like(ids))
                past = {present_of(name): value for name, value in head.past.items()}
                return {LOGITS: logits, MTP_HIDDEN_STATES: mtp_hidden, **past}

            inputs = _run_depth(package_step, j, line, inputs, spans[j], ours)
            package_inputs.append(inputs)
        where = "speculative decoding with the package head did not run"
        speculate = speculate or _text_speculation(package_dir, prompt, providers)
        # a head of distinct depths drafts through its chain, K <= depths
        k = SPECULATIVE_K if depths == 1 else min(SPECULATIVE_K, depths)
        drafter = open_head(package_dir, providers)
        drafted, stats = speculate(drafter, len(tokens), k)
    except Exception as exc:  # evidence for the report, never a traceback
        facts["error"] = f"{where}: {type(exc).__name__}: {exc}"[:1000]
        return facts, {}, {}
    facts["speculative"] = {
        "k": k,
        "new_tokens": len(tokens),
        "tokens": list(drafted),
        "plain_tokens": list(tokens),
        **stats.as_dict(),
    }
    label = ""  # the depth whose reference is running, for a head of distinct depths
    try:
        with pinned_torch(), tempfile.TemporaryDirectory(prefix="mobius-head-") as tmp:
            request = ReferenceRequest(
                source_dir, source_raw or {}, Path(tmp), keep=is_head_reference_tensor
            )
            checkpoint = kind.reference_checkpoint()(request)
            if checkpoint != source_dir:  # not read as stored
                facts["reference_weights"] = f"the {kind.name} source's head decoded to FP32"
            for depth in range(depths):
                label = f"depth {depth}: " if depths > 1 else ""
                oracle = MtpReference(checkpoint, depth)
                oracle.reset(1)

                def reference_step(ids: np.ndarray, hidden: np.ndarray, end: int, oracle=oracle):
                    return oracle.step(ids, hidden, np.ones((1, end), np.int64))

                # the package's depth j-1 outputs, as its depth j was fed
                _run_depth(
                    reference_step, depth, line, package_inputs[depth], spans[depth], reference
                )
    except Exception as exc:  # said in plain words (e.g. a source without a head's tensors)
        reference.clear()
        message = str(exc) if isinstance(exc, MobiusError) else f"{type(exc).__name__}: {exc}"
        facts["reference_error"] = (label + message)[:1000]
    return facts, ours, reference


def _text_speculation(package_dir: Path, prompt: list[int], providers: list[str]) -> Speculate:
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.speculative import speculative_greedy

    def speculate(head: Any, new_tokens: int, k: int) -> tuple[list[int], Any]:
        decoder = DecoderSession(package_dir / GraphRole.DECODER.file_name, providers)
        drafted, stats = speculative_greedy(
            decoder, head, np.array([prompt], np.int64), new_tokens, k, adaptive=False
        )
        return drafted[0], stats

    return speculate


def omni_heads(
    session: Any,
    source_dir: Path,
    prepared: Any,
    tokens: list[int],
    ours: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    steps: list[str],
) -> dict[str, Any]:
    """run_heads for an Omni package (OmniSession `session`, its `prepared` prompt): the
    decoder is fed embeddings, the heads ids. Adds the head arrays to `ours` / `reference`
    and returns the facts."""
    from mobius_lite.run.speculative import speculative_greedy

    def speculate(head: Any, new_tokens: int, k: int) -> tuple[list[int], Any]:
        drafted, stats = speculative_greedy(
            session.decoder,
            head,
            prepared.input_ids,
            new_tokens,
            k,
            prompt_input=prepared.inputs_embeds,
            decoder_input=session.embed,
            adaptive=False,
        )
        return drafted[0], stats

    prompt = [int(t) for t in prepared.input_ids[0]]
    facts, head_ours, head_reference = run_heads(
        session.directory, source_dir, prompt, tokens, ours, steps, session.providers, speculate
    )
    ours.update(head_ours)
    reference.update(head_reference)
    return facts


def score_head(
    facts: Mapping[str, Any],
    ours: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    steps: list[str],
) -> Verdict:
    """The head's verdict: every depth's arrays within the fixed gates (a head of distinct
    depths: each depth's graph, a failing one named) and speculative tokens exactly the plain
    ones. The acceptance rate is evidence only."""
    if "error" in facts:
        return Verdict(FAIL, facts["error"], dict(facts))
    if not reference:
        reason = "the reference head did not run: " + str(facts.get("reference_error", "?"))
        return Verdict(NOT_RUN, reason, dict(facts))
    ours_by, reference_by = split_depths(ours), split_depths(reference)
    count = int(facts.get("depth_count") or max([0, *ours_by, *reference_by]) + 1)
    parities = []
    for j in range(count):
        mine, theirs = ours_by.get(j, {}), reference_by.get(j, {})
        ran = [s for s in steps if f"{s}/{LOGITS}" in mine or f"{s}/{LOGITS}" in theirs]
        parities.append(scoring.score_parity(mine, theirs, ran, {}))
    kernels = facts.get("depth_int8_activation_kernels") or [
        facts.get("int8_activation_kernels", 0)
    ]
    fast = [*kernels, *[0] * (count - len(kernels))]
    speculative = facts["speculative"]
    identical = speculative["tokens"] == speculative["plain_tokens"]
    evidence: dict[str, Any] = {"parity": parities[0].evidence, "speculative": speculative}
    if count > 1:  # depth 0's is "parity", as a one-depth head's
        evidence["depth_status"] = {str(j): p.status for j, p in enumerate(parities)}
        evidence["depth_parity"] = {str(j): p.evidence for j, p in enumerate(parities) if j}

    def measured(depths: list[int]) -> str:
        if count == 1:
            return parities[0].summary
        return "; ".join(
            f"depth {j} ({GraphId(GraphRole.MTP, j).file_name}) {parities[j].summary}"
            for j in depths
        )

    rate = (
        f"acceptance {speculative['accepted']}/{speculative['proposed']} drafts "
        f"(K={speculative['k']}, {speculative['new_tokens']} tokens)"
    )

    def worst(depths: list[int]) -> str:
        return FAIL if any(parities[j].status == FAIL for j in depths) else NOT_RUN

    failing = [j for j, parity in enumerate(parities) if parity.status != PASS]
    # a fast draft head (--draft-head fast) computes with int8 activations: the FP32 gates do
    # not apply to its depths; as for --activations int8, the figures are reported, not gated
    gated = [j for j in failing if not (fast[j] and identical)]
    if gated:
        return Verdict(worst(gated), f"head arrays: {measured(gated)}; {rate}", evidence)
    if failing:
        return Verdict(
            NOT_GATED,
            f"head arrays not gated: {sum(fast[j] for j in failing)} kernels compute with int8 "
            f"activations (a fast draft head); measured: {measured(failing)}; speculative "
            f"tokens identical; {rate}",
            {**evidence, "gated_status": worst(failing)},
        )
    if not identical:
        return Verdict(
            FAIL,
            f"speculative tokens {speculative['tokens']} differ from plain greedy "
            f"{speculative['plain_tokens']}",
            evidence,
        )
    return Verdict(
        PASS,
        f"head arrays: {measured(list(range(count)))}; speculative tokens identical; {rate}",
        evidence,
    )


def _int8_kernels(head_file: Path) -> int:
    """Nodes of the head's session that compute with int8 activations (a fast draft head):
    those of the graph file, and the dense projections re-laid when the session is created."""
    import onnx

    from mobius_lite.evaluation.validity import int8_activation_kernels
    from mobius_lite.graphs.draft_int8 import marked_draft_int8

    model = onnx.load(str(head_file), load_external_data=False)
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    return int8_activation_kernels(model.graph) + len(marked_draft_int8(metadata))
