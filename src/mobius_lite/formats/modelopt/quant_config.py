"""Which module of a ModelOpt checkpoint is stored how: NVFP4, FP8 or left in the checkpoint
dtype. Read from config.json `quantization_config` and/or hf_quant_config.json, validated once,
and checked against the checkpoint's tensor headers before any data is read.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.layout import CONFIG_FILE

HF_QUANT_CONFIG = "hf_quant_config.json"
NVFP4_GROUP_SIZE = 16
MIXED_PRECISION = "MIXED_PRECISION"


class TensorHeaders(Protocol):
    """What the checks read of a checkpoint: names and per-tensor dtype / shape (a
    sources.TensorSource is one; formats sit below sources and do not import them)."""

    def names(self) -> list[str]: ...

    def info(self, name: str) -> Any: ...


class QuantAlgo(str, enum.Enum):
    """How one linear's weight is stored."""

    NVFP4 = "NVFP4"
    FP8 = "FP8"
    NONE = "none"  # the checkpoint dtype (BF16 / F16 / F32)


# ModelOpt spellings -> storage. W4A16_NVFP4 is the weight-only recipe: same tensors as NVFP4.
_ALGOS: dict[str, QuantAlgo] = {
    "NVFP4": QuantAlgo.NVFP4,
    "W4A16_NVFP4": QuantAlgo.NVFP4,
    "FP8": QuantAlgo.FP8,
}


@dataclass(frozen=True)
class QuantScheme:
    """One module's storage: algorithm, block size (NVFP4: 16) and the KV cache algorithm."""

    algo: QuantAlgo
    group_size: int | None = None
    kv_cache_algo: QuantAlgo = QuantAlgo.NONE


@dataclass(frozen=True)
class ModelOptQuantization:
    """The validated per-module storage map of one checkpoint.

    quant_algo is the file's top-level algorithm (NVFP4, FP8 or MIXED_PRECISION); `layers`
    holds MIXED_PRECISION's module -> scheme entries (modules absent stay unquantized);
    `exclude` are names or fnmatch wildcards that are never quantized.
    """

    quant_algo: str
    group_size: int | None
    kv_cache_algo: QuantAlgo
    exclude: tuple[str, ...] = ()
    layers: Mapping[str, QuantScheme] = field(default_factory=lambda: MappingProxyType({}))
    sources: tuple[str, ...] = ()
    # prefixes a module's name may carry or not (module_aliases): a decoder inside a
    # multimodal checkpoint, which a config may name either way
    scopes: tuple[str, ...] = ()

    def excluded(self, module: str) -> bool:
        """Whether `module` matches an exclusion (exact name or wildcard)."""
        return any(
            fnmatchcase(name, pattern)
            for name in module_aliases(module, self.scopes)
            for pattern in self.exclude
        )

    def scheme(self, module: str) -> QuantScheme:
        """The storage of linear `module` (checkpoint name without `.weight`)."""
        if self.excluded(module):
            return QuantScheme(QuantAlgo.NONE, None, self.kv_cache_algo)
        if self.quant_algo == MIXED_PRECISION:
            for name in module_aliases(module, self.scopes):
                if name in self.layers:
                    return self.layers[name]
            return QuantScheme(QuantAlgo.NONE, None, self.kv_cache_algo)
        return QuantScheme(_ALGOS[self.quant_algo], self.group_size, self.kv_cache_algo)

    def resolve(self, module: str) -> QuantAlgo:
        """The algorithm linear `module` is stored with."""
        return self.scheme(module).algo

    def algorithms(self) -> frozenset[QuantAlgo]:
        """The algorithms its quantized modules are stored with (MIXED_PRECISION: those its
        quantized_layers name)."""
        if self.quant_algo == MIXED_PRECISION:
            return frozenset(s.algo for s in self.layers.values())
        return frozenset({_ALGOS[self.quant_algo]})


