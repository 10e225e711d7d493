"""Self-distil the MTP head of a tiny random Nemotron-H model (the speculative benchmark's model).

A head that has learnt something is what the fast-head speculation target needs (1.2x at 85%
acceptance, speculative.md; bench_speculative.py's own head is random, acceptance near 0).

The decoder is a small random model (reference_fixtures/nemotron_reference.make_reference). It
writes its own training text: random prompts continued greedily by the model itself. The head
is then trained, through the torch reference of its computation (evaluation/mtp_reference.py), to
predict what the decoder would choose at t+2 from (token t+1, the decoder's final-normed
hidden state at t), with the embedding table and lm_head frozen (they are the decoder's). The
trained tensors are written into the checkpoint under the released names (mtp.layers.*), so
`mobius build` exports the head as mtp.onnx.

Usage (a few CPU minutes on a loaded machine):
    python benchmarks/investigations/train_mtp_head.py --workdir /tmp/mtp_bench --seconds 150 \
        --sequences 384
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.package_peer import session_options
from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures

MODEL = {
    "layers_block_type": [
        "mamba",
        "moe",
        "attention",
        "mamba",
        "moe",
        "mamba",
        "attention",
        "moe",
    ],
    "vocab_size": 256,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "num_nextn_predict_layers": 1,
}
PROMPT = 8
LENGTH = 64  # prompt + greedy continuation
SEED = 0


def self_generated_text(package: Path, sequences: int, seed: int, threads: int) -> Any:
    """[sequences, LENGTH] token ids written by the model itself (random prompts continued
    greedily), with the decoder's final-normed hidden states [B, L, H] and its greedy choice
    after every position [B, L]; run on the exported decoder (onnxruntime is far faster
    than transformers' torch Mamba fallback)."""
    import torch

    from mobius_lite.run.decoder_session import DecoderSession

    decoder = DecoderSession(package / DECODER_FILE, session_options=session_options(threads))
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, MODEL["vocab_size"], size=(sequences, PROMPT)).astype(np.int64)
    decoder.reset(sequences)
    out = decoder.step(ids, logits_to_keep=1)
    tokens = [out["logits"][:, -1].argmax(-1)]
    while PROMPT + len(tokens) < LENGTH:
        out = decoder.step(tokens[-1][:, None].astype(np.int64), logits_to_keep=1)
        tokens.append(out["logits"][:, -1].argmax(-1))
    text = np.concatenate([ids, np.stack(tokens, 1)], 1)
    decoder.reset(sequences)
    out = decoder.step(text)  # every position: hidden states and greedy choices
    return (
        torch.from_numpy(text),
        torch.from_numpy(out["hidden_states"].astype(np.float32)),
        torch.from_numpy(out["logits"].argmax(-1)),
    )


def initial_head(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random head tensors of the decoder's shape, under the released names."""
    from reference_fixtures.mtp_fixtures import global_head_shape, head_tensors

    return head_tensors(global_head_shape(model.config), rng)


def write_head(checkpoint: Path, head: dict[str, Any]) -> None:
    """Add (or replace) the head's tensors in the checkpoint's model.safetensors."""
    from safetensors.numpy import load_file, save_file

    path = checkpoint / "model.safetensors"
    tensors = load_file(path)
    tensors.update({name: np.ascontiguousarray(value, np.float32) for name, value in head.items()})
    save_file(tensors, path, metadata={"format": "pt"})


def trained_tensors(reference: Any) -> dict[str, np.ndarray]:
    """The reference's tensors under the released names (experts split per expert)."""
    out = {name: value.detach().numpy() for name, value in reference.t.items()}
    out.pop("lm_head.weight", None)
    prefix = "mtp.layers.1.mixer."
    for name, value in reference.moe.state_dict().items():
        if name.startswith("experts."):
            proj = name.split(".")[1]
            for e, expert in enumerate(value.detach().numpy()):
                out[f"{prefix}experts.{e}.{proj}.weight"] = expert
        else:
            out[prefix + name] = value.detach().numpy()
    return out


def agreement(reference: Any, hidden: Any, text: Any, choices: Any) -> float:
    """Top-1 agreement of the head's draft for t+2 with the decoder's greedy choice there."""
    import torch

    reference.reset(text.shape[0])
    with torch.no_grad():
        logits, _ = reference.forward(text[:, 1:], hidden[:, :-1], torch.ones_like(text[:, 1:]))
    drafts = logits.argmax(-1)[:, PROMPT - 1 : -1]
    return float((drafts == choices[:, PROMPT:-1]).float().mean())


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Write the checkpoint, its own text, train the head on it and write the head back."""
    import torch

    from mobius_lite.evaluation.mtp_reference import MtpReference
    from reference_fixtures.nemotron_reference import make_reference

    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(SEED)
    checkpoint = args.workdir / "checkpoint"
    model = make_reference(MODEL, SEED)
    model.save_pretrained(checkpoint)
    write_head(checkpoint, initial_head(model, np.random.default_rng(SEED + 1)))

    import mobius_lite

    start = time.perf_counter()
    package = mobius_lite.build(checkpoint).save(args.workdir / "initial_package", quiet=True)
    text, hidden, choices = self_generated_text(
        package, args.sequences + args.held_out, SEED + 2, args.threads
    )
    generated = time.perf_counter() - start
    train_text, test_text = text[: args.sequences], text[args.sequences :]
    train_hidden, test_hidden = hidden[: args.sequences], hidden[args.sequences :]
    train_choices, test_choices = choices[: args.sequences], choices[args.sequences :]

    reference = MtpReference(checkpoint)
    for name, value in reference.t.items():
        if name != "lm_head.weight":
            value.requires_grad_(True)
    parameters = [v for n, v in reference.t.items() if n != "lm_head.weight"]
    parameters += list(reference.moe.parameters())
    optimizer = torch.optim.Adam(parameters, lr=args.lr)
    before = agreement(reference, test_hidden, test_text, test_choices)
    losses: list[float] = []
    rng = np.random.default_rng(SEED + 3)
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        rows = torch.from_numpy(rng.choice(args.sequences, size=args.batch, replace=False))
        ids, states = train_text[rows], train_hidden[rows]
        reference.reset(args.batch)
        logits, _ = reference.forward(ids[:, 1:], states[:, :-1], torch.ones_like(ids[:, 1:]))
        # position t predicts the decoder's choice after t+1
        target = train_choices[rows][:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    trained = time.perf_counter() - start
    after = agreement(reference, test_hidden, test_text, test_choices)
    write_head(checkpoint, trained_tensors(reference))
    report = {
        "command": " ".join(sys.argv),
        "model": MODEL,
        "checkpoint": str(checkpoint),
        "sequences": args.sequences,
        "held_out": args.held_out,
        "length": LENGTH,
        "text_generation_s": round(generated, 1),
        "training_s": round(trained, 1),
        "steps": len(losses),
        "loss_first": losses[0] if losses else None,
        "loss_last_10_mean": float(np.mean(losses[-10:])) if losses else None,
        "held_out_top1_agreement_before": before,
        "held_out_top1_agreement_after": after,
    }
    (args.workdir / "train_report.json").write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=150.0, help="training time budget")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime threads (text)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads for training (default 1: on a loaded machine 2 threads were "
        "10-40x slower per step)",
    )
    parser.add_argument("--sequences", type=int, default=256, help="self-generated sequences")
    parser.add_argument("--held-out", type=int, default=32, help="sequences kept for agreement")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(train(args), indent=2))


if __name__ == "__main__":
    main()
