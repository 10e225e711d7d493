"""`mobius generate`: greedy generation from a package, with images and audio for Omni."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import numpy as np

from mobius_lite.cli import COMMANDS
from mobius_lite.enums import GraphRole
from mobius_lite.errors import ConfigError
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.media.tokenizer import load_tokenizer
from mobius_lite.routes import EXECUTION_PROVIDERS

EPILOG = textwrap.dedent(
    """\
    examples:
      mobius generate ./nano9b --prompt "The capital of France is" --max-new-tokens 16
      mobius generate ./omni --prompt "<image> What is in this picture?" --image cat.png
      mobius generate ./omni --prompt "<so_embedding> Transcribe this." --audio clip.wav

    Omni prompts: each <image> marker (or, if there are none, the start of the prompt) takes
    the next --image, each <so_embedding> / <audio> marker the next --audio, expanded into
    the placeholder tokens the processor would write. Images are preprocessed as the
    package's preprocessor_config.json says; audio must be 16 kHz mono 16-bit WAV."""
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help=COMMANDS["generate"],
        description="Tokenize the prompt with the package's tokenizer.json, run the package in "
        "onnxruntime (Omni: the media encoders, the embedding graph and the decoder, chained) and "
        "print the greedy continuation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("package", metavar="PACKAGE", help="package directory written by mobius build")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument(
        "--image", action="append", default=[], metavar="FILE", help="an image (repeatable)"
    )
    p.add_argument(
        "--audio", action="append", default=[], metavar="WAV", help="a 16 kHz WAV clip (repeatable)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=32,
        help="most tokens to generate; generation stops earlier at the model's end-of-sequence "
        "token (config.json eos_token_id), which is printed (default: %(default)s)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="do not stop at the end-of-sequence token: generate --max-new-tokens tokens",
    )
    p.add_argument(
        "--ep",
        default="cpu",
        choices=EXECUTION_PROVIDERS,
        help="onnxruntime execution provider (default: %(default)s)",
    )
    p.add_argument("--ids", action="store_true", help="print the token ids, not the text")
    p.add_argument(
        "--speculative",
        type=int,
        default=0,
        metavar="K",
        help="draft up to K tokens a round with the package's MTP head (mtp.onnx) and verify "
        "them in one decoder call; K adapts to the measured acceptance and costs, down to "
        "plain decoding. The tokens are the same as without it (default: off)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mobius_lite.configs.model_types import model_type_of
    from mobius_lite.enums import Task
    from mobius_lite.package_reader import open_package
    from mobius_lite.runtime import session_providers, stop_token_ids
    from mobius_lite.sources.config_json import read_config_json

    package = Path(args.package)
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, found {args.max_new_tokens}")
    if args.speculative < 0:
        raise ConfigError(
            f"--speculative must be >= 1 draft tokens (or 0: off), found {args.speculative}"
        )
    files = open_package(package)  # a package, every file complete, before any session
    if not (package / CONFIG_FILE).is_file():
        raise ConfigError(f"{package} has no {CONFIG_FILE}; re-export the package")
    providers = session_providers(args.ep)
    tokenizer = load_tokenizer(package)
    raw = read_config_json(package)
    if model_type_of(raw).task is Task.IMAGE_TEXT_TO_TEXT:
        tokens = _omni(args, package, tokenizer, providers)
    else:
        if args.image or args.audio:
            raise ConfigError(f"{package} is a text package: it takes no --image or --audio")
        stops = set() if args.ignore_eos else stop_token_ids(raw.get("eos_token_id"))
        tokens = _text(args, files.graph(GraphRole.DECODER), tokenizer, providers, stops)
    print(" ".join(map(str, tokens)) if args.ids else tokenizer.decode(tokens))
    return 0


def _text(args, decoder_file: Path, tokenizer, providers: list[str], stops: set[int]) -> list[int]:
    from mobius_lite.runtime import DecoderSession, greedy
    from mobius_lite.speculative import open_head, speculative_greedy

    head = open_head(decoder_file.parent, providers) if args.speculative else None
    session = DecoderSession(decoder_file, providers)
    ids = np.array([tokenizer.encode(args.prompt).ids], dtype=np.int64)
    if head is None:
        return greedy(session, ids, args.max_new_tokens, stop_tokens=stops).tokens
    tokens, stats = speculative_greedy(
        session, head, ids, args.max_new_tokens, args.speculative, stops=stops
    )
    _report(stats)
    return tokens[0]


def _omni(args, package: Path, tokenizer, providers: list[str]) -> list[int]:
    from mobius_lite.media.audio_features import LogMelConfig, log_mel_features
    from mobius_lite.media.audio_file import load_wav
    from mobius_lite.media.image import ImageProcessorConfig, load_image, preprocess
    from mobius_lite.media.prompt import expand
    from mobius_lite.omni_runtime import Media, OmniSession

    session = OmniSession(package, providers)
    media = Media()
    image_tokens: list[int] = []
    if args.image:
        config = ImageProcessorConfig.from_package(package)
        media.pixel_values, media.image_grid_hw = preprocess(
            [load_image(p) for p in args.image], config
        )
        image_tokens = [int(n) for n in media.image_grid_hw.prod(-1) // config.merge_size**2]
    audio_tokens: list[int] = []
    if args.audio:
        mel = LogMelConfig.from_package(package, session.audio_mel_bins)
        waves = [load_wav(p, mel.sampling_rate) for p in args.audio]
        media.input_features, media.input_features_mask = log_mel_features(
            waves, mel.sampling_rate, mel
        )
        audio_tokens = session.audio_token_counts(media.input_features_mask)
    text = expand(args.prompt, image_tokens, audio_tokens)
    ids = np.array([tokenizer.encode(text).ids], dtype=np.int64)
    print(f"prompt: {ids.shape[1]} tokens", file=sys.stderr)
    if args.speculative:
        tokens, _, stats = session.generate_speculative(
            ids, media, args.max_new_tokens, args.speculative, stop_at_eos=not args.ignore_eos
        )
        _report(stats)
        return tokens
    return session.generate(ids, media, args.max_new_tokens, stop_at_eos=not args.ignore_eos).tokens


def _report(stats) -> None:
    """What --speculative did, on stderr (stdout holds only the continuation): drafts and
    acceptance, the K each round used (0: a plain step), and the calls made."""
    used = ", ".join(f"K={k} x{n}" for k, n in sorted(stats.k_rounds.items()))
    print(
        f"speculative: {stats.proposed} drafts proposed, {stats.accepted} accepted "
        f"({100 * stats.acceptance_rate:.1f}%) in {stats.rounds} rounds ({used}); "
        f"{stats.decoder_calls} decoder calls ({stats.rewinds} rounds cut back from the "
        f"verifying call, {stats.rollbacks} re-runs), {stats.head_calls} head calls",
        file=sys.stderr,
    )
