"""`mobius`: the command-line front end. Each subcommand lives in its own module.

Only the module of the command being run is imported: `mobius --help` and `mobius --version`
import none of them (nor onnx, onnxruntime, torch or transformers), so they start at once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType

from mobius_lite.cli import COMMANDS
from mobius_lite.errors import Interrupted, MobiusError
from mobius_lite.optional import OPTIONAL_PACKAGES, missing_package_message
from mobius_lite.version import __version__

EPILOG = """\
examples:
  mobius build --model nvidia/NVIDIA-Nemotron-Nano-9B-v2 --output ./nano9b
  mobius build --model ./my-checkpoint --output ./pkg --dtype f16 --shard-size 512MB
  mobius inspect ./nano9b
  mobius inspect ./nano9b --json
  mobius generate ./omni --prompt "<image> Describe it." --image photo.jpg

Run `mobius COMMAND --help` for each command's options. Errors are printed as one line
(what was found, what is supported, what to do) and exit with status 2.
Documentation: docs/cli.md."""

HANDLED_SIGNALS = ("SIGINT", "SIGTERM")


def command_module(name: str) -> ModuleType:
    """mobius_lite.cli.<name>_cmd, imported on demand."""
    return importlib.import_module(f"mobius_lite.cli.{name}_cmd")


def __getattr__(name: str) -> tuple[ModuleType, ...]:
    if name == "SUBCOMMANDS":  # every command module (importing them all)
        return tuple(command_module(c) for c in COMMANDS)
    raise AttributeError(name)


def make_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command's options (`command` None), or only `command`'s options
    and a one-line entry for each other command ("": entries only, what `mobius --help`
    lists)."""
    parser = argparse.ArgumentParser(
        prog="mobius",
        description="Export NVIDIA Nemotron-H models (Mamba2 + attention + MoE) to ONNX packages "
        "that run in onnxruntime and onnxruntime-genai.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"mobius {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        if command is None or name == command:
            command_module(name).register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _chosen_command(argv: Sequence[str]) -> str:
    """The subcommand named on the command line ("" when none is: --help, --version)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else ""
    return ""


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[list[bool]]:
    """While a command runs, SIGINT and SIGTERM raise Interrupted in the main thread (so the
    build's staging directory and lock are removed on the way out); restored afterwards,
    unless the caller sets the yielded flag: then they stay ignored (the process's own entry
    point after its command finished: a signal during the interpreter's exit would only turn
    a complete result into status 143)."""
    import threading

    finished = [False]
    if threading.current_thread() is not threading.main_thread():
        yield finished
        return

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {}
    for name in HANDLED_SIGNALS:
        number = getattr(signal, name)
        previous[number] = signal.signal(number, interrupt)
    try:
        yield finished
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_IGN if finished[0] else handler)


def _quiet_stdout() -> None:
    """After a broken pipe (`mobius inspect PKG | head -1`): send what is left to /dev/null,
    so the interpreter's final flush does not complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


QUIET_FLAGS = ("-q", "--quiet")


def _quiet_dependencies(argv: Sequence[str]) -> None:
    """Before transformers is imported: its advisory lines ("PyTorch was not found ...", which
    the base install prints although no command of it needs torch) are never shown, and with
    -q / --quiet nothing below an error is, nor its or the hub's progress bars ("Loading
    weights"). A value the user set in the environment wins."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if any(arg in QUIET_FLAGS for arg in argv):
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    entry = argv is None  # the console script / python -m: the process ends with this call
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet_dependencies(argv)
    parser = make_parser(_chosen_command(argv))  # "" (no command named): one-line entries
    args = parser.parse_args(argv)
    args.process_entry = entry  # the command owns the process (generate_cmd's thread pool)
    where = f"mobius {args.command}"
    try:
        with _signals_interrupt() as finished:
            code = int(args.run(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            finished[0] = entry
            return code
    except MobiusError as exc:
        print(f"{where}: error: {exc}", file=sys.stderr)
    except KeyboardInterrupt as exc:
        name = f" by {exc.signal_name}" if isinstance(exc, Interrupted) else ""
        if getattr(args, "published", None) is not None:  # a build whose package is in place
            done = f"{args.published} was complete; the package is in place"
            print(f"{where}: interrupted{name} after {done}", file=sys.stderr)
            return 0
        print(f"{where}: interrupted{name}; {_after_interrupt(args)}", file=sys.stderr)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in OPTIONAL_PACKAGES:
            raise
        print(f"{where}: error: {missing_package_message(exc.name or '')}", file=sys.stderr)
    return 2


def _after_interrupt(args: argparse.Namespace) -> str:
    if args.command == "build":
        return f"the unfinished export was removed, {args.output} is as it was before"
    return "stopped before finishing"


if __name__ == "__main__":
    sys.exit(main())
