#!/usr/bin/env python3
"""Resolve SGLang launch commands with the real sglang package on a CPU-only box.

Run with the venv made by conformance/setup-sglang.sh:

    .engines/sglang-0.5.23/bin/python conformance/sglang_oracle.py < cmds.jsonl > out.jsonl

Input, one JSON object per line:
    {"argv": ["--model-path", "/dir/with/config.json", "--tp-size", "8"],
     "gpu": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 8,
             "capability": [9, 0], "sm_count": 132, "nvlink": true, "p2p": true},
     "memory": {"capacity_bytes": 85520809984, "free_before_load_bytes": 81225842688,
                "weights_bytes": [19000000000]},
     "id": "optional, echoed back", "env": {"OPTIONAL_ENV": "for this command"}}
Optional gpu keys: "sm_count" (default 132), "nvlink", "p2p" (default true),
"driver" (nvidia-smi driver_version), "cuda" (torch.version.cuda); the trace
names the ones that were defaulted. "memory" is optional: with it, a command
that resolves also gets its KV pool sized by SGLang's own code (all figures per
GPU, in bytes; "weights_bytes" has one entry per pipeline stage).

Output, one JSON object per input line, in order:
    {"id", "ok", "refusal", "crash", "error", "resolved", "kv_pool", "reset",
     "warnings", "notes", "trace", "ms"}
- "ok": true when the engine accepted the command through every stage run.
- "refusal": null, or {"stage", "type", "message"}: the engine refused it.
  stage is "parse" (argparse / prepare_server_args), "post_init" (ServerArgs
  construction), "resolve" (resolve_once), "check" (check_server_args),
  "publish" (the launcher's publish of the parallel topology), "load" or
  "kv_pool" (only with "memory": the weights, then the KV pool SGLang sizes,
  on the faked device). A refusal the faked device gives (out of memory) says
  "by": "device": the oracle's arithmetic on the memory it was given.
- "crash": null, or {"type", "message", "where"}: the oracle, an import stub or
  the faked GPU failed, so the engine's answer is unknown (never a refusal).
  The rule is in SGLANG_NOTES.md ("Answers: refusal or crash").
- "error": "Type: message" of the refusal or the crash, else null.
- "kv_pool": null, or {"tokens_per_rank", "cell_bytes_per_token",
  "max_running_requests", "unchecked", ...} (see KvPoolSizer.answer).
- "reset" lists flags the command set that resolution changed, with the
  handler that did it (from SGLang's own _resolved_overrides);
  "warnings"/"notes" are the WARNING+/INFO records SGLang logged; "trace"
  records what memory_hook's helpers returned (GPU MiB, reserve_for_graph_mb,
  VLM adjustment) and any GPU probe the fakes could not answer.

This follows `python -m sglang.launch_server` up to model loading:
prepare_server_args(argv) -> ServerArgs.resolve_once() (the whole resolution
pipeline, sglang/srt/arg_groups/pipeline.py) -> ServerArgs.check_server_args(),
then, with "memory", the scheduler's KV-pool sizing (KvPoolSizer).

Design: this process is a router. Some SGLang modules freeze GPU facts into
module-level constants at import time (e.g. layers/deep_gemm_wrapper/configurer.py),
so each distinct "gpu" gets its own worker process that fakes that GPU *before*
importing sglang, and then serves every command for that GPU. Inside a worker,
each command runs on fresh objects, with SGLang's lru_caches cleared and
os.environ restored afterwards. A worker that dies or hangs costs one command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import select
import subprocess
import sys
import time
import traceback
import types
from dataclasses import dataclass, field

# uvicorn/fastapi: the HTTP server a real install has; only imported (at module level by
# sglang/srt/distributed/gated_launch.py, which bootstrap.measure_pre_model_load_memory lives beside).
STUBBED_PACKAGES = ("torchvision", "sgl_kernel", "flashinfer", "uvicorn", "fastapi")
DEFAULTS = {"driver": "580.95.05", "cuda": "13.0", "sm_count": 132, "nvlink": True, "p2p": True}
WARMUP_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
NOISE = (DeprecationWarning, PendingDeprecationWarning, ResourceWarning, ImportWarning)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ORACLE_FILE = os.path.abspath(__file__)

# Fields reported by default (all of them with --all-fields).
KEY_FIELDS = (
    "model_path",
    "device",
    "dtype",
    "quantization",
    "tp_size",
    "pp_size",
    "dp_size",
    "ep_size",
    "moe_dp_size",
    "attn_cp_size",
    "attn_dp_size",
    "dcp_size",
    "dcp_comm_backend",
    "enable_dp_attention",
    "enable_dp_lm_head",
    "nnodes",
    "node_rank",
    "dist_init_addr",
    "mem_fraction_static",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "max_total_tokens",
    "disable_cuda_graph",
    "attention_backend",
    "decode_attention_backend",
    "prefill_attention_backend",
    "moe_a2a_backend",
    "moe_runner_backend",
    "kv_cache_dtype",
    "page_size",
    "disable_overlap_schedule",
    "disable_radix_cache",
    "context_length",
    "language_model_only",
    "enable_eplb",
    "ep_num_redundant_experts",
)


# ----------------------------------------------------------------------------
# Worker side: what stands in for the GPU and the CUDA-only packages
# ----------------------------------------------------------------------------


class FakeGap(RuntimeError):
    """A fake was asked something it does not model; always a crash, never the engine's answer."""


class BadRequest(ValueError):
    """The request itself is malformed (a crash at "request": the oracle cannot answer it)."""


