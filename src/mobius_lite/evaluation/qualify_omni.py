"""`mobius qualify` for Omni packages: the same four separate verdicts over every graph.

- graph_validity: the ONNX checker and an onnxruntime session for each graph of the manifest;
- source_fidelity: every byte against the source (as for text packages);
- numerical_parity: the media features (images, video, audio when the package has them) and
  the EVS retention mask (exactly equal), then a prompt with two images: the decoder's logits
  and every cache array at prefill and each cached step, all against transformers'
  NemotronH_Omni_Reasoning_V3 in torch FP32 on the same synthetic, already-processed media;
- generation: exact greedy tokens (FAIL on non-finite logits).
Arrays and verdicts are saved as for text packages, so `--rescore` works on them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.configs.omni import OMNI_MODEL_TYPE, OmniConfig
from mobius_lite.enums import GraphRole, LayerKind
from mobius_lite.evaluation import scoring
from mobius_lite.evaluation.dense_reference import ReferenceRequest
from mobius_lite.evaluation.qualify_mtp import score_head, split_head_arrays
from mobius_lite.evaluation.qualify_sources import source_kind
from mobius_lite.evaluation.scoring import FAIL, Verdict
from mobius_lite.evaluation.validity import check_graph, source_fidelity
from mobius_lite.io_contract import (
    HIDDEN_STATES,
    IMAGE_GRID_HW,
    INPUT_FEATURES,
    INPUT_FEATURES_MASK,
    LOGITS,
    PIXEL_VALUES,
    PIXEL_VALUES_VIDEOS,
)
from mobius_lite.layout import MANIFEST_FILE
from mobius_lite.weights.manifest import read_manifest
from mobius_lite.weights.verify import quantized_at_export

PREFILL = "prefill"  # the media features are compared as part of the first step


def _graph_validity(package_dir: Path, providers: list[str]) -> Verdict:
    import onnxruntime as ort

    from mobius_lite.run.ort_session import quiet_options

    manifest = json.loads((package_dir / MANIFEST_FILE).read_text())
    evidence: dict[str, Any] = {}
    for role, graph in manifest["graphs"].items():
        facts: dict[str, Any] = {"checker": check_graph(package_dir / graph["file"])}
        try:
            session = ort.InferenceSession(
                str(package_dir / graph["file"]), quiet_options(), providers=providers
            )
            facts["session"] = {"ok": True, "providers": session.get_providers()}
        except Exception as exc:  # onnxruntime raises several types
            facts["session"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        evidence[role] = facts
    failed = [r for r, f in evidence.items() if not (f["checker"]["ok"] and f["session"]["ok"])]
    if failed:
        return Verdict(FAIL, f"graphs that do not check or load: {failed}", evidence)
    return Verdict(scoring.PASS, f"{len(evidence)} graphs: checker ok, sessions ok", evidence)


def synthetic_media(config: OmniConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Processed media of the shapes the processors produce: two images of different grids, a
    7-frame video (4 tubelets, so EVS ranks three of them; odd: the last frame repeats), and
    two audio clips of different lengths when the model has audio."""
    rng = np.random.default_rng(seed)
    vision = config.vision_tower
    p, m = vision.radio.patch_size, vision.downsample_factor
    grid = np.array([[2 * m, 3 * m], [3 * m, 2 * m]], dtype=np.int64)
    media = {
        PIXEL_VALUES: rng.standard_normal((int(grid.prod(-1).sum()), vision.radio.patch_dim)),
        IMAGE_GRID_HW: grid,
    }
    frames = rng.standard_normal((7, vision.radio.num_channels, 2 * m * p, 2 * m * p))
    frames = np.concatenate([frames, frames[-1:]])  # the processor's odd-count padding
    channels = vision.radio.num_channels * (vision.radio.video_temporal_patch_size or 2)
    media[PIXEL_VALUES_VIDEOS] = frames.reshape(1, -1, channels, 2 * m * p, 2 * m * p)
    if config.has_audio:
        bins = config.audio_tower.encoder.num_mel_bins
        mask = np.zeros((2, 64), dtype=np.int64)
        mask[0], mask[1, :37] = 1, 1
        media[INPUT_FEATURES] = rng.standard_normal((2, 64, bins))
        media[INPUT_FEATURES_MASK] = mask
    return {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in media.items()}


