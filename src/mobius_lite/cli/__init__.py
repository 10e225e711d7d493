"""Command-line interface.

COMMANDS is the one list of subcommands and their one-line help: `mobius --help` and
`mobius --version` read it without importing any command module (they would import onnx,
onnxscript and more), and each module's parser takes its help line from it.
"""

COMMANDS: dict[str, str] = {
    "build": "export a Nemotron-H checkpoint (directory or hub id) to an ONNX package",
    "inspect": "describe an exported package: graphs, I/O, ops, weights, data files",
    "verify": "check that a package's weights are exactly its source checkpoint's",
    "qualify": "check a package against its source checkpoint: four separate verdicts",
    "generate": "greedy generation from a package (text, or Omni with images and audio)",
    "bench": "time a package's prefill and decode, next to llama.cpp and transformers",
    "demo": "write a small random checkpoint (text, moe, puzzle, mtp, omni, gguf) to try",
}