class StandIn:
    """An object the oracle builds in place of one SGLang would have (device properties, a process group,
    the loaded model): an AttributeError on it is a gap in the stand-in, so a crash."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"StandIn({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


# Import stubs: classes made on attribute access, named Stub[...] so an error message naming one is
# recognisable (see crash_of).
class StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)


class StubObject(metaclass=StubMeta):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return StubObject()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)


def _stub_class(name):
    return StubMeta(f"Stub[{name}]", (StubObject,), {})


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)


def _is_stub_or_fake(obj) -> bool:
    return isinstance(obj, (StubObject, StubMeta, StubModule, StandIn))


# What the fakes answer while a command runs. The KV-pool sizing switches `world` on (FakeWorld).
GPU: dict = {}
PROBES: dict = {"unanswered": [], "topology": []}


def fake_gpu(gpu: dict) -> list:
    """Make torch (and nvidia-smi) report `gpu`; must run before sglang imports. Returns the gpu keys that
    were defaulted."""
    import torch

    defaulted = sorted(k for k in DEFAULTS if k not in gpu)
    g = {**DEFAULTS, **gpu}
    major, minor = (int(x) for x in g["capability"])
    total = int(g["memory_mib"]) * 1024 * 1024
    GPU.update(g, total=total, major=major, minor=minor, world=None)
    GPU["props"] = StandIn(
        name=g["name"],
        major=major,
        minor=minor,
        total_memory=total,
        multi_processor_count=int(g["sm_count"]),
        gcnArchName="",
        uuid="fake",
        is_integrated=False,
    )
    cuda = torch.cuda
    cuda.is_available = _fake_is_available
    cuda.device_count = _fake_device_count
    cuda.current_device = _fake_current_device
    cuda.get_device_capability = _fake_get_device_capability
    cuda.get_device_name = _fake_get_device_name
    cuda.get_device_properties = _fake_get_device_properties
    cuda.mem_get_info = _fake_mem_get_info
    cuda.can_device_access_peer = _fake_can_device_access_peer
    torch.version.cuda = str(g["cuda"])
    GPU["real_run"] = subprocess.run
    subprocess.run = _fake_run
    return defaulted


# Named functions (not lambdas): a TypeError from calling one with arguments it does not take names it,
# "_fake_…()", and crash_of reads that as the fake failing.
def _fake_is_available():
    return True


def _fake_device_count():
    return int(GPU["count"])


def _fake_current_device():
    return 0


def _fake_get_device_capability(device=None):
    return (GPU["major"], GPU["minor"])


def _fake_get_device_name(device=None):
    return GPU["name"]


def _fake_get_device_properties(device=None):
    return GPU["props"]


def _fake_mem_get_info(device=None):
    """(free, total): the whole GPU while arguments resolve; while the KV pool is sized, what FakeWorld says."""
    world = GPU["world"]
    if world is None:
        return (GPU["total"], GPU["total"])
    return world.mem_get_info()


def _fake_can_device_access_peer(device, peer):
    """The request's "p2p" (SGLang reads it only when building custom all-reduce, after argument resolution)."""
    PROBES["topology"].append("torch.cuda.can_device_access_peer")
    return bool(GPU["p2p"])


NVIDIA_SMI_QUERIES = {
    "--query-gpu=memory.total": lambda g: str(int(g["memory_mib"])),
    "--query-gpu=compute_cap": lambda g: f"{g['major']}.{g['minor']}",
    "--query-gpu=driver_version": lambda g: str(g["driver"]),
    "--query-gpu=name": lambda g: g["name"],
}


def _fake_run(args, *a, **kw):
    """nvidia-smi as SGLang queries it (memory, compute capability, driver, name); any other nvidia-smi call
    fails as on a box without the tool, and is recorded so the answer shows the probe went unanswered."""
    if not (isinstance(args, (list, tuple)) and args and args[0] == "nvidia-smi"):
        return GPU["real_run"](args, *a, **kw)
    text = kw.get("text") or kw.get("universal_newlines")
    query = next((x for x in args if str(x).startswith("--query-gpu=")), None)
    if query in NVIDIA_SMI_QUERIES:
        out = "\n".join([NVIDIA_SMI_QUERIES[query](GPU)] * int(GPU["count"])) + "\n"
        return subprocess.CompletedProcess(args, 0, out if text else out.encode(), "" if text else b"")
    PROBES["unanswered"].append(" ".join(map(str, args)))
    err = "unsupported query (faked nvidia-smi)"
    return subprocess.CompletedProcess(args, 1, "" if text else b"", err if text else err.encode())


def install_import_stubs() -> None:
    """Empty stand-ins for packages a real install has but this box can't load (or lacks).

    sgl_kernel/flashinfer ship CUDA binaries (imported at module level once
    is_cuda() is true; flashinfer's presence also drives has_flashinfer);
    torchvision's PyPI wheel links libtorch_cuda; uvicorn/fastapi are only
    imported. Only their import matters here.
    """
    import importlib.abc
    import importlib.machinery

    # transformers caches this; keep it False so it never drives torchvision itself.
    import transformers.utils.import_utils as hf_imports

    hf_imports.is_torchvision_available()

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in STUBBED_PACKAGES:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = StubModule(spec.name)
            module.__path__ = []
            module.__version__ = "0.0.0+stub"
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


# ----------------------------------------------------------------------------
# Refusal or crash (SGLANG_NOTES.md, "Answers: refusal or crash")
# ----------------------------------------------------------------------------

# Oracle functions an exception may pass through on its way out of SGLang without the oracle being the
# cause: they only forward a call (the memory_hook spies). Registered with @_transparent.
TRANSPARENT: set = set()


def _transparent(fn):
    TRANSPARENT.add(fn.__code__)
    return fn


def _engine_dirs() -> tuple:
    import argparse as _argparse

    import sglang

    return (os.path.dirname(sglang.__file__) + os.sep, _argparse.__file__)


REAL_CUDA_MESSAGES = (
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "no CUDA GPUs are available",
    "CUDA driver initialization failed",
    "NVML Shared Library Not Found",
)