def synthetic_prompt(config: OmniConfig, image_tokens: int, seed: int) -> np.ndarray:
    """Twelve random text tokens (none a media placeholder) around `image_tokens` image
    placeholders after the fourth: the prompt of the two images of `synthetic_media`."""
    rng = np.random.default_rng(seed)
    low, high = 3, config.text.vocab_size
    special = {config.image_token_id, config.audio_token_id, config.video_token_id}
    text = [int(t) for t in rng.integers(low, high, size=12) if int(t) not in special]
    return np.array([text[:4] + [config.image_token_id] * image_tokens + text[4:]], np.int64)


def omni_reference_model(source_dir: Path) -> Any:
    """The Omni checkpoint in transformers (eager attention): the qualify reference."""
    import torch
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3,
    )

    return NemotronH_Omni_Reasoning_V3.from_pretrained(
        str(source_dir), dtype=torch.float32, attn_implementation="eager"
    )


@dataclass
class PackageRun:
    """The package's side, run once: its arrays by step/name (media features at the prefill,
    then each step's logits, hidden states and caches), the inputs every reference is fed,
    and what the MTP head's check goes on from."""

    session: Any  # the OmniSession
    media: dict[str, np.ndarray]
    ids: np.ndarray  # the two-image prompt (placeholders, before video pruning)
    names: list[str]  # the steps: prefill, decode0, ...
    arrays: dict[str, np.ndarray]
    video_keep: np.ndarray  # the video graph's EVS retention mask
    prepared: Any  # the prompt the decoder saw (run/omni_session.Prepared)
    tokens: list[int]  # the package's greedy tokens


def package_side(package_dir: Path, steps: int, providers: list[str]) -> PackageRun:
    """The media encoders on synthetic media, then a two-image prompt's prefill and `steps`
    cached greedy steps, each fed the previous token."""
    from mobius_lite.run.greedy import greedy
    from mobius_lite.run.omni_session import Media, OmniSession

    session = OmniSession(package_dir, providers)
    config, media = session.config, synthetic_media(session.config)
    arrays: dict[str, np.ndarray] = {}
    image = session._run(
        GraphRole.VISION_ENCODER, {k: media[k] for k in (PIXEL_VALUES, IMAGE_GRID_HW)}
    )
    arrays[f"{PREFILL}/image_features"] = image[0]
    video, keep = session._run(
        GraphRole.VIDEO_ENCODER, {PIXEL_VALUES_VIDEOS: media[PIXEL_VALUES_VIDEOS]}
    )
    arrays[f"{PREFILL}/video_features"] = video
    if config.has_audio:
        audio = {k: media[k] for k in (INPUT_FEATURES, INPUT_FEATURES_MASK)}
        arrays[f"{PREFILL}/audio_features"] = session._run(GraphRole.AUDIO_ENCODER, audio)[0]
    ids = synthetic_prompt(config, len(image[0]), seed=1)
    images = Media(pixel_values=media[PIXEL_VALUES], image_grid_hw=media[IMAGE_GRID_HW])
    prepared = session.prepare(ids, images)
    run = greedy(
        session.decoder,
        prepared.inputs_embeds,
        steps + 1,
        next_input=session.embed_token,
        prefill_logits=0,
    )
    names = [PREFILL] + [f"decode{i}" for i in range(steps)]
    caches = [role.present_name(i) for i, k in enumerate(_kinds(config)) for role in k.states]
    for step, out in zip(names, run.outputs, strict=True):
        arrays[f"{step}/{LOGITS}"] = out[LOGITS]
        if HIDDEN_STATES in out:  # a package with an MTP head: the head's input
            arrays[f"{step}/{HIDDEN_STATES}"] = out[HIDDEN_STATES]
        arrays.update((f"{step}/{name}", out[name]) for name in caches)
    return PackageRun(session, media, ids, names, arrays, keep, prepared, run.tokens)


