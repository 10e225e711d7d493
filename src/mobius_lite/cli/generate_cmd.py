"""`mobius generate`: greedy generation from a package, with images and audio for Omni."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.cli import COMMANDS
from mobius_lite.cli.token_stream import TokenPrinter
from mobius_lite.enums import GraphRole
from mobius_lite.errors import ConfigError
from mobius_lite.layout import CONFIG_FILE, GENAI_CONFIG_FILE
from mobius_lite.media.tokenizer import TOKENIZER_FILE, load_tokenizer
from mobius_lite.routes import EXECUTION_PROVIDERS

EPILOG = textwrap.dedent(
    """\
    examples:
      mobius generate ./nano9b --prompt "The capital of France is" --max-new-tokens 16
      mobius generate ./omni --prompt "<image> What is in this picture?" --image cat.png
      mobius generate ./omni --prompt "<so_embedding> Transcribe this." --audio clip.wav
      mobius generate ./pkg --prompt-ids 1,2,3 --ids --max-new-tokens 1000 --ignore-eos

    Tokens are printed as they are made; Ctrl-C keeps them (exit status 130). stderr gets the
    prompt's length and the tokens/s. The prompt and --max-new-tokens together may not pass
    the package's context_length (genai_config.json), and a package whose dtype or kernels
    do not exist on --ep is refused before any session is created.

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
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--prompt", help="prompt text (tokenized with the package's tokenizer.json)"
    )
    prompt.add_argument(
        "--prompt-ids",
        metavar="IDS",
        help="the prompt as token ids, comma-separated (e.g. 1,2,3): no tokenizer needed; an "
        "Omni prompt's media placeholders must already be expanded",
    )
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
        "plain decoding (a head of D distinct depths: K <= D). The tokens are the same as "
        "without it (default: 0, off)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mobius_lite.configs.model_types import model_type_of
    from mobius_lite.enums import Task
    from mobius_lite.run.greedy import stop_token_ids
    from mobius_lite.run.mtp_head import head_files
    from mobius_lite.run.ort_session import session_providers
    from mobius_lite.run.package_reader import open_package
    from mobius_lite.run.runnable import check_runnable
    from mobius_lite.run.speculative import check_depth_drafts
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
    raw = read_config_json(package)
    omni = model_type_of(raw).task is Task.IMAGE_TEXT_TO_TEXT
    if not omni and (args.image or args.audio):
        raise ConfigError(f"{package} is a text package: it takes no --image or --audio")
    tokenizer = _tokenizer(args, package)
    # Without media the prompt's ids are known now: an empty prompt, or one that leaves no
    # room for the new tokens, is refused before any session is created.
    ids = None if args.image or args.audio else _prompt_ids(args, tokenizer)
    if ids is not None:
        _check_length(package, ids.shape[1], args.max_new_tokens)
    if args.speculative:  # K against the head's depth graphs, before any session
        check_depth_drafts(len(head_files(files)), args.speculative)
    providers = session_providers(args.ep)
    check_runnable(files, args.ep)  # the recorded dtype and operators against --ep
    printer = TokenPrinter(None if args.ids else tokenizer)
    try:
        if omni:
            _omni(args, package, tokenizer, providers, ids, printer)
        else:
            stops = set() if args.ignore_eos else stop_token_ids(raw.get("eos_token_id"))
            _text(args, files.graph(GraphRole.DECODER), ids, providers, stops, printer)
    except KeyboardInterrupt as exc:  # SIGINT / SIGTERM: what was printed stays
        printer.close()
        name = getattr(exc, "signal_name", "SIGINT")
        print(
            f"mobius generate: interrupted by {name} after {_count(printer.count)}; the tokens "
            "printed above are kept",
            file=sys.stderr,
        )
        return 128 + int(getattr(signal, name))
    printer.close()
    return 0


def _tokenizer(args: argparse.Namespace, package: Path):
    """The package's tokenizer; None when --prompt-ids is given and the package has none
    (the continuation is then printed as ids)."""
    if (package / TOKENIZER_FILE).is_file():
        return load_tokenizer(package)
    if args.prompt_ids is None:
        raise ConfigError(
            f"{package} has no {TOKENIZER_FILE}, so --prompt cannot be tokenized; give the "
            "prompt as token ids with --prompt-ids (e.g. --prompt-ids 1,2,3)"
        )
    if not args.ids:
        print(f"{package} has no {TOKENIZER_FILE}: printing token ids", file=sys.stderr)
    return None


def _prompt_ids(args: argparse.Namespace, tokenizer, text: str | None = None) -> np.ndarray:
    """The prompt as input_ids [1, n]: --prompt-ids, or `text` (default --prompt) encoded;
    ConfigError when it has no tokens."""
    if args.prompt_ids is not None:
        from mobius_lite.evaluation.qualify import parse_prompt_ids

        ids = parse_prompt_ids(args.prompt_ids)
    else:
        ids = tokenizer.encode(args.prompt if text is None else text).ids
        if not ids:
            raise ConfigError(
                f"the prompt {args.prompt!r} encodes to no tokens; give a prompt with at least "
                "one token (or --prompt-ids)"
            )
    return np.array([ids], dtype=np.int64)


