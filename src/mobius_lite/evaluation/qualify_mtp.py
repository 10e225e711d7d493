"""`qualify`'s verdict on the multi-token-prediction head (mtp.onnx), apart from the decoder's.

Both heads, the package's graph and the torch reference (evaluation/mtp_reference.py), are fed
the same inputs at every step: the tokens the package decoded and the package decoder's own
`hidden_states`, so the verdict judges the head alone (the decoder has its own verdicts). The
head's logits, `mtp_hidden_states` and K/V caches are gated like the decoder's arrays; then
speculative greedy decoding with the package's head must give exactly the package's plain
greedy tokens, and its draft acceptance rate on the prompt is reported (not gated: a head
that drafts badly is slow, not wrong).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.enums import GraphRole
from mobius_lite.errors import MobiusError
from mobius_lite.evaluation import scoring
from mobius_lite.evaluation.dense_reference import ReferenceRequest, is_head_reference_tensor
from mobius_lite.evaluation.scoring import FAIL, NOT_GATED, NOT_RUN, PASS, Verdict
from mobius_lite.io_contract import LOGITS, MTP_HIDDEN_STATES, present_of
from mobius_lite.source_kinds import SAFETENSORS_KIND, SourceKind

HEAD_PREFIX = "mtp/"
SPECULATIVE_K = 2  # drafts a round in the acceptance run
VERDICT = "mtp_head"


def split_head_arrays(
    arrays: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the decoder's arrays, the head's arrays without their "mtp/" prefix)."""
    decoder = {k: v for k, v in arrays.items() if not k.startswith(HEAD_PREFIX)}
    head = {k[len(HEAD_PREFIX) :]: v for k, v in arrays.items() if k.startswith(HEAD_PREFIX)}
    return decoder, head