def reference_side(
    package: PackageRun, source_dir: Path
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """transformers on `source_dir` (torch FP32) fed the package's inputs, each step its own
    previous token: its arrays under the package's names, and its EVS retention mask."""
    import torch
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
        compute_retention_mask,
    )

    from mobius_lite.evaluation.cache_layout import reference_cache_arrays
    from mobius_lite.evaluation.reference import load_reference, pinned_torch

    t = {k: torch.from_numpy(v) for k, v in package.media.items()}
    ref: dict[str, np.ndarray] = {}
    with pinned_torch():
        model = load_reference(source_dir, OMNI_MODEL_TYPE)
        image = model.get_image_features(t[PIXEL_VALUES], t[IMAGE_GRID_HW])
        ref[f"{PREFILL}/image_features"] = torch.cat(image.pooler_output).numpy()
        (video,) = model.get_video_features(t[PIXEL_VALUES_VIDEOS]).pooler_output
        ref[f"{PREFILL}/video_features"] = video.numpy()
        tubelets = package.media[PIXEL_VALUES_VIDEOS].shape[1]
        keep = compute_retention_mask(video, tubelets, model.video_pruning_rate).numpy()
        if package.session.config.has_audio:
            audio = model.get_audio_features(t[INPUT_FEATURES], t[INPUT_FEATURES_MASK])
            ref[f"{PREFILL}/audio_features"] = audio.pooler_output.numpy()
        kinds = _kinds(package.session.config)
        out = model(
            input_ids=torch.from_numpy(package.ids),
            pixel_values=t[PIXEL_VALUES],
            image_grid_hw=t[IMAGE_GRID_HW],
            use_cache=True,
        )
        length = package.ids.shape[1]
        for i, step in enumerate(package.names):
            ref[f"{step}/logits"] = out.logits.float().numpy()
            arrays = reference_cache_arrays(out.cache, kinds)
            ref.update((f"{step}/{name}", array) for name, array in arrays.items())
            if i == len(package.names) - 1:
                break
            length += 1
            out = model(
                input_ids=torch.tensor([[int(out.logits[0, -1].argmax())]]),
                cache=out.cache,
                use_cache=True,
                attention_mask=torch.ones(1, length, dtype=torch.long),
                position_ids=torch.tensor([[length - 1]]),
            )
        del model
    return ref, keep


def omni_runs(
    package_dir: Path, source_dir: Path, steps: int, providers: list[str], say: Any
) -> tuple[PackageRun, dict[str, np.ndarray], dict[str, Any]]:
    """The package's run, the reference's on `source_dir` (arrays by step/name) and facts
    (EVS masks equal; the MTP head's check when the package has a head, its arrays added to
    both sides)."""
    say(f"running the package: the media encoders, a two-image prompt's prefill, {steps} steps")
    package = package_side(package_dir, steps, providers)
    say("running the reference (transformers, torch FP32) on the same inputs")
    ref, reference_keep = reference_side(package, source_dir)
    facts = _evs_facts(package, reference_keep)
    if (package_dir / GraphRole.MTP.file_name).is_file():
        from mobius_lite.evaluation.qualify_mtp import omni_heads

        say("running the MTP head and the reference head, then speculative decoding")
        facts["mtp"] = omni_heads(
            package.session,
            source_dir,
            package.prepared,
            package.tokens,
            package.arrays,
            ref,
            package.names,
        )
    return package, ref, facts


def _kinds(config: OmniConfig) -> list[LayerKind]:
    """The language model's layer kinds, by global layer index."""
    return [layer.kind for layer in config.text.layers]


def _evs_facts(package: PackageRun, reference_keep: np.ndarray) -> dict[str, Any]:
    """The EVS retention masks compared: exactly equal, and the tokens each side kept."""
    keep = package.video_keep
    return {
        "evs_mask_equal": bool(np.array_equal(keep, reference_keep)),
        "evs_kept": [int(keep.sum()), int(reference_keep.sum())],
    }