def _chain(exc):
    """exc, then what caused it (explicit __cause__, or the implicit __context__ unless suppressed)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def _where(code, lineno) -> str:
    fake = code.co_name.startswith("_fake_") or code.co_qualname.startswith(("FakeWorld.", "StandIn"))
    kind = (
        "fake GPU"
        if fake
        else (
            "import stub"
            if code.co_qualname.split(".")[0] in ("StubMeta", "StubObject", "StubModule")
            or ".Finder." in code.co_qualname
            else "oracle"
        )
    )
    return f"{kind}: {code.co_qualname} ({os.path.basename(ORACLE_FILE)}:{lineno})"


def _crash_reason(exc, engine_dirs) -> str | None:
    """Why `exc` is the oracle's failure rather than SGLang refusing, or None for a refusal."""
    if isinstance(exc, FakeGap):  # raised by a fake: name it
        frame, line = list(traceback.walk_tb(exc.__traceback__))[-1]
        return _where(frame.f_code, line)
    if isinstance(exc, BadRequest):
        return "request"
    if isinstance(exc, ImportError):  # ModuleNotFoundError included: this box lacks what a real install has
        return f"import: {exc.name or 'a module'} does not import here"
    frames = list(traceback.walk_tb(exc.__traceback__))
    first = next((i for i, (f, _) in enumerate(frames) if f.f_code.co_filename.startswith(engine_dirs)), None)
    if first is None:  # raised by the oracle's own code, before any SGLang frame
        return _where(frames[-1][0].f_code, frames[-1][1]) if frames else "oracle"
    for f, line in frames[first:]:  # below SGLang: an oracle frame is a stub, a fake or a stand-in failing
        if f.f_code.co_filename == ORACLE_FILE and f.f_code not in TRANSPARENT:
            return _where(f.f_code, line)
    inner = frames[-1][0]
    path = inner.f_code.co_filename.replace(os.sep, "/")
    if "/torch/cuda/" in path or "/torch/distributed/" in path:
        return f"fake GPU: {inner.f_code.co_name} in {path.split('/torch/', 1)[1]} is not faked"
    message = str(exc)
    if any(m in message for m in REAL_CUDA_MESSAGES):
        return "fake GPU: reached real CUDA"
    if isinstance(exc, (AttributeError, TypeError)):
        if _is_stub_or_fake(getattr(exc, "obj", None)):
            return f"stand-in: {type(exc.obj).__name__} lacks {getattr(exc, 'name', '?')!r}"
        if re.search(r"Stub\[|StubObject|StubMeta|StubModule|StandIn|\b_fake_\w+\(\)", message):
            return "import stub or fake GPU named in the message"
        if any(_is_stub_or_fake(v) for v in inner.f_locals.values()):
            return f"stub or stand-in among the locals of {inner.f_code.co_qualname}"
    return None


def crash_of(exc, engine_dirs) -> dict | None:
    """A crash record if `exc`, or anything that caused it, is the oracle's failure; else None (a refusal)."""
    for e in _chain(exc):
        why = _crash_reason(e, engine_dirs)
        if why:
            return {"type": type(e).__name__, "message": _text(e), "where": why}
    return None


def _text(exc) -> str:
    return ANSI.sub("", str(exc))


def _parse_stage(exc) -> str:
    """prepare_server_args parses the command line, then builds ServerArgs (from_cli_args; its __post_init__
    does nothing in 0.5.23): which of the two raised."""
    names = [f.f_code.co_name for f, _ in traceback.walk_tb(exc.__traceback__)]
    if "prepare_server_args" in names:
        below = names[names.index("prepare_server_args") + 1 :]
        if below and below[0] in ("from_cli_args", "__post_init__", "__init__"):
            return "post_init"
    return "parse"


# ----------------------------------------------------------------------------
# Worker side: logs, caches
# ----------------------------------------------------------------------------


class Capture:
    """Collects SGLang log records and Python warnings for one command."""

    def __init__(self):
        import logging

        self.records: list = []
        self.on = True
        capture = self

        class Handler(logging.Handler):
            def emit(self, record):
                if not capture.on:
                    return
                try:
                    msg = record.getMessage()
                except Exception:  # a broken format string must not fail the command
                    msg = str(record.msg)
                capture.records.append((record.levelno, ANSI.sub("", msg)))

        self.handler = Handler(level=logging.INFO)
        logger = logging.getLogger("sglang")
        logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)

    @contextlib.contextmanager
    def paused(self):
        """Drop what SGLang logs meanwhile: the oracle's own probing, not the command's answer."""
        self.on = False
        try:
            yield
        finally:
            self.on = True

    def split(self):
        import logging

        warn = [m for lvl, m in self.records if lvl >= logging.WARNING]
        info = [m for lvl, m in self.records if lvl < logging.WARNING]
        return warn, info


class Stages:
    """The stage a command is in, so an exception can be placed (parse → resolve → check → publish → kv_pool)."""

    def __init__(self):
        self.now: str | None = None


# ----------------------------------------------------------------------------
# Worker side: the KV pool, sized by SGLang's own code
# ----------------------------------------------------------------------------


