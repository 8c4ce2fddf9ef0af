"""Weight and KV-cache formats, and which weights a checkpoint stores in which format.

Owns: the storage cost of a tensor in each format (element bits plus the scales that travel with it),
and reading a Hugging Face `quantization_config` into a `QuantScheme` that assigns a format to each
weight by its module name. Does not own: which kernels run a format (that is a GPU and engine matter).

Scale layouts, as the checkpoints store them:
- compressed-tensors "pack-quantized" INT4, symmetric, group 32 (Kimi K2-Thinking / K2.5 / K2.6):
  8 int4 values per int32 word, one BF16 scale per 32 weights along the input dimension (4.5 bits/weight).
- FP8 e4m3 with 128x128 blocks (DeepSeek-V3, Kimi-K2-Instruct): one FP32 scale per 128x128 block.
- MXFP4 (OCP microscaling, gpt-oss): one E8M0 (8-bit) scale per 32 FP4 values (4.25 bits/weight).
- NVFP4 (ModelOpt): one FP8 e4m3 scale per 16 FP4 values plus FP32 per-tensor weight and input scales.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from shardwise.errors import SpecError

QuantMethod = Literal["none", "fp8", "compressed-tensors", "mxfp4", "modelopt", "quark", "awq", "gptq", "override"]


@dataclass(frozen=True)
class WeightFormat:
    """How one weight matrix is stored: element width plus the scales stored beside it."""

    name: str
    element_bits: int
    group_size: int | None = None  # weights along the input dimension that share one scale
    block_shape: tuple[int, int] | None = None  # (rows, cols) that share one scale
    per_channel: bool = False  # one scale per output row
    scale_bits: int = 0  # bits of each group / block / channel scale
    zero_point_bits: int = 0  # bits of each group's zero point (asymmetric integer formats)
    tensor_scale_bits: int = 0  # bits of per-tensor scales stored once per matrix
    activation_bits: int = 16  # what the matching kernels feed the tensor cores (W4A16 → 16)

    def matrix_bytes(self, rows: int, cols: int) -> float:
        """Bytes of one (rows × cols) matrix: packed elements + scales + zero points."""
        elements_bytes = rows * cols * self.element_bits / 8
        return (
            elements_bytes
            + self._scale_count(rows, cols) * (self.scale_bits + self.zero_point_bits) / 8
            + (self.tensor_scale_bits / 8)
        )

    def _scale_count(self, rows: int, cols: int) -> int:
        if self.group_size is not None:
            return rows * math.ceil(cols / self.group_size)
        if self.block_shape is not None:
            return math.ceil(rows / self.block_shape[0]) * math.ceil(cols / self.block_shape[1])
        if self.per_channel:
            return rows
        return 0

    @property
    def bits_per_weight(self) -> float:
        """Average bits per weight of a large matrix, scales included (for display)."""
        return self.matrix_bytes(4096, 4096) * 8 / (4096 * 4096)


def _dense(name: str, bits: int) -> WeightFormat:
    return WeightFormat(name=name, element_bits=bits, activation_bits=bits)


FORMATS: dict[str, WeightFormat] = {
    "fp32": _dense("fp32", 32),
    "bf16": _dense("bf16", 16),
    "fp16": _dense("fp16", 16),
    "fp8": WeightFormat("fp8", 8, tensor_scale_bits=32, activation_bits=8),
    "fp8-channel": WeightFormat("fp8-channel", 8, per_channel=True, scale_bits=32, activation_bits=8),
    "fp8-block": WeightFormat("fp8-block", 8, block_shape=(128, 128), scale_bits=32, activation_bits=8),
    "int8": WeightFormat("int8", 8, per_channel=True, scale_bits=32, activation_bits=8),
    "int4-g32": WeightFormat("int4-g32", 4, group_size=32, scale_bits=16),
    "int4-g128": WeightFormat("int4-g128", 4, group_size=128, scale_bits=16),
    "mxfp4": WeightFormat("mxfp4", 4, group_size=32, scale_bits=8),
    "nvfp4": WeightFormat("nvfp4", 4, group_size=16, scale_bits=8, tensor_scale_bits=64, activation_bits=4),
}
FORMAT_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "int4": "int4-g32",
    "w4a16": "int4-g32",
    "fp4": "nvfp4",
    "fp8-e4m3": "fp8",
    "float8": "fp8",
}


def weight_format(name: str) -> WeightFormat:
    """Look up a format by name or alias ("bf16", "fp8-block", "int4", "nvfp4", ...)."""
    key = FORMAT_ALIASES.get(name.lower(), name.lower())
    if key not in FORMATS:
        raise SpecError(f"unknown weight format {name!r}; known formats: {', '.join(FORMATS)}")
    return FORMATS[key]


# fp8_ds_mla: FP8 MLA latents with one FP32 scale per 128 values and the RoPE key in BF16 (ModelSpec sizes its row)
KV_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp4": 0.5, "fp8_ds_mla": 1}
KV_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "auto": "bf16", "float8": "fp8"}


def kv_dtype_bytes(name: str) -> float:
    """Bytes per KV-cache element for a dtype name ("bf16", "fp8", "fp8_e4m3", ...)."""
    key = KV_ALIASES.get(name.lower(), name.lower())
    if key not in KV_DTYPE_BYTES:
        raise SpecError(f"unknown KV-cache dtype {name!r}; known: {', '.join(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[key]


# --- which weights get which format ------------------------------------------------------------------

WeightRole = Literal[
    "embedding",
    "lm_head",
    "attention",
    "dense_mlp",
    "shared_experts",
    "routed_experts",
    "router",
    "norm",
    "bias",
    "linear_attention",
    "vision",
]
# Roles that engines build as quantizable linear layers. Routers are built unquantized by the engines
# (e.g. vLLM/SGLang DeepseekV2MoE: `ReplicatedLinear(..., quant_config=None)`), embeddings are lookups.
LINEAR_ROLES = frozenset({"lm_head", "attention", "dense_mlp", "shared_experts", "routed_experts", "linear_attention"})


@dataclass(frozen=True)
class QuantScheme:
    """Which format each weight of a checkpoint is stored in, read from its `quantization_config`."""

    method: QuantMethod = "none"
    quantized: WeightFormat | None = None  # the format of every targeted linear weight
    ignore: tuple[str, ...] = ()  # module-name patterns left unquantized
    match: Literal["glob", "dotted"] = "dotted"
    targets: tuple[str, ...] = ("Linear",)  # "Linear" (class) or module-name patterns
    exclude_lm_head: bool = False  # engines build lm_head as a plain layer for this method
    roles: frozenset[str] | None = None  # for what-if overrides: restrict to these roles
    kv_dtype: str | None = None  # KV-cache dtype the checkpoint asks for (e.g. ModelOpt FP8 KV)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def format_for(self, *, module: str, role: str, dense: WeightFormat) -> WeightFormat:
        """The storage format of the weight named `module` with `role`; `dense` for unquantized ones."""
        if self.quantized is None or role not in LINEAR_ROLES:
            return dense
        if self.roles is not None and role not in self.roles:
            return dense
        if self.exclude_lm_head and role == "lm_head":
            return dense
        if not any(self._targets(t, module) for t in self.targets):
            return dense
        if any(self._matches(pattern, module) for pattern in self.ignore):
            return dense
        return self.quantized

    def _targets(self, target: str, module: str) -> bool:
        return target == "Linear" or self._matches(target, module)

    def _matches(self, pattern: str, module: str) -> bool:
        if pattern.startswith("re:"):
            return re.match(pattern[3:], module) is not None
        if self.match == "glob":
            return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")
        # a name list: the pattern is a run of whole dotted parts ("gate" hits "mlp.gate", not "gate_proj")
        return f".{pattern}." in f".{module}."


def _weights_format_from_ct(weights: dict[str, Any]) -> WeightFormat:
    """compressed-tensors weight arguments → a storage format."""
    bits, kind = int(weights.get("num_bits", 8)), weights.get("type", "int")
    strategy, group = weights.get("strategy", "tensor"), weights.get("group_size")
    symmetric = bool(weights.get("symmetric", True))
    if kind == "float" and bits == 4:
        return FORMATS["nvfp4"] if group == 16 else FORMATS["mxfp4"]
    if kind == "float" and bits == 8:
        if strategy == "block":
            rows, cols = weights.get("block_structure") or (128, 128)
            return WeightFormat(
                f"fp8-block{rows}x{cols}", 8, block_shape=(rows, cols), scale_bits=32, activation_bits=8
            )
        return FORMATS["fp8-channel"] if strategy == "channel" else FORMATS["fp8"]
    if kind == "int" and strategy == "group" and group:
        return WeightFormat(
            f"int{bits}-g{group}", bits, group_size=int(group), scale_bits=16, zero_point_bits=0 if symmetric else bits
        )
    if kind == "int" and strategy == "channel":
        return WeightFormat(
            f"int{bits}-channel",
            bits,
            per_channel=True,
            scale_bits=16,
            zero_point_bits=0 if symmetric else bits,
            activation_bits=bits if bits == 8 else 16,
        )
    raise SpecError(
        f"unsupported compressed-tensors weight scheme {weights!r}; "
        "supported: int group/channel, fp8 tensor/channel/block, fp4 group 16 or 32"
    )


def _compressed_tensors(cfg: dict[str, Any]) -> QuantScheme:
    groups = cfg.get("config_groups") or {}
    if not groups:
        raise SpecError("quantization_config (compressed-tensors) has no config_groups")
    if len(groups) > 1:
        raise SpecError(
            "compressed-tensors configs with several config_groups are not supported yet; "
            "give a --weight-dtype override instead"
        )
    group = next(iter(groups.values()))
    fmt = _weights_format_from_ct(group.get("weights") or {})
    acts = group.get("input_activations")
    if acts:
        fmt = WeightFormat(**{**fmt.__dict__, "activation_bits": int(acts.get("num_bits", 16))})
    kv = cfg.get("kv_cache_scheme")
    return QuantScheme(
        method="compressed-tensors",
        quantized=fmt,
        ignore=tuple(cfg.get("ignore") or ()),
        match="dotted",
        targets=tuple(group.get("targets") or ("Linear",)),
        kv_dtype="fp8" if kv and int(kv.get("num_bits", 16)) == 8 else None,
        raw=cfg,
    )


def _fp8(cfg: dict[str, Any]) -> QuantScheme:
    block = cfg.get("weight_block_size")
    if block:
        fmt = WeightFormat(
            f"fp8-block{block[0]}x{block[1]}" if tuple(block) != (128, 128) else "fp8-block",
            8,
            block_shape=(int(block[0]), int(block[1])),
            scale_bits=32,
            activation_bits=8,
        )
    else:
        fmt = FORMATS["fp8"]
    ignore = tuple(cfg.get("modules_to_not_convert") or cfg.get("ignored_layers") or ())
    return QuantScheme(method="fp8", quantized=fmt, ignore=ignore, match="dotted", exclude_lm_head=True, raw=cfg)


def _mxfp4(cfg: dict[str, Any]) -> QuantScheme:
    return QuantScheme(
        method="mxfp4",
        quantized=FORMATS["mxfp4"],
        ignore=tuple(cfg.get("modules_to_not_convert") or ()),
        match="glob",
        raw=cfg,
    )


def _modelopt(cfg: dict[str, Any]) -> QuantScheme:
    inner = cfg.get("quantization", cfg)
    algo = str(inner.get("quant_algo", "")).upper()
    formats = {
        "NVFP4": FORMATS["nvfp4"],
        "FP8": FORMATS["fp8"],
        "FP8_BLOCK_SCALES": FORMATS["fp8-block"],
        "MXFP4": FORMATS["mxfp4"],
    }
    if algo not in formats:
        raise SpecError(f"unsupported ModelOpt quant_algo {algo or 'missing'!r}; supported: {', '.join(formats)}")
    ignore = tuple(inner.get("exclude_modules") or inner.get("ignore") or ())
    kv_scheme = inner.get("kv_cache_scheme") or {}
    kv_fp8 = str(inner.get("kv_cache_quant_algo") or "").upper() == "FP8" or kv_scheme.get("num_bits") == 8
    return QuantScheme(
        method="modelopt",
        quantized=formats[algo],
        ignore=ignore,
        match="glob",
        kv_dtype="fp8" if kv_fp8 else None,
        raw=cfg,
    )


def _quark(cfg: dict[str, Any]) -> QuantScheme:
    """AMD Quark: one global spec for every linear layer but the excluded (exact names, or `re:` patterns); the
    engines build the excluded layers and lm_head unquantized. Only OCP MX FP4 with E8M0 scales per 32 (the MXFP4
    exports) is read; per-layer specs and a quantized KV cache are not."""
    spec = cfg.get("global_quant_config") or {}
    weight, inputs = spec.get("weight") or {}, spec.get("input_tensors") or {}
    if cfg.get("layer_quant_config") or cfg.get("layer_type_quant_config") or cfg.get("kv_cache_quant_config"):
        raise SpecError(
            "Quark configs with per-layer quant specs or a quantized KV cache are not supported yet; give a "
            "--weight-dtype override"
        )
    if (weight.get("dtype"), weight.get("group_size"), weight.get("scale_format")) != ("fp4", 32, "e8m0"):
        raise SpecError(
            f"unsupported Quark weight spec (dtype {weight.get('dtype')!r}, group {weight.get('group_size')!r}, scale "
            f"{weight.get('scale_format')!r}); supported: fp4, group 32, e8m0 (MXFP4)"
        )
    activation_bits = 4 if inputs.get("dtype") == "fp4" else 16
    return QuantScheme(
        method="quark",
        quantized=dataclasses.replace(FORMATS["mxfp4"], activation_bits=activation_bits),
        ignore=tuple(cfg.get("exclude") or ()),
        match="glob",
        exclude_lm_head=True,
        raw=cfg,
    )


def _awq_gptq(cfg: dict[str, Any], method: str) -> QuantScheme:
    bits, group = int(cfg.get("bits", cfg.get("w_bit", 4))), int(cfg.get("group_size", cfg.get("q_group_size", 128)))
    symmetric = bool(cfg.get("sym", False)) if method == "gptq" else not cfg.get("zero_point", True)
    fmt = WeightFormat(
        f"int{bits}-g{group}", bits, group_size=group, scale_bits=16, zero_point_bits=0 if symmetric else bits
    )
    return QuantScheme(
        method=method,
        quantized=fmt,
        ignore=tuple(cfg.get("modules_to_not_convert") or ()),
        match="dotted",
        exclude_lm_head=True,
        raw=cfg,
    )  # type: ignore[arg-type]


def scheme_from_config(cfg: dict[str, Any] | None) -> QuantScheme:
    """Read a Hugging Face `quantization_config` (None → unquantized)."""
    if not cfg:
        return QuantScheme()
    if not isinstance(cfg, dict):
        raise SpecError("quantization_config must be a JSON object")
    method = str(cfg.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(cfg)
    if method == "fp8":
        return _fp8(cfg)
    if method == "mxfp4":
        return _mxfp4(cfg)
    if method == "modelopt":
        return _modelopt(cfg)
    if method == "quark":
        return _quark(cfg)
    if method in ("awq", "gptq"):
        return _awq_gptq(cfg, method)
    raise SpecError(
        f"unsupported quant_method {method or 'missing'!r} in quantization_config; supported: "
        "compressed-tensors, fp8, mxfp4, modelopt, quark, awq, gptq (or override with --weight-dtype)"
    )


OVERRIDE_GROUPS = {
    "all": frozenset({"attention", "dense_mlp", "shared_experts", "routed_experts", "linear_attention"}),
    "experts": frozenset({"routed_experts"}),
    "attention": frozenset({"attention", "linear_attention"}),
    "dense": frozenset({"dense_mlp"}),
    "shared": frozenset({"shared_experts"}),
    "lm_head": frozenset({"lm_head"}),
}


@dataclass(frozen=True)
class OverriddenScheme:
    """A what-if: some roles forced to a format, every other weight as the checkpoint stores it."""

    base: QuantScheme
    forced: tuple[tuple[frozenset[str], WeightFormat], ...]
    method: str = "override"

    def format_for(self, *, module: str, role: str, dense: WeightFormat) -> WeightFormat:
        for roles, fmt in self.forced:
            if role in roles:
                return fmt
        return self.base.format_for(module=module, role=role, dense=dense)

    @property
    def kv_dtype(self) -> str | None:
        return self.base.kv_dtype


def parse_weight_override(text: str, base: QuantScheme) -> OverriddenScheme:
    """Read "fp8" (every decoder projection) or "experts=int4,attention=fp8" into an override."""
    forced: list[tuple[frozenset[str], WeightFormat]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        group, _, name = part.rpartition("=")
        group = group or "all"
        if group not in OVERRIDE_GROUPS:
            raise SpecError(f"unknown weight group {group!r} in {text!r}; use one of {', '.join(OVERRIDE_GROUPS)}")
        forced.append((OVERRIDE_GROUPS[group], weight_format(name)))
    if not forced:
        raise SpecError("empty --weight-dtype; write e.g. 'fp8' or 'experts=int4,attention=fp8'")
    # later entries refine earlier ones: "fp8,experts=int4" keeps experts in int4
    return OverriddenScheme(base=base, forced=tuple(reversed(forced)))