def qualify_omni_verdicts(
    package_dir: Path, source_dir: Path, steps: int, providers: list[str], quiet: bool
) -> tuple[dict[str, Verdict], dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The four verdicts, the run's facts and both sides' arrays."""

    def say(message: str) -> None:
        if not quiet:
            print(f"qualify: {message}", file=sys.stderr, flush=True)

    say("checking every graph (checker, session)")
    verdicts = {"graph_validity": _graph_validity(package_dir, providers)}
    verdicts["source_fidelity"] = source_fidelity(package_dir, source_dir)
    recipes = quantized_at_export(read_manifest(package_dir))
    try:
        with tempfile.TemporaryDirectory(prefix="mobius-dequantized-") as tmp:
            # the source kind's reference checkpoint: the source itself when transformers
            # reads it, else its weights decoded (a ModelOpt language model); tensors the
            # package quantized at export are dequantized
            kind = source_kind(source_dir)
            raw = kind.local_config(source_dir, None)
            request = ReferenceRequest(source_dir, raw, Path(tmp), recipes=recipes)
            reference_dir = kind.reference_checkpoint()(request)
            package, ref, facts = omni_runs(package_dir, reference_dir, steps, providers, say)
            ours, names = package.arrays, package.names
            quantization = None
            if recipes:  # quantized at export: the quantization's own error, not gated
                say("running the unquantized source, for the quantization's own error")
                (Path(tmp) / "unquantized").mkdir()
                request = ReferenceRequest(source_dir, raw, Path(tmp) / "unquantized")
                unquantized = reference_side(package, kind.reference_checkpoint()(request))[0]
                quantization = scoring.quantization_error(split_head_arrays(ours)[0], unquantized)
    except Exception as exc:  # a run that breaks is evidence, reported, never a traceback
        reference = _raised_by_reference(exc)
        where = "the reference (transformers)" if reference else "the package"
        reason = f"{where} did not run: {type(exc).__name__}: {exc}"[:1000]
        status = scoring.NOT_RUN if reference else FAIL
        verdicts["numerical_parity"] = Verdict(status, reason, {})
        verdicts["generation"] = Verdict(status, reason, {})
        return verdicts, {"steps": [], "execution_order": {}, "omni": {"error": reason}}, {}, {}
    head_facts = facts.pop("mtp", None)
    decoder_ours, head_ours = split_head_arrays(ours)
    decoder_ref, head_ref = split_head_arrays(ref)
    order = {name.partition("/")[2]: i for i, name in enumerate(decoder_ours)}
    verdicts["numerical_parity"] = with_evs_check(
        scoring.score_parity(decoder_ours, decoder_ref, names, order), facts
    )
    verdicts["generation"] = scoring.score_generation(decoder_ours, decoder_ref, names)
    run = {"steps": names, "execution_order": order, "omni": facts}
    if quantization is not None:
        run["quantization_error"] = quantization
    decoder = verdicts["graph_validity"].evidence.get(GraphRole.DECODER.value, {})
    kernels = decoder.get("checker", {}).get("int8_activation_kernels", 0)
    if kernels:  # --activations int8: reported with the measured figures, not gated
        run["int8_activation_kernels"] = kernels
        for name in ("numerical_parity", "generation"):
            verdicts[name] = scoring.not_gated(verdicts[name], kernels)
    if head_facts is not None:  # the MTP head's own verdict (evaluation/qualify_mtp.py)
        run["mtp"] = head_facts
        verdicts["mtp_head"] = score_head(head_facts, head_ours, head_ref, names)
    return verdicts, run, ours, ref


def with_evs_check(parity: Verdict, facts: dict[str, Any]) -> Verdict:
    """Parity fails when the EVS retention masks differ (they must be exactly equal)."""
    if facts.get("evs_mask_equal", True):
        parity.evidence["evs"] = facts
        return parity
    kept = facts.get("evs_kept", ["?", "?"])
    return Verdict(
        FAIL,
        f"EVS retention masks differ (kept {kept[0]} vs {kept[1]}); {parity.summary}",
        {**parity.evidence, "evs": facts},
    )


def _raised_by_reference(exc: BaseException) -> bool:
    """Whether the innermost frame of the error is transformers' or torch's code."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    return last is not None and ("/transformers/" in last or "/torch/" in last)
