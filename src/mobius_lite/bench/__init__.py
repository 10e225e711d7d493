"""`mobius bench`'s measuring code: how fast a package runs, and against what.

A *peer* is one thing that runs the same synthetic prompt greedily: the package itself
(onnxruntime, through run.decoder_session.DecoderSession; an Omni package also times its
encoders), and optionally llama.cpp on a GGUF file and transformers eager on a checkpoint.
`run_bench` loads each peer once (its resident-set growth measured over the load and one
warm-up pass), then times every peer in alternating rounds (the order rotates each round) and
keeps every round with the machine's load; `BenchResult` gives the medians and the ratios.

Beside the peers, what the project's benchmark scripts (benchmarks/) share with the tests:
`workdir` (a benchmark's --workdir, refused unless a benchmark made it) and `attribution`
(decoder graphs with layers knocked out, for timing what each layer kind costs).

It sits above evaluation (the transformers peer loads the checkpoint the way qualify does) and
below cli. Requires the `runtime` extra; the peers need their own extras (`reference`,
`llamacpp`), the PNG chart Pillow.
"""

from mobius_lite.bench.measure import PeerRun, Timed
from mobius_lite.bench.rounds import BenchResult, BenchSettings, run_bench

__all__ = ["BenchResult", "BenchSettings", "PeerRun", "Timed", "run_bench"]
