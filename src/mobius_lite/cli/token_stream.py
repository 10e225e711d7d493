"""`mobius generate`'s output: each token written to stdout as it is chosen, flushed.

Ids are written space-separated; text is decoded incrementally (special tokens skipped): each
new token's text is the decode of a short window of tokens ending with it, minus the decode of
the window without it, so the pieces join to the decode of the whole continuation while each
step decodes a few tokens only (a long run does not re-decode everything it has printed). A
piece that ends inside a multi-byte character (U+FFFD) waits for the next token. A SIGINT then
keeps what was printed, and the speed goes to stderr at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO, TypeVar

REPLACEMENT = "\ufffd"  # what a decode ending inside a UTF-8 sequence ends with
T = TypeVar("T")


class TokenPrinter:
    """Writes tokens to `out` as they come: ids when `tokenizer` is None, else text."""

    def __init__(self, tokenizer: Any | None, out: TextIO | None = None) -> None:
        self.tokenizer = tokenizer
        self.out = out if out is not None else sys.stdout
        self.tokens: list[int] = []
        self.prefix = 0  # the decode window starts here (context for the next piece)
        self.read = 0  # the text of tokens[:read] is written
        self.elapsed: float | None = None  # seconds of a run timed by `timed`
        self.closed = False

    @property
    def count(self) -> int:
        """Tokens received so far."""
        return len(self.tokens)

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def add(self, token: int) -> None:
        """Write one token (its text once it is complete), flushed."""
        self.tokens.append(token)
        if self.tokenizer is None:
            self.out.write(("" if len(self.tokens) == 1 else " ") + str(token))
        else:
            before = self._decode(self.tokens[self.prefix : self.read])
            text = self._decode(self.tokens[self.prefix :])
            if len(text) <= len(before) or text.endswith(REPLACEMENT):
                return
            self.out.write(text[len(before) :])
            self.prefix, self.read = self.read, len(self.tokens)
        self.out.flush()

    def close(self) -> None:
        """Write what is still held back and end the line (once)."""
        if self.closed:
            return
        self.closed = True
        if not self.tokens:  # interrupted before the first token: nothing to end
            return
        if self.tokenizer is not None and self.read < len(self.tokens):
            before = self._decode(self.tokens[self.prefix : self.read])
            self.out.write(self._decode(self.tokens[self.prefix :])[len(before) :])
        self.out.write("\n")
        self.out.flush()

    def stream(self, tokens: Iterable[int], prompt: Any, timed: bool = True) -> None:
        """Write every token of `tokens` as it comes, then the speed on stderr (the time from
        the first token on is the decoding rate; before it, the prefill). The prompt's length
        (input_ids [1, n]) goes to stderr once the prefill has run, so that a prompt the
        decoder refuses gives its one error line only."""
        start = time.perf_counter()
        first = start
        for token in tokens:
            if not self.tokens:
                first = time.perf_counter()
                print(f"prompt: {prompt.shape[1]} tokens", file=sys.stderr)
            self.add(token)
        end = time.perf_counter()
        self.close()
        if timed:
            self.report(end - start, first - start)
        elif self.elapsed is not None:
            self.report(self.elapsed, None)

    def timed(self, run: Callable[[], T]) -> T:
        """`run()`, its duration kept for the speed line (a run that returns all its tokens
        at the end, as speculative decoding does)."""
        start = time.perf_counter()
        result = run()
        self.elapsed = time.perf_counter() - start
        return result

    def report(self, total: float, prefill: float | None) -> None:
        """One line on stderr: tokens, seconds, tokens per second."""
        n = len(self.tokens)
        line = f"generated {n} token{'s' if n != 1 else ''} in {total:.2f} s"
        if prefill is not None and n > 1 and total > prefill:
            line += f": {(n - 1) / (total - prefill):.1f} tokens/s after a {prefill:.2f} s prefill"
        elif total > 0:
            line += f" ({n / total:.1f} tokens/s)"
        print(line, file=sys.stderr)