@dataclass
class MemoryRequest:
    capacity: int
    free_before: int
    weights: list

    @classmethod
    def parse(cls, memory: dict, pp_size: int) -> MemoryRequest:
        try:
            req = cls(
                int(memory["capacity_bytes"]),
                int(memory["free_before_load_bytes"]),
                [int(w) for w in memory["weights_bytes"]],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequest(f"memory needs capacity_bytes, free_before_load_bytes, weights_bytes: {exc!r}") from exc
        if len(req.weights) != pp_size:
            raise BadRequest(f"weights_bytes has {len(req.weights)} stages, the command has pp_size {pp_size}")
        if not 0 < req.free_before <= req.capacity:
            raise BadRequest("free_before_load_bytes must be in (0, capacity_bytes]")
        return req


class DeviceOutOfMemory(Exception):
    """The faked device holds less than SGLang asks of it (the weights, or the pool it sized): the refusal a real
    device gives, torch's OutOfMemoryError, reported with `by: "device"` (the oracle's arithmetic on the memory it
    was given, not SGLang's code)."""

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(message)
        self.stage = stage


class FakeWorld:
    """Every rank's GPU memory while the KV pool is sized, and the collectives over them.

    All GPUs of a pipeline stage hold the same weights, so a rank's free memory is its stage's: before load,
    free_before; after load, free_before − weights[stage]. SGLang's only collectives on this path are MIN
    all-reduces over the WORLD group: of each rank's free memory (a float32 tensor,
    get_available_gpu_memory(distributed=True)) and of each stage's token capacity (an int64 tensor,
    KVCacheConfigurator._apply_token_constraints, PP only). The first answers from the figures above; the
    second from each stage's own contribution, which KvPoolSizer gathers in a first pass over the stages.
    """

    def __init__(self, request: MemoryRequest):
        self.request = request
        self.stage = 0
        self.loaded = False
        self.tokens: dict = {}  # stage -> its token capacity, as it entered the MIN all-reduce
        self.tokens_complete = False

    def free(self, stage: int) -> int:
        r = self.request
        return r.free_before - (r.weights[stage] if self.loaded else 0)

    def mem_get_info(self):
        return (self.free(self.stage), self.request.capacity)

    def all_reduce(self, tensor, op, group):
        import torch

        if not isinstance(group, StandInGroup.Cpu):
            raise FakeGap(f"all_reduce over {group!r}, a group the oracle does not fake")
        if op != torch.distributed.ReduceOp.MIN:
            raise FakeGap(f"all_reduce with {op}: the oracle fakes only the MIN reductions of KV sizing")
        if tensor.dtype.is_floating_point:  # every rank's free memory, each as the float32 it sends
            stages = range(len(self.request.weights))
            tensor.fill_(min(torch.tensor(self.free(s), dtype=tensor.dtype).item() for s in stages))
        else:
            self.tokens[self.stage] = int(tensor.item())
            if self.tokens_complete:
                tensor.fill_(min(self.tokens.values()))


class StandInGroup(StandIn):
    """A process group handle: its size and this rank's place, and a CPU group only FakeWorld reduces over."""

    class Cpu(StandIn):
        pass

    def __init__(self, world_size: int, rank_in_group: int):
        super().__init__(world_size=world_size, rank_in_group=rank_in_group, cpu_group=StandInGroup.Cpu())


def _fake_all_reduce(tensor, op=None, group=None, async_op=False):
    world = GPU["world"]
    if world is None:
        raise FakeGap("torch.distributed.all_reduce outside KV-pool sizing")
    world.all_reduce(tensor, op, group)


@dataclass
class StageRun:
    """What one pipeline stage's rank 0 computed."""

    stage: int
    layers: tuple
    config: object = None  # SGLang's MemoryPoolConfig
    configurator: object = None  # the MemoryPoolConfigurator SGLang built for it
    available_bytes: int | None = None
    pre_model_load_gib: float | None = None
    logical_tokens: int | None = None
    notes: dict = field(default_factory=dict)


class KvPoolSizer:
    """SGLang's KV-pool sizing for a resolved command, with the GPU memory faked (SGLANG_NOTES.md, "KV pool").

    What the scheduler process does before the pool is allocated, per rank: TpModelWorker._init_model_config,
    bootstrap.measure_pre_model_load_memory (ModelRunner.init_torch_distributed), the model load (faked: free
    memory drops by the stage's weights), ModelRunner.configure_kv_cache_dtype, layer_setup.resolve_layer_indices,
    ModelRunner.init_kv_cache_configurator, then KVCacheConfigurator._resolve_memory_pool_config (the part of
    configure() before the pools are built: _profile_available_bytes, config_from_budget with
    _apply_token_constraints, resolve_max_num_reqs, finalize_with_max_running_requests). ModelRunner itself does
    not import here (its module needs openai, einops, which this venv lacks), so its field wiring is repeated
    below, each value from the SGLang function ModelRunner takes it from.
    """

    def __init__(self, capture: Capture):
        import torch
        from sglang.srt import runtime_context
        from sglang.srt.arg_groups.overrides import post_capture_kv_sizing_planned, resolving_view
        from sglang.srt.configs.model_config import AttentionArch, ModelConfig
        from sglang.srt.distributed import bootstrap
        from sglang.srt.distributed.utils import get_pp_indices
        from sglang.srt.mem_cache import kv_cache_configurator as kvc_module
        from sglang.srt.mem_cache import kv_cache_dtype
        from sglang.srt.model_executor import pool_configurator
        from sglang.srt.model_executor.model_runner_components import (
            kv_pool_runtime,
            layer_setup,
            load_model_utils,
            spec_aux_hidden_state,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.torch = torch
        self.capture = capture
        self._window_unchecked = None
        self.AttentionArch, self.ModelConfig = AttentionArch, ModelConfig
        self.bootstrap, self.get_pp_indices = bootstrap, get_pp_indices
        self.kvc_module, self.kv_cache_dtype, self.pool_configurator = kvc_module, kv_cache_dtype, pool_configurator
        self.kv_pool_runtime, self.layer_setup = kv_pool_runtime, layer_setup
        self.load_model_utils, self.spec_aux = load_model_utils, spec_aux_hidden_state
        self.rc, self.resolving_view = runtime_context, resolving_view
        self.post_capture_kv_sizing_planned = post_capture_kv_sizing_planned
        self.SpeculativeAlgorithm = SpeculativeAlgorithm
        self._last_configurator = None
        self._last_available = None
        self._spy_sglang()

    def _spy_sglang(self):
        """Keep the configurator SGLang builds and the byte budget it profiles (behaviour unchanged)."""
        sizer = self
        real_create = self.pool_configurator.create_memory_pool_configurator
        real_profile = self.kvc_module.KVCacheConfigurator._profile_available_bytes

        @_transparent
        def create(kvc):
            sizer._last_configurator = real_create(kvc)
            return sizer._last_configurator

        @_transparent
        def profile(kvc, pre_model_load_memory):
            sizer._last_available = real_profile(kvc, pre_model_load_memory)
            return sizer._last_available

        # kv_cache_configurator imports it inside the functions that use it: the module attribute is what runs.
        self.pool_configurator.create_memory_pool_configurator = create
        self.kvc_module.KVCacheConfigurator._profile_available_bytes = profile

    # -- one command ---------------------------------------------------------

    def size(self, server_args, memory: dict) -> dict:
        cfg = self.resolving_view(server_args)
        request = MemoryRequest.parse(memory, int(cfg.pp_size))
        if max(request.weights) > request.free_before:  # loading them fails first, as the faked device would
            raise DeviceOutOfMemory(
                f"CUDA out of memory (simulated device): weights of "
                f"{max(request.weights) / 2**30:.2f} GiB with {request.free_before / 2**30:.2f} "
                "GiB free before load",
                stage="load",
            )
        world = FakeWorld(request)
        self._window_unchecked = None
        torch_dist = self.torch.distributed
        real_all_reduce = torch_dist.all_reduce
        GPU["world"], torch_dist.all_reduce = world, _fake_all_reduce
        try:
            model_config = None
            runs = []
            for stage in range(len(request.weights)):
                run, model_config = self._size_stage(server_args, stage, world, model_config)
                runs.append(run)
            if len(runs) > 1:  # every stage's capacity is known now: the MIN all-reduce can answer for all
                world.tokens_complete = True
                runs = [self._size_stage(server_args, s, world, model_config)[0] for s in range(len(runs))]
        finally:
            GPU["world"], torch_dist.all_reduce = None, real_all_reduce
        self._allocate(runs, world)
        return self.answer(server_args, runs, world)

    @staticmethod
    def _allocate(runs: list, world: FakeWorld) -> None:
        """What the scheduler does next: allocate the pool it sized (mem_cache/memory_pool.py, torch.zeros per
        layer). SGLang's sizing trusts --mem-fraction-static, so a fraction above what is free after load sizes a
        pool the device cannot hold; the faked device refuses it as a real one would (CUDA out of memory)."""
        for run in runs:
            cell = getattr(run.configurator, "_cell_size", None)
            if cell is None:
                continue
            need, free = run.config.max_total_num_tokens * cell, world.free(run.stage)
            if need > free:
                raise DeviceOutOfMemory(
                    f"CUDA out of memory (simulated device): a KV pool of {need / 2**30:.2f} GiB "
                    f"with {free / 2**30:.2f} GiB free after the weights of stage {run.stage}"
                )

    def _size_stage(self, server_args, stage: int, world: FakeWorld, model_config):
        rc = self.rc
        cfg = self.resolving_view(server_args)
        world_rank = rc.spawn_world_rank(server_args, tp_rank=0, pp_rank=stage)
        ranks = rc.SpawnRanks(world_rank=world_rank, dp_rank=0 if cfg.dp_size > 1 else None, gpu_id=0)
        with rc.use_context(rc.create_context(server_args, role="scheduler", ranks=ranks)):
            parallel = rc.get_parallel()
            # Group handles the process would get from init_distributed_environment.
            parallel.override_permanently(
                world_group=StandInGroup(parallel.launch_world_size, world_rank),
                pp_group=StandInGroup(parallel.pp_size, stage),
            )
            if model_config is None:  # TpModelWorker._init_model_config, for the target
                model_config = self.ModelConfig.from_server_args(
                    server_args,
                    model_path=rc.get_model().model_path,
                    model_revision=rc.get_model().revision,
                    is_draft_model=False,
                    context_length=None,
                )
            device = rc.get_device().device
            world.stage, world.loaded = stage, False
            pre = self.bootstrap.measure_pre_model_load_memory(device=device, is_draft_worker=False)
            world.loaded = True  # ModelRunner.load_model: the weights are now resident
            self.load_model_utils.maybe_downgrade_dtype_for_legacy_gpu(model_config=model_config)
            run = StageRun(stage=stage, layers=(), pre_model_load_gib=pre)
            kvc = self._configurator(server_args, model_config, stage, run)
            self._last_configurator = self._last_available = None
            run.config = kvc._resolve_memory_pool_config(pre)
            run.configurator, run.available_bytes = self._last_configurator, self._last_available
            run.logical_tokens = kvc.logical_token_capacity(max_total_num_tokens=run.config.max_total_num_tokens)
        return run, model_config

    def _configurator(self, server_args, model_config, stage: int, run: StageRun):
        """ModelRunner.init_kv_cache_configurator's KVCacheConfigurator, each field from where ModelRunner takes it."""
        rc = self.rc
        parallel = rc.get_parallel()
        spec = self.SpeculativeAlgorithm.from_string(rc.get_spec().speculative_algorithm)
        model = self._stand_in_model(model_config, stage, run)
        run.layers = (model.start_layer, model.end_layer)
        kv_str, kv_dtype = self.kv_cache_dtype.configure_kv_cache_dtype(  # ModelRunner.configure_kv_cache_dtype
            server_args_kv_cache_dtype=rc.get_model().kv_cache_dtype,
            model=model,
            model_dtype=model_config.dtype,
            is_draft_worker=False,
            is_dflash=spec.is_dflash_family(),
            speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=rc.get_spec().speculative_draft_kv_cache_dtype,
        )
        layer_info = self.layer_setup.resolve_layer_indices(
            model=model, model_config=model_config, is_draft_worker=False
        )
        spec_aux = self.spec_aux.resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=model_config, spec_algorithm=spec, is_draft_worker=False
        )
        sliding_window = self.load_model_utils.resolve_sliding_window_size(model, model_config)
        run.notes["sliding_window_size"] = sliding_window
        run.notes["kv_cache_dtype"] = str(kv_dtype).replace("torch.", "")
        return self.kvc_module.KVCacheConfigurator(
            device=rc.get_device().device,
            gpu_id=0,
            attn_dp_size=parallel.attn_dp_size,
            pp_size=parallel.pp_group.world_size,
            pp_group=parallel.pp_group,
            model=model,
            model_config=model_config,
            server_args=server_args,
            kv_cache_dtype=kv_dtype,
            kv_cache_dtype_str=kv_str if kv_str is not None else rc.get_model().kv_cache_dtype,
            model_dtype=model_config.dtype,
            page_size=rc.get_schedule().page_size,
            sliding_window_size=sliding_window,
            spec_algorithm=spec,
            is_draft_worker=False,
            post_capture_kv_active=self.kv_pool_runtime.is_post_capture_kv_active(
                server_args=server_args, is_draft_worker=False, spec_algorithm=spec, token_to_kv_pool_allocator=None
            ),
            spec_aux_config=spec_aux,
            draft_parallel_layout=None,
            is_hybrid_swa=model_config.is_hybrid_swa,
            is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
            use_mla_backend=model_config.attention_arch == self.AttentionArch.MLA,
            layer_info=layer_info,
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=None,
            draft_model_idx=None,
        )

    def _stand_in_model(self, model_config, stage: int, run: StageRun) -> StandIn:
        """The loaded model, as far as KV sizing reads it: its layer range (the models' make_layers calls
        get_pp_indices(num_hidden_layers, pp_rank, pp_size)), its quant_config (built by SGLang's
        get_quant_config from the checkpoint config: it decides an "auto" KV dtype), and its sliding window."""
        start, end = self.get_pp_indices(model_config.num_hidden_layers, stage, self.rc.get_parallel().pp_size)
        model = StandIn(start_layer=start, end_layer=end, quant_config=None)
        if model_config.quantization is not None:
            from sglang.srt.configs.load_config import LoadConfig
            from sglang.srt.model_loader.weight_utils import get_quant_config

            # packed_modules_mapping is the model class's; it names fused layers, not the KV cache.
            model.quant_config = get_quant_config(model_config, LoadConfig(), {})
        window = self._model_sliding_window(model_config)
        if window is not None:
            model.get_attention_sliding_window_size = lambda: window
        return model

    def _model_sliding_window(self, model_config):
        """What SGLang's model class answers to get_attention_sliding_window_size (resolve_sliding_window_size
        asks the loaded model first), called on a stand-in holding the hf_config; None where the class has no
        such method, or does not import on this box (then noted in unchecked)."""
        if not (model_config.is_hybrid_swa or model_config.attention_chunk_size is not None):
            return None
        # Not get_model_architecture: it records the architecture it falls back to on the model_config.
        with self.capture.paused():  # importing every model module logs each one this box cannot import
            from sglang.srt.models.registry import ModelRegistry

            ModelRegistry.get_supported_archs()
            arch = model_config.hf_config.architectures[0]
            cls = ModelRegistry._try_load_model_cls(arch)
        if cls is None:
            self._window_unchecked = f"{arch} is not importable here"
            return None
        method = getattr(cls, "get_attention_sliding_window_size", None)
        return method(StandIn(config=model_config.hf_config)) if method else None

    # -- the answer ------------------------------------------------------------

    def answer(self, server_args, runs: list, world: FakeWorld) -> dict:
        """tokens_per_rank: the pool each attention-DP rank allocates (max_total_num_tokens; per-rank rows under
        DCP); logical_tokens_per_rank: what the scheduler counts (KVCacheConfigurator.logical_token_capacity);
        cell_bytes_per_token: the configurator's bytes per pool token, for the stage with the most (for hybrid
        SWA it folds in swa_full_tokens_ratio × the SWA layers); stages: each stage's layers, cell, and the
        capacity it brought to the ranks' MIN (PP)."""
        last = runs[-1]
        cfg = last.config
        stages = []
        for run in runs:
            cell = getattr(run.configurator, "_cell_size", None)
            stages.append(
                {
                    "stage": run.stage,
                    "layers": list(run.layers),
                    "cell_bytes_per_token": cell,
                    "tokens_before_min": world.tokens.get(run.stage),
                    "available_bytes": run.available_bytes,
                    "pre_model_load_gib": run.pre_model_load_gib,
                }
            )
        cells = [s["cell_bytes_per_token"] for s in stages if s["cell_bytes_per_token"] is not None]
        out = {
            "tokens_per_rank": cfg.max_total_num_tokens,
            "logical_tokens_per_rank": last.logical_tokens,
            "cell_bytes_per_token": max(cells) if cells else None,
            "max_running_requests": cfg.max_running_requests,
            "configurator": type(last.configurator).__name__,
            "kv_cache_dtype": last.notes.get("kv_cache_dtype"),
            "unchecked": self._unchecked(server_args),
            "stages": stages,
        }
        if cfg.full_max_total_num_tokens is not None:
            out["full_tokens_per_rank"] = cfg.full_max_total_num_tokens
            out["swa_tokens_per_rank"] = cfg.swa_max_total_num_tokens
            out["sliding_window_size"] = last.notes.get("sliding_window_size")
        if len({r.config.max_total_num_tokens for r in runs}) > 1:  # SGLang's MIN makes them equal; say if not
            out["tokens_by_stage"] = [r.config.max_total_num_tokens for r in runs]
        return out

    def _unchecked(self, server_args) -> list:
        """Terms the oracle supplied instead of SGLang's code computing them."""
        out = [
            "free_before_load_bytes: supplied (what get_available_gpu_memory would read before the weights load)",
            "weights_bytes: supplied per stage (the weights are not loaded; free memory drops by them after load)",
            "min_over_ranks: the MIN all-reduces of free memory (as float32) and of each stage's tokens are the "
            "oracle's, over the figures it was given",
            "allocation: whether the device holds the pool SGLang sized is the oracle's check (by: device)",
            "layer_range: the model is not built; each stage's layers are SGLang's get_pp_indices("
            "num_hidden_layers, pp_rank, pp_size), as the models' make_layers call it",
        ]
        if self._window_unchecked:
            out.append(
                f"sliding_window_size: {self._window_unchecked}, so resolve_sliding_window_size took its "
                "fallback (model_config.sliding_window_size) instead of the model's own answer"
            )
        if self.post_capture_kv_sizing_planned(server_args):
            out.append(
                "post_capture_resize: SGLang resizes this pool after CUDA-graph capture "
                "(kv_pool_runtime.compute_post_capture_kv_resize), which the oracle does not run"
            )
        if getattr(self.resolving_view(server_args), "weight_cache_mode", "off") != "off":
            out.append("preloaded_weights_bytes: a weight-cache daemon's preloaded bytes are taken as 0")
        if PROBES["unanswered"]:
            out.append(f"probes: {sorted(set(PROBES['unanswered']))} went unanswered by the fakes")
        return out


# ----------------------------------------------------------------------------
# Worker side: one command
# ----------------------------------------------------------------------------


class Worker:
    def __init__(self, gpu: dict, all_fields: bool, verbose: bool):
        self.gpu_defaulted = fake_gpu(gpu)
        install_import_stubs()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import logging

        from sglang.srt.arg_groups import memory_hook
        from sglang.srt.server_args import prepare_server_args

        self.logging = logging
        self.prepare_server_args = prepare_server_args
        self.all_fields = all_fields
        self.verbose = verbose
        self.engine_dirs = _engine_dirs()
        self.capture = Capture()
        self.trace: dict = {}
        self._spy(memory_hook, "get_device_memory_capacity", "gpu_mem_mib")
        self._spy(memory_hook, "reserve_for_graph_mb", "reserve_for_graph_mb")
        self._spy(memory_hook, "reserve_for_deepep_a2a_mb", "reserve_for_deepep_a2a_mb")
        self._spy(
            memory_hook,
            "adjust_mem_fraction_for_vlm",
            "vlm_adjusted_mem_fraction",
            arg0="mem_fraction_before_vlm_adjust",
        )
        self.kv_sizer = KvPoolSizer(self.capture)
        self._caches: list = []
        self._seen_modules = 0
        self._warm_up()
        # KVCacheConfigurator._profile_available_bytes runs gc.collect() (to free weight-loading temporaries
        # before measuring); over every SGLang module's objects that takes 0.3 s a command. Freezing what the
        # warm-up left alive leaves it the command's own garbage; the faked memory does not depend on either.
        import gc

        gc.freeze()

    def _warm_up(self) -> None:
        """Resolve one tiny model so import-time log noise is not charged to a command."""
        import tempfile

        total = GPU["total"]
        memory = {"capacity_bytes": total, "free_before_load_bytes": total, "weights_bytes": [1 << 20]}
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(WARMUP_CONFIG, f)
            self.resolve(["--model-path", tmp], None, memory)

    def _spy(self, module, name, key, arg0=None):
        """Record what a memory_hook helper returned; behaviour is unchanged."""
        real = getattr(module, name)
        trace = self

        @_transparent
        def wrapper(*a, **kw):
            out = real(*a, **kw)
            trace.trace[key] = out
            if arg0 and a:
                trace.trace[arg0] = a[0]
            return out

        setattr(module, name, wrapper)

    def clear_caches(self) -> None:
        """cache_clear() every functools cache defined at module level in sglang."""
        if len(sys.modules) != self._seen_modules:
            self._seen_modules = len(sys.modules)
            found = {}
            for name, mod in list(sys.modules.items()):
                if not name.startswith("sglang") or mod is None:
                    continue
                for obj in list(vars(mod).values()):
                    # type(obj): a plain getattr would trigger sglang's lazy imports.
                    if hasattr(type(obj), "cache_clear"):
                        origin = getattr(obj, "__module__", None) or ""
                        if not origin.startswith(("transformers", "torch")):
                            found[id(obj)] = obj
            self._caches = list(found.values())
        for fn in self._caches:
            fn.cache_clear()

    def resolve(self, argv: list, env: dict | None, memory: dict | None = None) -> dict:
        env_before = dict(os.environ)
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        self.clear_caches()
        self.capture.records.clear()
        self.trace = {}
        PROBES["unanswered"].clear()
        PROBES["topology"].clear()
        result = {
            "ok": False,
            "refusal": None,
            "crash": None,
            "error": None,
            "resolved": None,
            "kv_pool": None,
            "reset": [],
        }
        stages = Stages()
        argparse_err = io.StringIO()
        import warnings

        pywarn: list = []
        try:
            with warnings.catch_warnings(record=True) as pywarn:
                warnings.simplefilter("always")
                self._run_stages(argv, memory, stages, argparse_err, result)
            stages.now = None  # from here on, only the oracle's own bookkeeping runs
            result["ok"] = True
        except SystemExit as exc:  # argparse rejected the command line
            lines = argparse_err.getvalue().strip().splitlines()
            self._fail(result, exc, stages, message=lines[-1] if lines else str(exc.code))
        except Exception as exc:
            self._fail(result, exc, stages)
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        warn, info = self.capture.split()
        warn += [
            f"{w.category.__name__}: {ANSI.sub('', str(w.message))}"
            for w in pywarn
            if "/sglang/" in str(w.filename) and not issubclass(w.category, NOISE)
        ]
        self._trace_probes()
        result.update(warnings=warn, notes=info, trace=self.trace)
        return result

    def _run_stages(self, argv, memory, stages: Stages, argparse_err, result):
        stages.now = "parse"
        try:
            with contextlib.redirect_stderr(argparse_err):
                server_args = self.prepare_server_args(list(argv))
        finally:
            if not self.verbose:  # prepare_server_args re-runs basicConfig
                self.logging.getLogger().handlers[:] = [self.logging.NullHandler()]
        stages.now = "resolve"
        server_args.resolve_once()
        stages.now = "check"
        server_args.check_server_args()
        stages.now = "publish"
        self.publish(server_args)
        stages.now = None  # the oracle's own bookkeeping: what the arguments resolved to, kept past a KV refusal
        resolved = server_args.resolved_dict()
        result["resolved"] = self._select(resolved)
        result["reset"] = _explicit_flags_changed(server_args, resolved)
        if memory is not None:
            stages.now = "kv_pool"
            result["kv_pool"] = self.kv_sizer.size(server_args, memory)
        return server_args

    def publish(self, server_args) -> None:
        """What the launcher does next (entrypoints/engine.py _launch_subprocesses: check_server_args, then
        publish(server_args, role="tokenizer")): project the config and validate the parallel topology
        (runtime_context._configure_context). create_context runs the same code into a context of its own,
        so the process's stays untouched. resolve_auto_parsers, between the two, only picks parsers."""
        from sglang.srt.runtime_context import create_context

        create_context(server_args, role="tokenizer")

    def _fail(self, result: dict, exc: BaseException, stages: Stages, message: str | None = None) -> None:
        """Record `exc` as the engine's refusal at the stage it was in, or as a crash (crash_of)."""
        if self.verbose:
            traceback.print_exc()
        result.update(ok=False, kv_pool=None)
        if stages.now != "kv_pool":  # the arguments did not resolve (a refused pool keeps what they resolved to)
            result.update(resolved=None, reset=[])
        if isinstance(exc, DeviceOutOfMemory):  # allocating what SGLang sized: refused by the faked device
            result["refusal"] = {
                "stage": exc.stage or stages.now,
                "type": "OutOfMemoryError",
                "message": str(exc),
                "by": "device",
            }
            result["error"] = f"OutOfMemoryError: {exc}"
            return
        if stages.now is None:  # every stage had passed: the oracle's own reporting failed
            crash = {"type": type(exc).__name__, "message": _text(exc), "where": "oracle: reporting"}
        else:
            crash = crash_of(exc, self.engine_dirs)
        if crash:
            result["crash"] = crash
            result["error"] = f"{crash['type']}: {crash['message']}"
            return
        stage = _parse_stage(exc) if stages.now == "parse" and not isinstance(exc, SystemExit) else stages.now
        text = message if message is not None else _text(exc)
        result["refusal"] = {"stage": stage, "type": type(exc).__name__, "message": text}
        result["error"] = f"{type(exc).__name__}: {text}"

    def _trace_probes(self) -> None:
        if self.gpu_defaulted:
            self.trace["gpu_defaults"] = self.gpu_defaulted
        if PROBES["unanswered"]:
            self.trace["unanswered_probes"] = sorted(set(PROBES["unanswered"]))
        if PROBES["topology"]:
            self.trace["topology_probes"] = sorted(set(PROBES["topology"]))

    def _select(self, resolved: dict) -> dict:
        if self.all_fields:
            return _jsonable(resolved)
        out = {k: resolved.get(k) for k in KEY_FIELDS if k in resolved}
        out.update({k: v for k, v in resolved.items() if k.startswith("speculative_")})
        graphs = resolved.get("cuda_graph_config") or {}
        for phase in ("decode", "prefill"):
            g = graphs.get(phase) or {}
            out[f"cuda_graph_{phase}"] = {"backend": g.get("backend"), "max_bs": g.get("max_bs")}
        decode = graphs.get("decode") or {}
        # The launcher-level meaning of --cuda-graph-max-bs: the decode graph cap.
        out["cuda_graph_max_bs"] = decode.get("max_bs")
        return _jsonable(out)


_DEFAULTS_CACHE: dict = {}


def _defaults() -> dict:
    """ServerArgs field defaults (what argparse gives a flag that was not passed)."""
    if not _DEFAULTS_CACHE:
        import msgspec
        from sglang.srt.server_args import ServerArgs

        for fld in msgspec.structs.fields(ServerArgs):
            if fld.default is not msgspec.NODEFAULT:
                _DEFAULTS_CACHE[fld.name] = fld.default
    return _DEFAULTS_CACHE


def _explicit_flags_changed(server_args, resolved: dict) -> list:
    """Scalar fields the command set away from their default that resolution changed.

    Uses SGLang's own bookkeeping: `_raw_input` (the record before resolution)
    and `_resolved_overrides` ((source, {field: value}) in order).
    """
    raw = getattr(server_args, "_raw_input", {})
    sources: dict = {}
    for source, fields in getattr(server_args, "_resolved_overrides", []):
        for name in fields:
            sources[name] = source
    scalar = (bool, int, float, str, type(None))
    out = []
    for name, given in raw.items():
        now = resolved.get(name)
        if not (isinstance(given, scalar) and isinstance(now, scalar)) or given == now:
            continue
        if name in _defaults() and given == _defaults()[name]:
            continue
        out.append({"field": name, "given": given, "resolved": now, "by": sources.get(name)})
    return out


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def worker_main(gpu_json: str, all_fields: bool, verbose: bool) -> None:
    # Keep the protocol on a private fd; anything printed by sglang goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    try:
        worker = Worker(json.loads(gpu_json), all_fields, verbose)
    except BaseException as exc:  # faking the GPU or importing SGLang failed: every command of this GPU crashes
        frame, line = list(traceback.walk_tb(exc.__traceback__))[-1]
        where = f"worker start: {frame.f_code.co_qualname} ({os.path.basename(frame.f_code.co_filename)}:{line})"
        proto.write(
            json.dumps({"ready": False, "type": type(exc).__name__, "message": _text(exc), "where": where}) + "\n"
        )
        raise
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        res = worker.resolve(req["argv"], req.get("env"), req.get("memory"))
        res["ms"] = round((time.perf_counter() - t0) * 1000, 1)
        proto.write(json.dumps(res, default=str) + "\n")


# ----------------------------------------------------------------------------
# Router side
# ----------------------------------------------------------------------------


def _crashed(type_: str, message: str, where: str) -> dict:
    """The answer when no engine answer came back: the worker or the router failed."""
    return {
        "ok": False,
        "refusal": None,
        "crash": {"type": type_, "message": message, "where": where},
        "error": f"{type_}: {message}",
        "resolved": None,
        "kv_pool": None,
        "reset": [],
        "warnings": [],
        "notes": [],
        "trace": {},
    }


class WorkerFailedToStart(Exception):
    def __init__(self, crash: dict):
        super().__init__(crash["message"])
        self.crash = crash


class WorkerProc:
    def __init__(self, gpu: dict, opts):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(gpu)]
        if opts.all_fields:
            cmd.append("--all-fields")
        if opts.verbose:
            cmd.append("--verbose")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if opts.verbose else subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        hello = self._read(opts.startup_timeout)
        if not hello.get("ready"):
            self.close()
            crash = hello.get("crash") or {k: hello.get(k) for k in ("type", "message", "where")}
            raise WorkerFailedToStart(crash)

    def _read(self, timeout: float):
        """The worker's next answer, or a WorkerDied crash."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        if ready:  # end of output: the worker exited (give it a moment to be reaped)
            try:
                why = f"exit code {self.proc.wait(timeout=10)}"
            except subprocess.TimeoutExpired:
                why = "closed its output without exiting"
        else:
            why = f"no answer within {timeout}s"
        return _crashed("WorkerDied", why, "worker")

    def ask(self, req: dict, timeout: float):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def router_main(opts) -> None:
    workers: dict = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        t0 = time.perf_counter()
        req: dict = {}
        try:
            req = json.loads(line)
            key = json.dumps(req["gpu"], sort_keys=True)
            if key not in workers:
                if len(workers) >= opts.max_workers:
                    workers.pop(next(iter(workers))).close()
                workers[key] = WorkerProc(req["gpu"], opts)
            else:
                workers[key] = workers.pop(key)  # most recently used last
            res = workers[key].ask(
                {"argv": req["argv"], "env": req.get("env"), "memory": req.get("memory")}, opts.timeout
            )
            if (res.get("crash") or {}).get("type") == "WorkerDied":
                workers.pop(key).close()
        except WorkerFailedToStart as exc:
            res = _crashed(exc.crash["type"], exc.crash["message"], exc.crash["where"])
        except Exception as exc:
            res = _crashed(type(exc).__name__, str(exc), "router")
        res.setdefault("ms", round((time.perf_counter() - t0) * 1000, 1))
        out = {"id": req.get("id"), **res}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    for w in workers.values():
        w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", metavar="GPU_JSON", help=argparse.SUPPRESS)
    ap.add_argument("--all-fields", action="store_true", help="report every ServerArgs field")
    ap.add_argument("--verbose", action="store_true", help="show SGLang logs and tracebacks on stderr")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per command")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--max-workers", type=int, default=4, help="live GPU-specific workers")
    opts = ap.parse_args()
    if opts.worker:
        worker_main(opts.worker, opts.all_fields, opts.verbose)
    else:
        router_main(opts)


if __name__ == "__main__":
    main()