def _check_length(package: Path, prompt: int, new: int) -> None:
    """ConfigError when the prompt and the new tokens pass the package's context_length
    (genai_config.json; the length onnxruntime-genai allocates for)."""
    limit = context_length(package)
    if limit is not None and prompt + new > limit:
        room = limit - prompt
        what = f"--max-new-tokens {room} or less" if room > 0 else "a shorter prompt"
        raise ConfigError(
            f"the prompt ({_count(prompt)}) and --max-new-tokens {new} make {prompt + new} "
            f"tokens, past this package's context_length {limit} (genai_config.json); give "
            f"{what}"
        )


def _count(tokens: int) -> str:
    return f"{tokens} token{'' if tokens == 1 else 's'}"


def context_length(package: Path) -> int | None:
    """model.context_length of the package's genai_config.json (None when it has none)."""
    try:
        value = json.loads((package / GENAI_CONFIG_FILE).read_text())["model"]["context_length"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _threads(args) -> Any:
    """The sessions' thread setup: onnxruntime's shared pool when `mobius` is the process
    (ort_session.on_shared_pool: the decoder and its head take turns on it); called from
    another program (main([...])), pools of their own, the decoder's threads not spinning
    beside a head (ort_session.without_spinning) and spinning without one."""
    from mobius_lite.run.ort_session import on_shared_pool, without_spinning

    if getattr(args, "process_entry", False):
        return on_shared_pool()
    return without_spinning() if args.speculative else None


def _text(args, decoder_file: Path, ids, providers: list[str], stops: set[int], printer) -> None:
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.greedy import greedy_tokens
    from mobius_lite.run.mtp_head import open_head
    from mobius_lite.run.speculative import speculative_greedy

    head = open_head(decoder_file.parent, providers, _threads(args)) if args.speculative else None
    if head is not None:
        _warn_if_inexact_verification(decoder_file)
    session = DecoderSession(decoder_file, providers, _threads(args))
    if head is None:
        printer.stream(greedy_tokens(session, ids, args.max_new_tokens, stop_tokens=stops), ids)
        return
    tokens, stats = printer.timed(
        lambda: speculative_greedy(
            session, head, ids, args.max_new_tokens, args.speculative, stops=stops
        )
    )
    printer.stream(iter(tokens[0]), ids, timed=False)
    _report(stats)


def _omni(args, package: Path, tokenizer, providers: list[str], ids, printer) -> None:
    from mobius_lite.media.audio_features import LogMelConfig, log_mel_features
    from mobius_lite.media.audio_file import load_wav
    from mobius_lite.media.image import ImageProcessorConfig, load_image, preprocess
    from mobius_lite.media.prompt import expand
    from mobius_lite.run.omni_session import Media, OmniSession

    session = OmniSession(package, providers, _threads(args))
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
    if ids is None:
        text = None if args.prompt is None else expand(args.prompt, image_tokens, audio_tokens)
        ids = _prompt_ids(args, tokenizer, text)
        _check_length(package, ids.shape[1], args.max_new_tokens)
    stop = not args.ignore_eos
    if args.speculative:
        tokens, _, stats = printer.timed(
            lambda: session.generate_speculative(
                ids,
                media,
                args.max_new_tokens,
                args.speculative,
                stop_at_eos=stop,
                keep_outputs=False,
            )
        )
        printer.stream(iter(tokens), ids, timed=False)
        _report(stats)
        return
    printer.stream(session.generate_tokens(ids, media, args.max_new_tokens, stop_at_eos=stop), ids)


def _warn_if_inexact_verification(decoder_file: Path) -> None:
    """One stderr line when the decoder computes with int8 activations (`--activations int8`)
    and its experts do not run row by row in verifying calls (a package built before they
    did: components/row_by_row.py): such a call then quantizes its activations otherwise than
    one-token steps, so speculation can give other tokens than plain greedy decoding."""
    import onnx

    from mobius_lite.evaluation.validity import int8_activation_kernels
    from mobius_lite.io_contract import ROW_BY_ROW_WINDOW

    model = onnx.load(str(decoder_file), load_external_data=False)
    exact_rows = any(prop.key == ROW_BY_ROW_WINDOW for prop in model.metadata_props)
    if int8_activation_kernels(model.graph) and not exact_rows:
        print(
            "warning: this decoder computes with int8 activations (--activations int8) and "
            "was built before its verifying calls computed each position as a one-token step "
            "does, so --speculative may not reproduce plain greedy decoding; rebuild it with "
            "mobius build to keep the tokens identical",
            file=sys.stderr,
        )


def _report(stats) -> None:
    """What --speculative did, on stderr (stdout holds only the continuation): drafts and
    acceptance, the K each round used (0: a plain step), the probes (plain steps that
    checked one draft) and the calls made."""
    used = ", ".join(f"K={k} x{n}" for k, n in sorted(stats.k_rounds.items()))
    print(
        f"speculative: {stats.proposed} drafts proposed, {stats.accepted} accepted "
        f"({100 * stats.acceptance_rate:.1f}%) in {stats.rounds} rounds ({used}); "
        f"{stats.probes} probes, {stats.probes_right} right; "
        f"{stats.decoder_calls} decoder calls ({stats.rewinds} rounds cut back from the "
        f"verifying call, {stats.rollbacks} re-runs), {stats.head_calls} head calls",
        file=sys.stderr,
    )