def module_aliases(module: str, scopes: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`module` (first) and its other names: the other trunk name (released checkpoints and
    transformers name the trunk `backbone.`, some tools `model.`), each with and without every
    prefix in `scopes` (the model a multimodal checkpoint holds its decoder under, which a
    quantization config may or may not write)."""
    core = module
    for scope in scopes:
        if module.startswith(scope):
            core = module[len(scope) :]
            break
    trunks = [core]
    for a, b in (("backbone.", "model."), ("model.", "backbone.")):
        if core.startswith(a):
            trunks.append(b + core[len(a) :])
            break
    names = [module] + [prefix + t for prefix in ("", *scopes) for t in trunks]
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class _Section:
    """One file's statement, normalized; None = the file does not say."""

    source: str
    quant_algo: str
    group_size: int | None
    kv_cache_algo: QuantAlgo | None
    exclude: frozenset[str] | None
    layers: dict[str, dict[str, Any]] | None


def _upper_algo(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: quant_algo must be a non-empty string, got {value!r}")
    return value.upper()


def _group_size(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: group_size must be an integer, got {value!r}")
    return value


def _kv_algo(value: Any, where: str) -> QuantAlgo | None:
    if value is None:
        return None
    if isinstance(value, dict):  # config.json's kv_cache_scheme
        if value.get("type") == "float" and value.get("num_bits") == 8:
            return QuantAlgo.FP8
        raise ConfigError(f"{where}: unsupported kv_cache_scheme {value!r} (FP8 only)")
    if isinstance(value, str) and value.upper() == "FP8":
        return QuantAlgo.FP8
    raise ConfigError(f"{where}: unsupported kv_cache_quant_algo {value!r} (FP8 only)")


def _names(value: Any, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: exclusions must be a list of module names, got {value!r}")
    return frozenset(value)


def _layers(value: Any, where: str) -> dict[str, dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(f"{where}: quantized_layers must map module names to objects")
    return value


def _algo_from_groups(groups: Any, where: str) -> tuple[str, int | None]:
    """The algorithm of a config_groups block (compressed-tensors style weights description)."""
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ConfigError(f"{where}: expected quant_algo or exactly one config_groups entry")
    weights = next(iter(groups.values())).get("weights") or {}
    bits, kind = weights.get("num_bits"), weights.get("type")
    size = _group_size(weights.get("group_size"), where)
    if kind == "float" and bits == 4:
        return "NVFP4", size
    if kind == "float" and bits == 8:
        return "FP8", None
    raise ConfigError(f"{where}: config_groups weights {weights!r} are neither NVFP4 nor FP8")


def _legacy_section(body: Mapping[str, Any], source: str) -> _Section:
    where = f"{source} quantization"
    return _Section(
        source=source,
        quant_algo=_upper_algo(body.get("quant_algo"), where),
        group_size=_group_size(body.get("group_size"), where),
        kv_cache_algo=_kv_algo(body.get("kv_cache_quant_algo"), where),
        exclude=_names(body.get("exclude_modules"), where),
        layers=_layers(body.get("quantized_layers"), where),
    )


def _config_json_section(qc: Mapping[str, Any]) -> _Section:
    source = "config.json quantization_config"
    method = str(qc.get("quant_method", "")).lower()
    if not method.startswith("modelopt"):
        raise ConfigError(
            f"{source}: quant_method {qc.get('quant_method')!r} is not supported (modelopt only)"
        )
    if isinstance(qc.get("quantization"), dict):  # the legacy body embedded in config.json
        return _legacy_section(qc["quantization"], source)
    group_size = _group_size(qc.get("group_size"), source)
    if "quant_algo" in qc:
        algo = _upper_algo(qc["quant_algo"], source)
    else:
        algo, group_size = _algo_from_groups(qc.get("config_groups"), source)
    kv = qc.get("kv_cache_scheme", qc.get("kv_cache_quant_algo"))
    return _Section(
        source=source,
        quant_algo=algo,
        group_size=group_size,
        kv_cache_algo=_kv_algo(kv, source),
        exclude=_names(qc.get("ignore", qc.get("exclude_modules")), source),
        layers=_layers(qc.get("quantized_layers"), source),
    )


def _agree(first: _Section, second: _Section) -> None:
    """Both files describe one checkpoint: every field both state must be equal."""

    def shown(value: Any) -> Any:
        return sorted(value) if isinstance(value, frozenset) else value

    differing = [
        f"{name}: {shown(a)!r} ({first.source}) vs {shown(b)!r} ({second.source})"
        for name in ("quant_algo", "group_size", "kv_cache_algo", "exclude", "layers")
        if (a := getattr(first, name)) is not None
        and (b := getattr(second, name)) is not None
        and (sorted(a) if isinstance(a, frozenset) else a)
        != (sorted(b) if isinstance(b, frozenset) else b)
    ]
    if differing:
        raise ConfigError(
            "config.json and hf_quant_config.json disagree on the quantization: "
            + "; ".join(differing)
        )


def _merge(first: _Section, second: _Section | None) -> _Section:
    if second is None:
        return first
    _agree(first, second)

    def pick(name: str) -> Any:
        value = getattr(first, name)
        return getattr(second, name) if value is None else value

    return _Section(
        source=f"{first.source} + {second.source}",
        quant_algo=first.quant_algo,
        group_size=pick("group_size"),
        kv_cache_algo=pick("kv_cache_algo"),
        exclude=pick("exclude"),
        layers=pick("layers"),
    )


def _nvfp4_group(size: int | None, where: str) -> int:
    if size not in (None, NVFP4_GROUP_SIZE):
        raise ConfigError(f"{where}: NVFP4 group_size must be {NVFP4_GROUP_SIZE}, got {size}")
    return NVFP4_GROUP_SIZE


def _validate(section: _Section, scopes: tuple[str, ...]) -> ModelOptQuantization:
    kv = section.kv_cache_algo or QuantAlgo.NONE
    algo = section.quant_algo
    exclude = tuple(sorted(section.exclude or ()))
    sources = tuple(section.source.split(" + "))
    if algo == MIXED_PRECISION:
        if not section.layers:
            raise ConfigError(f"{section.source}: MIXED_PRECISION needs a quantized_layers map")
        layers: dict[str, QuantScheme] = {}
        unknown = []
        for module, entry in sorted(section.layers.items()):
            name = str(entry.get("quant_algo", "")).upper()
            if name not in _ALGOS:
                unknown.append(f"{module}: {entry.get('quant_algo')!r}")
                continue
            storage = _ALGOS[name]
            size = _group_size(entry.get("group_size"), f"{section.source} {module}")
            if storage is QuantAlgo.NVFP4:
                size = _nvfp4_group(size, f"{section.source} {module}")
            layers[module] = QuantScheme(storage, size, kv)
        if unknown:
            raise ConfigError(
                f"{section.source}: MIXED_PRECISION names algorithms this exporter does not "
                f"support (NVFP4, W4A16_NVFP4, FP8): {', '.join(unknown)}"
            )
        return ModelOptQuantization(
            MIXED_PRECISION, None, kv, exclude, MappingProxyType(layers), sources, scopes
        )
    if algo not in _ALGOS:
        raise ConfigError(
            f"{section.source}: quant_algo {algo!r} is not supported "
            f"(NVFP4, W4A16_NVFP4, FP8, MIXED_PRECISION)"
        )
    size = section.group_size
    if _ALGOS[algo] is QuantAlgo.NVFP4:
        size = _nvfp4_group(size, section.source)
    return ModelOptQuantization(algo, size, kv, exclude, MappingProxyType({}), sources, scopes)


def parse_quantization(
    config: Mapping[str, Any] | None,
    hf_quant_config: Mapping[str, Any] | None,
    scopes: tuple[str, ...] = (),
) -> ModelOptQuantization | None:
    """The storage map from config.json's dict and/or hf_quant_config.json's; None if neither
    describes a quantization. Both present: they must agree (ConfigError naming the fields).
    `scopes`: prefixes the config's module names may leave off (module_aliases)."""
    qc = (config or {}).get("quantization_config")
    first = _config_json_section(qc) if qc else None
    second = None
    if hf_quant_config is not None:
        body = hf_quant_config.get("quantization")
        if not isinstance(body, dict):
            raise ConfigError(f"{HF_QUANT_CONFIG}: no 'quantization' object")
        second = _legacy_section(body, HF_QUANT_CONFIG)
    if first is None and second is None:
        return None
    merged = _merge(first, second) if first is not None else second
    assert merged is not None
    return _validate(merged, scopes)


def load_quantization(directory: str | Path) -> ModelOptQuantization | None:
    """parse_quantization over a checkpoint directory's config.json / hf_quant_config.json."""
    directory = Path(directory)

    def read(name: str) -> dict[str, Any] | None:
        path = directory / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not valid JSON ({error})") from error

    return parse_quantization(read(CONFIG_FILE), read(HF_QUANT_CONFIG))


# --- checkpoint headers against the scheme -------------------------------------------------

U8 = np.dtype(np.uint8)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)
DENSE_DTYPES = frozenset({F32, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
SCALE_SUFFIXES = (".weight_scale_2", ".weight_scale", ".input_scale", ".k_scale", ".v_scale")
SCALAR_SHAPES = ((), (1,))


class QuantTensorError(CheckpointError):
    """One kind of mismatch between the checkpoint's tensors and its quantization config."""

    def __init__(self, problem: str, names: list[str]) -> None:
        self.problem = problem
        self.names = names
        super().__init__(f"{problem} ({len(names)}): " + ", ".join(names))


@dataclass(frozen=True)
class _Expect:
    name: str
    dtypes: frozenset[np.dtype]
    shapes: tuple[tuple[int, ...], ...]
    optional: bool = False


def _expected(module: str, shape: tuple[int, int], scheme: QuantScheme) -> list[_Expect]:
    n, k = shape
    w = f"{module}.weight"
    scalar = frozenset({F32})
    if scheme.algo is QuantAlgo.NVFP4:
        return [
            _Expect(w, frozenset({U8}), ((n, k // 2),)),
            _Expect(f"{w}_scale", frozenset({E4M3}), ((n, k // NVFP4_GROUP_SIZE),)),
            _Expect(f"{w}_scale_2", scalar, SCALAR_SHAPES),
            _Expect(f"{module}.input_scale", scalar, SCALAR_SHAPES, optional=True),
        ]
    if scheme.algo is QuantAlgo.FP8:
        return [
            _Expect(w, frozenset({E4M3}), ((n, k),)),
            _Expect(f"{w}_scale", scalar, SCALAR_SHAPES),
            _Expect(f"{module}.input_scale", scalar, SCALAR_SHAPES, optional=True),
        ]
    return [_Expect(w, DENSE_DTYPES, ((n, k),))]


def check_tensors(
    quantization: ModelOptQuantization,
    source: TensorHeaders,
    linear_modules: Mapping[str, tuple[int, int]],
) -> None:
    """Check every linear's stored tensors (dtype, shape, presence) from headers alone.

    linear_modules: checkpoint module name -> logical weight shape (out, in), per expert for
    routed experts. Raises one QuantTensorError per kind of problem, in a fixed order
    (missing, dtype, shape, unexpected), listing every name of that kind.
    """
    present = set(source.names())
    expected: list[_Expect] = []
    for module, shape in linear_modules.items():
        scheme = quantization.scheme(module)
        expected += _expected(module, shape, scheme)
        leaf = module.rsplit(".", 1)[-1]
        if scheme.kv_cache_algo is QuantAlgo.FP8 and leaf in ("k_proj", "v_proj"):
            expected.append(_Expect(f"{module}.{leaf[0]}_scale", frozenset({F32}), SCALAR_SHAPES))
    missing, dtype, shape_errors = [], [], []
    for e in expected:
        if e.name not in present:
            if not e.optional:
                missing.append(e.name)
            continue
        info = source.info(e.name)
        if info.dtype not in e.dtypes:
            wanted = "/".join(sorted(str(d) for d in e.dtypes))
            dtype.append(f"{e.name} is {info.dtype}, expected {wanted}")
        elif tuple(info.shape) not in e.shapes:
            shape_errors.append(
                f"{e.name} is {list(info.shape)}, expected {' or '.join(map(str, e.shapes))}"
            )
    known = {e.name for e in expected}
    unexpected = sorted(
        name for name in present if name.endswith(SCALE_SUFFIXES) and name not in known
    )
    for problem, names in (
        ("missing quantization tensors", missing),
        ("unexpected dtype", dtype),
        ("wrong shape", shape_errors),
        ("scale tensors the quantization config does not call for", unexpected),
    ):
        if names:
            raise QuantTensorError(problem, sorted(names))