def head_feeds(
    prompt: list[int], tokens: list[int], decoder_arrays: Mapping[str, np.ndarray], steps: list[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input_ids, hidden_states) per step: the tokens after each decoder position and the
    package decoder's hidden states there (prefill: the prompt shifted by one + first token)."""
    feeds = []
    for i, step in enumerate(steps):
        hidden = decoder_arrays[f"{step}/hidden_states"]
        ids = [*prompt[1:], tokens[0]] if i == 0 else [tokens[i]]
        feeds.append((np.array([ids], dtype=np.int64), hidden))
    return feeds


# (head, new tokens, k) -> (tokens, SpeculationStats)
Speculate = Callable[[Any, int, int], tuple[list[int], Any]]


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
    returns (facts, package head arrays, reference head arrays), keys
    "mtp/...". `prompt` is what the decoder saw (Omni: after video pruning). A source of a
    `kind` transformers cannot read (a GGUF file's nextn block, a ModelOpt head) is decoded
    to FP32 first by its kind's reference function, the head's tensors only, with its config
    dict `source_raw`."""
    from mobius_lite.evaluation.mtp_reference import MtpReference
    from mobius_lite.evaluation.reference import pinned_torch
    from mobius_lite.run.mtp_head import head_files, head_session, open_head
    from mobius_lite.run.package_reader import open_package

    facts: dict[str, Any] = {
        "graph": GraphRole.MTP.file_name,
        "fed": "the package decoder's tokens and hidden_states, the same on both sides",
    }
    if any(f"{step}/hidden_states" not in decoder_arrays for step in steps):
        facts["error"] = "the decoder has no hidden_states output for the head"
        return facts, {}, {}
    feeds = head_feeds(prompt, tokens, decoder_arrays, steps)
    ours: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    try:
        head_file = package_dir / GraphRole.MTP.file_name
        head = head_session(head_file, providers)
        facts["int8_activation_kernels"] = _int8_kernels(head_file)
        head.reset(1)
        for step, (ids, hidden) in zip(steps, feeds, strict=True):
            logits, mtp_hidden = head.step(ids, hidden, np.ones_like(ids))
            past = {present_of(name): value for name, value in head.past.items()}
            arrays = {LOGITS: logits, MTP_HIDDEN_STATES: mtp_hidden, **past}
            for name, value in arrays.items():
                ours[f"{HEAD_PREFIX}{step}/{name}"] = value
        speculate = speculate or _text_speculation(package_dir, prompt, providers)
        drafter, k = head, SPECULATIVE_K
        depths = len(head_files(open_package(package_dir)))
        if depths > 1:  # a head of distinct depths drafts through its chain, K <= depths
            drafter, k = open_head(package_dir, providers), min(SPECULATIVE_K, depths)
            facts["depths"] = f"{depths} distinct depths: the arrays are depth 0's (mtp.onnx)"
        drafted, stats = speculate(drafter, len(tokens), k)
    except Exception as exc:  # evidence for the report, never a traceback
        facts["error"] = f"the package head did not run: {type(exc).__name__}: {exc}"[:1000]
        return facts, {}, {}
    facts["speculative"] = {
        "k": k,
        "new_tokens": len(tokens),
        "tokens": list(drafted),
        "plain_tokens": list(tokens),
        **stats.as_dict(),
    }
    try:
        with pinned_torch(), tempfile.TemporaryDirectory(prefix="mobius-head-") as tmp:
            request = ReferenceRequest(
                source_dir, source_raw or {}, Path(tmp), keep=is_head_reference_tensor
            )
            checkpoint = kind.reference_checkpoint()(request)
            if checkpoint != source_dir:  # not read as stored
                facts["reference_weights"] = f"the {kind.name} source's head decoded to FP32"
            oracle = MtpReference(checkpoint)
            oracle.reset(1)
            length = 0
            for step, (ids, hidden) in zip(steps, feeds, strict=True):
                length += ids.shape[1]
                out = oracle.step(ids, hidden, np.ones((1, length), np.int64))
                for name, value in out.items():
                    reference[f"{HEAD_PREFIX}{step}/{name}"] = value
    except MobiusError as exc:  # said in plain words (e.g. a source without a head's tensors)
        facts["reference_error"] = str(exc)[:1000]
    except Exception as exc:
        facts["reference_error"] = f"{type(exc).__name__}: {exc}"[:1000]
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
    """The head's verdict: its arrays within the fixed gates and speculative tokens exactly the
    plain ones. The acceptance rate is evidence only."""
    if "error" in facts:
        return Verdict(FAIL, facts["error"], dict(facts))
    if not reference:
        reason = "the reference head did not run: " + str(facts.get("reference_error", "?"))
        return Verdict(NOT_RUN, reason, dict(facts))
    parity = scoring.score_parity(ours, reference, steps, {})
    speculative = facts["speculative"]
    identical = speculative["tokens"] == speculative["plain_tokens"]
    evidence = {"parity": parity.evidence, "speculative": speculative}
    rate = (
        f"acceptance {speculative['accepted']}/{speculative['proposed']} drafts "
        f"(K={speculative['k']}, {speculative['new_tokens']} tokens)"
    )
    fast = facts.get("int8_activation_kernels", 0)
    if parity.status != PASS and fast and identical:
        # a fast draft head (--draft-head fast) computes with int8 activations: the FP32
        # gates do not apply; as for --activations int8, the figures are reported, not gated
        return Verdict(
            NOT_GATED,
            f"head arrays not gated: {fast} kernels compute with int8 activations (a fast "
            f"draft head); measured: {parity.summary}; speculative tokens identical; {rate}",
            {**evidence, "gated_status": parity.status},
        )
    if parity.status != PASS:
        return Verdict(parity.status, f"head arrays: {parity.summary}; {rate}", evidence)
    if not identical:
        return Verdict(
            FAIL,
            f"speculative tokens {speculative['tokens']} differ from plain greedy "
            f"{speculative['plain_tokens']}",
            evidence,
        )
    return Verdict(
        PASS, f"head arrays: {parity.summary}; speculative tokens identical; {rate}", evidence
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
