#!/usr/bin/env python
"""Resolve `vllm serve` launch commands with the real vLLM package, on a CPU box.

Run with a venv made by setup-vllm.sh:
    .engines/vllm-0.34.0/bin/python conformance/vllm_oracle.py < cmds.jsonl > out.jsonl

Input, one JSON object per line:
    {"argv": ["/path/to/model_dir", "-tp", "8", ...],
     "gpu": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 8,
             "capability": [9, 0], "sm_count": 132, "nvlink": true, "p2p": true},
     "memory": {"capacity_bytes": ..., "weights_bytes": [per pipeline stage],
                "non_torch_bytes": ..., "activation_peak_bytes": ...,
                "cuda_graph_bytes": ...,       # per GPU, bytes: what profiling measures
                "baseline_bytes": ..., "vmm_granularity_bytes": ...},  # optional
                                               # (the whole object is optional: the KV pool)
     "build": bool,                            # optional, without "memory": build the model, size no pool
     "env": {"VLLM_...": "..."}, "tag": ...}   # optional
Output, one JSON line per input:
    {"ok": bool, "error": "Type: message" | null,
     "refusal": null | {"stage": "parse"|"config"|"load"|"kv_pool", "type", "message",
                        "by": "device" (the simulated GPU ran out of memory) or "oracle"
                        (a check vLLM makes in code the oracle cannot run, mirrored in its words)},
     "crash": null | {"type", "message", "where"},
     "built": bool (the model was built on every pipeline stage),
     "resolved": {...} | null,
     "kv_pool": null | {"num_blocks", "block_size", "tokens_per_rank" (num_blocks × block_size),
                        "logical_tokens_per_rank" (as the scheduler counts them, × DCP), "bytes_per_block",
                        "groups", "stages", "available_bytes", "max_model_len", ...,
                        "unchecked": [terms supplied instead of measured by vLLM]},
     "gpu_assumed": [gpu keys the request left out, filled from DEFAULT_GPU],
     "warnings": [...], "notes": [...], "fake_ops_called": [...], "seconds": float}
A refusal is vLLM's own code (or argparse / pydantic on vLLM's behalf) rejecting
the command; a crash is this oracle, one of its fakes, or this CPU install failing
(see classify() and VLLM_NOTES.md). ok is true only when neither happened; after a
refusal at load / kv_pool, kv_pool holds what the sizing rested on ("unchecked").

What is faked (nothing under site-packages is edited; all patches are in memory):
  * every compiled module inside vllm/ (*.so) is an empty module; torch.ops._C & co.
    expose only the cutlass capability queries model modules call at import time
    (listed per command in "fake_ops_called"); while a model is being built for the
    KV stage every other op is an inert stand-in that fails if called.
  * NVML answers with the requested GPU and topology (P2P over NVLink only where
    gpu.nvlink, P2P at all where gpu.p2p); CudaPlatform's name / capability / memory /
    device_count read the same GPU; its is_fully_connected is vLLM's own, over that
    NVML. torch.cuda.is_available/device_count/get_device_properties agree (so
    Triton sees an active driver and HAS_TRITON is True, as on a GPU host).
  * the model registry's `python -m` subprocess runs in-process.
  * KV stage only: the process groups (vLLM's GroupCoordinator with fixed ranks),
    the device's memory counters (torch.accelerator), the VMM driver, and the
    profiling measurements, which the request's "memory" supplies.
Each command runs in a forked child of a warm parent: module-level caches,
warn-once state and os.environ never leak from one command to the next.
"""

import contextlib
import enum
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "vllm-cache"))
if not os.environ.get("ORACLE_VERBOSE"):
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

# vLLM prints logs on stdout; keep our stdout for JSON only.
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

PER_COMMAND_TIMEOUT_S = float(os.environ.get("ORACLE_TIMEOUT_S", "120"))
THIS_FILE = os.path.abspath(__file__)
# What a request's gpu object may leave out; what was filled in is reported in
# "gpu_assumed", so an answer never silently rests on a topology nobody gave.
DEFAULT_GPU = {
    "name": "NVIDIA H100 80GB HBM3",
    "memory_mib": 81559,
    "count": 8,
    "capability": [9, 0],
    "sm_count": 132,
    "nvlink": True,
    "p2p": True,
}
GPU = dict(DEFAULT_GPU)  # the fake GPU the current command sees
GiB = 1 << 30

# --------------------------------------------------------- fake registry ----
# Every function that stands in for hardware, a driver or a compiled kernel is
# registered here. An exception raised while one of them is on the stack is the
# oracle's failure (a crash), never vLLM refusing the command.
_FAKE_CODE = set()
# Oracle functions that only pass through (log capture, argparse message capture);
# classify() looks past them as it looks past library frames.
_TRANSPARENT_CODE = set()


def _fake(fn):
    """Register fn (a function, or every method of a class) as a fake."""
    if isinstance(fn, type):
        for member in vars(fn).values():
            inner = getattr(member, "__func__", member)
            if hasattr(inner, "__code__"):
                _FAKE_CODE.add(inner.__code__)
            elif isinstance(member, property) and member.fget is not None:
                _FAKE_CODE.add(member.fget.__code__)
    else:
        _FAKE_CODE.add(fn.__code__)
    return fn


def _transparent(fn):
    _TRANSPARENT_CODE.add(fn.__code__)
    return fn


# ---------------------------------------------------------------- fakes ----
STUB_MODULES = {}  # name -> the empty module standing in for a compiled extension


def _stub_cuda_extensions():
    """Every compiled module shipped inside vllm/ becomes an empty module, as if
    it had loaded (they need libcuda.so.1 and the torch they were built for)."""
    import importlib.util

    root = os.path.dirname(importlib.util.find_spec("vllm").origin)
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".so"):
                rel = os.path.relpath(os.path.join(dirpath, f[: f.index(".")]), root)
                name = "vllm." + rel.replace(os.sep, ".")
                if name not in sys.modules:
                    STUB_MODULES[name] = sys.modules[name] = types.ModuleType(name)


_stub_cuda_extensions()


@_fake
class _NoCudaRuntime:
    """cuda-python's runtime bindings (`from cuda import cudart`), absent from this CPU install, which a layer imports
    for CUDA IPC work (MiniMax-M2's Lamport all-reduce workspace, model_executor/layers/minimax_rms_norm): every call
    raises, as the runtime does on a host without a driver, and the engine takes its own fallback where it has one
    (an uncaught one is a crash: this is a fake)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"cuda-python's cudart.{name} has no driver here")


def _stub_cuda_python():
    import importlib.util

    if importlib.util.find_spec("cuda") is None:
        module = types.ModuleType("cuda")
        module.cudart = _NoCudaRuntime()
        STUB_MODULES["cuda"] = sys.modules["cuda"] = module


_stub_cuda_python()


@_fake
def _deep_gemm_attribute(attr):
    if attr.startswith("_"):  # what the import system and inspect ask a module (__file__, __loader__, ...)
        raise AttributeError(attr)
    return _KernelStub("deep_gemm", attr)


def _stub_deep_gemm():
    """The DeepGEMM copy the wheel vendors (vllm/third_party/deep_gemm) loads its compiled kernels by path when
    imported, which fails here; on a GPU host it imports, and vLLM asks for it by importing it (utils/import_utils.py
    has_deep_gemm: DeepSeek-V3.2 / GLM-5's sparse-attention indexer refuses to build without it). It stands in as a
    module whose every kernel is a stub: a build that calls one is a crash."""
    import importlib.machinery

    name = "vllm.third_party.deep_gemm"
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    module.__getattr__ = _deep_gemm_attribute
    STUB_MODULES[name] = sys.modules[name] = module


FAKE_OPS_CALLED = []
BUILDING_MODEL = [False]  # set while the KV stage builds a model on the meta device


def _cap():
    return GPU["capability"][0] * 10 + GPU["capability"][1]


# Capability queries that vLLM's kernels answer (csrc/quantization/...); some
# model modules call them at import time.
_SUPPORTS = {
    "cutlass_scaled_mm_supports_fp8": _fake(lambda cap: cap >= 89),
    "cutlass_scaled_mm_supports_block_fp8": _fake(lambda cap: cap >= 90),
    "cutlass_scaled_mm_supports_fp4": _fake(lambda cap: cap >= 100),
    "cutlass_group_gemm_supported": _fake(lambda cap: cap in (90, 100, 103)),
}


@_fake
class _FakeOp:
    def __init__(self, ns, name):
        self.ns, self.name = ns, name
        self.default = self

    def __call__(self, *a, **k):
        FAKE_OPS_CALLED.append(f"{self.ns}.{self.name}")
        return _SUPPORTS[self.name](int(a[0]) if a else _cap())


@_fake
class _KernelStub:
    """A kernel a layer keeps a handle to while it is built (e.g. SiluAndMul keeps
    torch.ops._C.silu_and_mul); building runs none, so calling one is a crash."""

    def __init__(self, ns, name):
        self.ns, self.name = ns, name

    def __getattr__(self, overload):  # .default, .out, ...: the same stub
        if overload.startswith("__"):
            raise AttributeError(overload)
        return self

    def __call__(self, *a, **k):
        raise RuntimeError(f"kernel torch.ops.{self.ns}.{self.name} is a stub here")


_stub_deep_gemm()


@_fake
class _FakeOpNamespace:
    def __init__(self, ns):
        self._ns = ns

    def __getattr__(self, name):
        # Only the capability queries exist; kernels stay missing (hasattr False)
        # so vLLM skips their fake-tensor registrations, as in a CPU build. While a
        # model is built, layers may take handles to kernels they never call here.
        if name in _SUPPORTS:
            return _FakeOp(self._ns, name)
        if BUILDING_MODEL[0] and not name.startswith("__"):
            return _KernelStub(self._ns, name)
        raise AttributeError(f"fake torch.ops.{self._ns} has no op {name!r}")


def _fake_torch_ops():
    import torch

    for ns in (
        "_C",
        "_moe_C",
        "_C_cache_ops",
        "_C_custom_ar",
        "_rocm_C",
        "_flashmla_C",
        "_flashmla_extension_C",
        "_vllm_fa2_C",
        "_vllm_fa3_C",
        "_deepselect_C",
        "_flashkda_C",
        "_C_utils",
    ):
        torch.ops.__dict__[ns] = _FakeOpNamespace(ns)


_fake_torch_ops()


def _p2p_status(nv, a, b, caps_index):
    """NVML's peer-to-peer status between two GPUs of the requested box. The
    NVLINK capability is OK only where they are joined by NVLink; the others
    (read, write, atomics, PCI) wherever peer-to-peer is on (PCIe P2P or NVLink).
    pynvml spells NVML_P2P_CAPS_INDEX_READ as the tuple (0,)."""
    if int(a) == int(b):
        return nv.NVML_P2P_STATUS_OK
    if caps_index == nv.NVML_P2P_CAPS_INDEX_NVLINK:
        ok = GPU["nvlink"]
    else:
        ok = GPU["p2p"] or GPU["nvlink"]
    return nv.NVML_P2P_STATUS_OK if ok else nv.NVML_P2P_STATUS_NOT_SUPPORTED


_fake(_p2p_status)


def _install_fake_nvml():
    from vllm.utils.import_utils import import_pynvml

    nv = import_pynvml()

    @_fake
    class _Mem:
        def __init__(self):
            self.total = GPU["memory_mib"] << 20
            self.free, self.used = self.total, 0

    fakes = {
        "nvmlInit": lambda *a, **k: None,
        "nvmlShutdown": lambda *a, **k: None,
        "nvmlDeviceGetCount": lambda: GPU["count"],
        "nvmlDeviceGetHandleByIndex": lambda i: int(i),
        "nvmlDeviceGetIndex": lambda h: int(h),
        "nvmlDeviceGetHandleByUUID": lambda u: int(str(u).rsplit("-", 1)[-1]),
        "nvmlDeviceGetUUID": lambda h: f"GPU-fake-{int(h)}",
        "nvmlDeviceGetName": lambda h: GPU["name"],
        "nvmlDeviceGetCudaComputeCapability": lambda h: tuple(GPU["capability"]),
        "nvmlDeviceGetMemoryInfo": lambda h, *a: _Mem(),
        "nvmlDeviceGetP2PStatus": lambda a, b, idx: _p2p_status(nv, a, b, idx),
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlSystemGetDriverVersion": lambda: "580.00",
    }
    for k, v in fakes.items():
        setattr(nv, k, _fake(v))


@_fake
class _DeviceProperties:
    """torch.cuda.get_device_properties of the requested GPU. Only what a GPU
    spec states; any other property is missing (a crash if vLLM reads it)."""

    def __init__(self):
        self.name = GPU["name"]
        self.major, self.minor = GPU["capability"]
        self.total_memory = GPU["memory_mib"] << 20
        self.multi_processor_count = GPU["sm_count"]
        self.is_integrated = False

    def __getattr__(self, name):
        raise AttributeError(f"fake device properties have no {name!r}")


def _install_fake_cuda_platform():
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    cls = cuda.CudaPlatform
    cm = classmethod
    cls.get_device_capability = cm(_fake(lambda c, device_id=0: DeviceCapability(*GPU["capability"])))
    cls.get_device_name = cm(_fake(lambda c, device_id=0: GPU["name"]))
    cls._get_physical_device_name = cm(_fake(lambda c, device_id=0: GPU["name"]))
    cls.get_device_total_memory = cm(_fake(lambda c, device_id=0: GPU["memory_mib"] << 20))
    cls.get_device_uuid = cm(_fake(lambda c, device_id=0: f"GPU-fake-{device_id}"))
    cls.device_count = cm(_fake(lambda c: GPU["count"]))
    # is_fully_connected stays vLLM's own: it asks the faked NVML for NVLink P2P.
    cuda._cuda_device_count_stateless = _fake(lambda *a, **k: GPU["count"])


def _fake_torch_cuda():
    """torch.cuda agrees with NVML. Must precede `import vllm`: Triton's CUDA
    driver counts as active iff torch.cuda.is_available(), and vLLM reads
    HAS_TRITON once at import (it gates e.g. Model Runner V2)."""
    import torch

    torch.cuda.is_available = _fake(lambda: True)
    torch.cuda.device_count = _fake(lambda: GPU["count"])
    torch.cuda.get_device_capability = _fake(lambda d=None: tuple(GPU["capability"]))
    torch.cuda.get_device_name = _fake(lambda d=None: GPU["name"])
    torch.cuda.get_device_properties = _fake(lambda d=None: _DeviceProperties())


def _load_vllm():
    _fake_torch_cuda()
    _install_fake_nvml()
    import vllm.platforms

    plat = vllm.platforms.current_platform
    assert type(plat).__name__.endswith("CudaPlatform"), type(plat)
    _install_fake_cuda_platform()
    from vllm.triton_utils import HAS_TRITON

    assert HAS_TRITON, "triton must be installed and see a (fake) CUDA driver"
    # The model registry imports model classes in a fresh `python -m` process,
    # which would not see the fakes; each command already runs in a throwaway
    # fork, so import them in-process instead (results are cached on disk under
    # VLLM_CACHE_ROOT/modelinfos exactly as vLLM does).
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()
    import vllm
    import vllm.entrypoints.cli.serve as serve
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return vllm, serve, make_arg_parser, FlexibleArgumentParser


VLLM, SERVE, make_arg_parser, FlexibleArgumentParser = _load_vllm()

# ---------------------------------------------------------- log capture ----
NOTE_RE = re.compile(
    r"reset|ignor|overrid|disabl|fall(ing)? ?back|forc|"
    r"not supported|unsupported|defaulting|capping|instead",
    re.I,
)
CAPTURED = {"warnings": [], "notes": []}
_orig_handle = logging.Logger.handle


@_transparent
def _capturing_handle(self, record):
    if record.name.startswith("vllm"):
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            msg = str(record.msg)
        if record.levelno >= logging.WARNING:
            CAPTURED["warnings"].append(msg)
        elif record.levelno >= logging.INFO and NOTE_RE.search(msg):
            CAPTURED["notes"].append(msg)
    return _orig_handle(self, record)


_ARGPARSE_MSG = []
_orig_error = __import__("argparse").ArgumentParser.error


@_transparent
def _argparse_error(self, message):
    _ARGPARSE_MSG.append(f"{self.prog}: error: {message}")  # the line argparse prints
    return _orig_error(self, message)


__import__("argparse").ArgumentParser.error = _argparse_error

# ------------------------------------------------------- classification ----
# Which of vLLM's start-up stages the command is in; an exception vLLM raises is
# a refusal at that stage.
#   parse:   argparse / FlexibleArgumentParser / ServeSubcommand.validate and the
#            launch-mode checks of ServeSubcommand.cmd (entrypoints/cli/serve.py)
#   config:  AsyncEngineArgs.from_cli_args → create_engine_config, with every
#            config class's __post_init__ / pydantic validation
#   load:    the workers building the model's layers (model_loader initialize_model),
#            run only for the KV stage; nothing is loaded
#   kv_pool: the workers' memory profiling and the engine core's KV-cache sizing
STAGE = ["parse"]
BUILT = [False]  # the model was built on every pipeline stage (the load stage ran whole)
SITE_VLLM = os.sep + "vllm" + os.sep
_HOST_PATHS = (
    os.sep + "torch" + os.sep + "cuda" + os.sep,
    os.sep + "vllm" + os.sep + "third_party" + os.sep + "pynvml.py",
)
# Failures of this host's missing GPU / driver, wherever vLLM trips on them.
_HOST_MESSAGE = re.compile(
    r"not compiled with CUDA|Cannot access accelerator device|requires CUDA support|"
    r"libcuda\.so|no CUDA GPUs are available|NVML Shared Library Not Found|"
    r"Found no NVIDIA driver",
    re.I,
)


def _frames(tb):
    out = []
    while tb is not None:
        out.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    return out  # outermost first


def _where(code):
    return f"{os.path.basename(code.co_filename)}:{code.co_qualname}:{code.co_firstlineno}"


def _fake_in_message(exc):
    """A TypeError from calling a fake with the wrong arguments is raised in the
    caller's frame (the fake's own frame never starts); its message names it."""
    if not isinstance(exc, TypeError):
        return None
    msg = str(exc)
    # Python names the callee by its qualified name at the start of the message; a
    # bare "<lambda>" (a module-level lambda) would match any lambda, so not those.
    return next((c for c in _FAKE_CODE if c.co_qualname != "<lambda>" and msg.startswith(f"{c.co_qualname}()")), None)


_STANDINS = []  # objects the oracle made without their __init__ (cls.__new__) or as a namespace, this command


def _standin(obj):
    """Register an object the oracle assembles by hand in place of one vLLM would build: an attribute vLLM reads
    and the oracle did not set is a gap in the stand-in, so a crash (each command runs in its own fork)."""
    _STANDINS.append(obj)
    return obj


def _crash_cause(exc):
    """Why one exception (not its chain) is the oracle's failure, or None."""
    if isinstance(exc, ImportError):  # incl. ModuleNotFoundError
        return f"missing module in this CPU install: {exc.name or exc}"
    if isinstance(exc, AttributeError):
        obj = getattr(exc, "obj", None)
        if obj is not None and (obj in STUB_MODULES.values() or type(obj).__module__ == __name__):
            return f"stub: {getattr(obj, '__name__', type(obj).__name__)} lacks {exc.name!r}"
        if obj is not None and any(obj is s for s in _STANDINS):
            return f"stand-in: {type(obj).__name__} made by the oracle lacks {exc.name!r}"
    frames = _frames(exc.__traceback__)
    fake = next((c for c in reversed(frames) if c in _FAKE_CODE), None) or _fake_in_message(exc)
    if fake is not None:
        return f"fake: {_where(fake)}"
    if type(exc).__name__.startswith("NVMLError") or _HOST_MESSAGE.search(str(exc)):
        return "host: this machine has no GPU / driver"
    if frames and any(p in frames[-1].co_filename for p in _HOST_PATHS):
        return f"host: {_where(frames[-1])}"
    return None


def _chain(exc):
    """exc and every exception behind it: what it was raised from or while
    handling, and what pydantic wrapped (a ValueError / AssertionError raised in a
    config validator becomes a ValidationError that keeps only the exception
    object, in errors()[i]["ctx"]["error"], not the chain)."""
    seen, pending = [], [exc]
    while pending:
        e = pending.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        pending += [e.__cause__, e.__context__, *_wrapped_by_pydantic(e)]
    return seen


def _wrapped_by_pydantic(exc):
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return []
    try:
        found = [(e.get("ctx") or {}).get("error") for e in errors()]
    except Exception:  # noqa: BLE001
        return []
    return [e for e in found if isinstance(e, BaseException)]


def classify(exc):
    """("crash", where) or ("refusal", stage) for an exception that ended a command.

    A crash: an ImportError (a package this install lacks), an AttributeError on a
    stubbed module / fake op namespace / fake device properties, a registered fake
    on the stack, the host's missing GPU, any of these anywhere in the exception's
    cause/context chain (vLLM re-raising them counts too), or an exception raised
    by the oracle's own code (the innermost frame that is neither a library nor a
    pass-through is the oracle's). Anything else was raised by vLLM's code (or by
    a library vLLM called: argparse, pydantic, transformers) and is vLLM's refusal
    at the current stage."""
    links = _chain(exc)
    if any(isinstance(link, _DeviceOutOfMemory) for link in links):
        return "refusal", STAGE[0]  # the (simulated) device ran out, vLLM passed it on
    for link in links:
        cause = _crash_cause(link)
        if cause:
            return "crash", cause
    if isinstance(exc, _MirroredCheck):
        return "refusal", STAGE[0]
    for code in reversed(_frames(exc.__traceback__)):  # innermost first
        if code in _TRANSPARENT_CODE:
            continue
        if code.co_filename == THIS_FILE:
            return "crash", f"oracle: {_where(code)}"
        if SITE_VLLM in code.co_filename:
            return "refusal", STAGE[0]
    return "refusal", STAGE[0]  # raised inside a library called by vLLM


def _message(exc):
    """The exception's message on one line (argparse's printed error for an exit)."""
    text = (_ARGPARSE_MSG or [f"exit {exc.code}"])[-1] if isinstance(exc, SystemExit) else str(exc)
    return " ".join(x.strip() for x in text.strip().splitlines() if x.strip())[:2000]


def verdict(exc):
    """The answer's ok / error / refusal / crash for an exception."""
    kind, detail = classify(exc)
    typ, msg = type(exc).__name__, _message(exc)
    out = {"ok": False, "error": f"{typ}: {msg}"[:2000], "refusal": None, "crash": None}
    if kind == "crash":
        out["crash"] = {"type": typ, "message": msg, "where": detail}
    else:
        out["refusal"] = {"stage": detail, "type": typ, "message": msg}
        inner = _wrapped_by_pydantic(exc)
        if len(inner) == 1:  # what the config validator raised, before pydantic wrapped it
            out["refusal"]["cause"] = {"type": type(inner[0]).__name__, "message": _message(inner[0])}
        if any(isinstance(x, _DeviceOutOfMemory) for x in _chain(exc)):  # the figures refused
            out["refusal"].update(type="OutOfMemoryError", by="device")
            out["error"] = f"OutOfMemoryError: {msg}"[:2000]
        elif isinstance(exc, _MirroredCheck):  # vLLM's check in vLLM's words, run by the oracle
            out["refusal"]["by"] = "oracle"
    return out


# ------------------------------------------------------------ resolving ----
class _Resolved(Exception):
    def __init__(self, config, headless):
        self.config, self.headless = config, headless


class _MirroredCheck(ValueError):
    """A check vLLM makes in code the oracle cannot run (it starts processes),
    raised by the oracle in vLLM's words; classify() treats it as vLLM's."""


def _engine_config(args, headless):
    """What run_server / run_headless / run_multi_api_server do before spawning."""
    from vllm.entrypoints.common import cli_args
    from vllm.usage.usage_lib import UsageContext

    STAGE[0] = "config"
    engine_args = VLLM.AsyncEngineArgs.from_cli_args(args)
    if hasattr(cli_args, "propagate_flash_late_interaction"):
        cli_args.propagate_flash_late_interaction(args, engine_args)
    if not headless and (args.api_server_count or 1) > 1:
        engine_args._api_process_count = args.api_server_count
        engine_args._api_process_rank = -1
    kw = {"headless": True} if headless else {}
    cfg = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER, **kw)
    if headless and cfg.parallel_config.data_parallel_size_local <= 0:
        # entrypoints/cli/serve.py run_headless
        raise _MirroredCheck("data_parallel_size_local must be > 0 in headless mode")
    raise _Resolved(cfg, headless)


def resolve(argv):
    """(summary of the resolved VllmConfig, the VllmConfig) for one command."""
    STAGE[0] = "parse"
    # prog as the `vllm` entry point has it: the serve subparser is "vllm serve",
    # which FlexibleArgumentParser.error reads (its --task hint).
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    sub = parser.add_subparsers(required=False, dest="subparser")
    sp = make_arg_parser(sub.add_parser("serve", usage="vllm serve [model_tag] [options]"))
    sp.set_defaults(dispatch_function=SERVE.ServeSubcommand.cmd)
    args = parser.parse_args(["serve", *argv])
    SERVE.ServeSubcommand().validate(args)
    # Let the real ServeSubcommand.cmd pick the launch mode, then stop there.
    SERVE.run_headless = lambda a: _engine_config(a, True)
    SERVE.run_multi_api_server = lambda a: _engine_config(a, False)
    SERVE.run_dp_supervisor = lambda a: _engine_config(a, False)
    SERVE.run_server = lambda a, **kw: _coro(_engine_config, a, False)
    SERVE.uvloop.run = lambda c: c()
    try:
        args.dispatch_function(args)
    except _Resolved as r:
        return summarize(r.config, args, r.headless), r.config
    raise RuntimeError("serve returned without creating an engine config")


def _coro(fn, *a):
    return lambda: fn(*a)


def _get(obj, *names):
    for n in names:
        if obj is not None and hasattr(obj, n):
            v = getattr(obj, n)
            return v.name if isinstance(v, enum.Enum) else v
    return None


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return getattr(v, "name", None) or str(v)


def summarize(cfg, args, headless):
    p, c, m, s = cfg.parallel_config, cfg.cache_config, cfg.model_config, cfg.scheduler_config
    cc = cfg.compilation_config
    att = getattr(cfg, "attention_config", None)
    r = {
        "tensor_parallel_size": p.tensor_parallel_size,
        "pipeline_parallel_size": p.pipeline_parallel_size,
        "data_parallel_size": p.data_parallel_size,
        "data_parallel_size_local": p.data_parallel_size_local,
        "data_parallel_rank": p.data_parallel_rank,
        "data_parallel_master_ip": p.data_parallel_master_ip,
        "data_parallel_rpc_port": p.data_parallel_rpc_port,
        "data_parallel_backend": p.data_parallel_backend,
        "data_parallel_hybrid_lb": _get(p, "data_parallel_hybrid_lb"),
        "data_parallel_external_lb": _get(p, "data_parallel_external_lb"),
        "world_size": p.world_size,
        "world_size_across_dp": _get(p, "world_size_across_dp"),
        "nnodes": _get(p, "nnodes"),
        "node_rank": _get(p, "node_rank"),
        "master_addr": _get(p, "master_addr"),
        "enable_expert_parallel": p.enable_expert_parallel,
        "all2all_backend": _get(p, "all2all_backend"),
        "enable_dbo": _get(p, "enable_dbo"),
        "decode_context_parallel_size": _get(p, "decode_context_parallel_size"),
        "prefill_context_parallel_size": _get(p, "prefill_context_parallel_size"),
        "distributed_executor_backend": _plain(p.distributed_executor_backend),
        "disable_custom_all_reduce": _get(p, "disable_custom_all_reduce"),
        "headless": headless,
        "api_server_count": getattr(args, "api_server_count", None),
        "gpu_memory_utilization": c.gpu_memory_utilization,
        "resolved_gpu_memory_utilization": _get(c, "resolved_gpu_memory_utilization"),
        "enable_extensible_kv_cache": _get(c, "enable_extensible_kv_cache"),
        "kv_cache_memory_bytes": _get(c, "kv_cache_memory_bytes"),
        "kv_cache_dtype": c.cache_dtype,
        "block_size": c.block_size,
        "enable_prefix_caching": c.enable_prefix_caching,
        "dtype": str(m.dtype).replace("torch.", ""),
        "quantization": m.quantization,
        "max_model_len": m.max_model_len,
        "original_max_model_len": _get(m, "original_max_model_len"),  # -1: auto-fit later
        "enforce_eager": m.enforce_eager,
        "use_v2_model_runner": _get(cfg, "use_v2_model_runner"),
        "use_mla": _get(m, "use_mla"),
        "is_multimodal": _get(m, "is_multimodal_model"),
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_num_seqs": s.max_num_seqs,
        "enable_chunked_prefill": _get(s, "enable_chunked_prefill", "chunked_prefill_enabled"),
        "async_scheduling": _get(s, "async_scheduling"),
        "compilation_mode": _plain(_get(cc, "mode", "level")),
        "cudagraph_mode": _plain(_get(cc, "cudagraph_mode")),
        "max_cudagraph_capture_size": _get(cc, "max_cudagraph_capture_size", "max_capture_size"),
        "cudagraph_capture_sizes": _plain(_get(cc, "cudagraph_capture_sizes")),
        "pass_config": _pass_config(cc),
        "attention_backend_flag": _plain(_get(att, "backend")),
        "speculative_config": str(cfg.speculative_config) if cfg.speculative_config else None,
    }
    r["attention"] = attention_probe(cfg)
    r["topology"] = topology_probe(cfg)
    mm = getattr(m, "multimodal_config", None)
    if mm is not None:
        r["limit_per_prompt"] = _plain(_get(mm, "limit_per_prompt"))
        r["mm_encoder_tp_mode"] = _plain(_get(mm, "mm_encoder_tp_mode"))
        r["language_model_only"] = _get(mm, "language_model_only")
        r["supports_multimodal_inputs"] = _get(m, "supports_multimodal_inputs")
    return r


def _pass_config(cc):
    """The compilation passes vLLM turned on (fusions), as resolved."""
    pc = getattr(cc, "pass_config", None)
    if pc is None:
        return None
    fields = getattr(type(pc), "__dataclass_fields__", {}) or vars(pc)
    return {
        k: _plain(getattr(pc, k))
        for k in fields
        if k.startswith(("fuse_", "enable_", "eliminate_")) and getattr(pc, k, None) is not None
    }


def attention_probe(cfg):
    """The backend a decoder attention layer would pick on worker rank 0
    (as Attention/MLAAttention.__init__ call get_attn_backend). Approximate:
    one representative layer, no sinks/sliding window/sparse flags. Backends
    skipped for ImportError are artifacts of this CPU install."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import get_attn_backend

    m, p = cfg.model_config, cfg.parallel_config
    plat = type(current_platform)
    seen = {}
    real_valid = plat.get_valid_backends

    def spy(*a, **k):
        valid, invalid = real_valid(*a, **k)
        seen["skipped"] = {b.name: reasons for b, (_, reasons) in invalid.items()}
        return valid, invalid

    plat.get_valid_backends = spy
    try:
        with set_current_vllm_config(cfg):
            kw = {"num_heads": m.get_num_attention_heads(p)} if m.use_mla else {}
            old = torch.get_default_dtype()
            torch.set_default_dtype(m.dtype)
            try:
                cls = get_attn_backend(
                    m.get_head_size(), m.dtype, cfg.cache_config.cache_dtype, use_mla=m.use_mla, **kw
                )
            finally:
                torch.set_default_dtype(old)
        out = {"backend": cls.get_name()}
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}"[:500]}
    finally:
        plat.get_valid_backends = real_valid
    if seen.get("skipped"):
        out["skipped"] = seen["skipped"]
    return out


def topology_probe(cfg):
    """What vLLM's own CudaPlatform.is_fully_connected says (NVLink P2P between
    every pair, over the faked NVML) for the GPUs of one TP group on this node,
    and whether custom all-reduce would then stay on: a mirror (not a run; it
    needs real devices) of the checks in distributed/device_communicators/
    custom_all_reduce.py CustomAllreduce.__init__: world size 1 or one it has no
    kernel for, more than two GPUs of one node not fully NVLinked, no P2P
    (_can_p2p). The workers make that choice after the config is resolved."""
    from vllm.platforms import current_platform

    p = cfg.parallel_config
    tp = p.tensor_parallel_size
    local = min(tp, GPU["count"])
    try:
        full = bool(current_platform.is_fully_connected(list(range(local))))
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        sizes = CustomAllreduce._SUPPORTED_WORLD_SIZES
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    on = not (
        p.disable_custom_all_reduce
        or tp == 1
        or tp not in sizes
        or (tp > 2 and not full)
        or not (GPU["p2p"] or GPU["nvlink"])
    )
    if local < tp and on:
        on = None  # a TP group across nodes: MNNVL multicast decides, not probed
    return {"tp_gpus_fully_connected": full, "sm_count": GPU["sm_count"], "custom_all_reduce_expected": on}


# ------------------------------------------------------------ KV stage -----
# vLLM sizes the KV cache after the workers load the model and profile it
# (v1/engine/core.py EngineCore._initialize_kv_caches). Here the engine core's
# method runs as is, over stand-in workers (a subclass of the real gpu_worker.Worker
# whose own methods determine_available_memory / initialize_from_config run) that
# hold a model built on the meta device and a simulated device whose memory
# counters replay what the request's "memory" says profiling would measure.
REQUIRED_MEMORY = ("capacity_bytes", "weights_bytes", "non_torch_bytes", "activation_peak_bytes", "cuda_graph_bytes")
SIM = {"gpu": None}  # the simulated device of the worker now running
KV_INFO = {}  # what the KV stage rested on, for the answer when it refuses


def _torch_oom():
    import torch

    return torch.OutOfMemoryError


class _DeviceOutOfMemory(_torch_oom()):
    """The simulated device cannot hold an allocation (weights, an activation peak,
    CUDA graphs), as torch's allocator would fail on the real GPU. It answers from
    the supplied figures, not from vLLM's code: a refusal at the stage it happens
    in, marked "by": "device" (see classify)."""


@_fake
class _SimulatedGpu:
    """One GPU's memory as torch.accelerator and cudaMemGetInfo report it: torch's
    caching allocator (allocated, its peak, reserved) and memory outside it (CUDA
    context, NCCL, VMM pages of an extensible KV cache)."""

    def __init__(self, total):
        self.total, self.allocated, self.peak, self.reserved, self.outside = total, 0, 0, 0, 0

    def _fits(self, n, what):
        free = self.free_bytes() + self.reserved - self.allocated  # torch's cache is reusable
        if n > free:
            raise _DeviceOutOfMemory(
                f"CUDA out of memory (simulated device): {what} of {n / GiB:.2f} GiB with "
                f"{free / GiB:.2f} GiB free of {self.total / GiB:.2f} GiB"
            )

    def alloc(self, n, what="tried to allocate"):
        self._fits(n, what)
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def transient(self, n):
        """Allocated and freed again (an activation peak); torch keeps it cached."""
        self.alloc(n, "activation peak")
        self.allocated -= n

    def outside_torch(self, n, what):
        """Memory outside torch's allocator (CUDA context, NCCL, VMM pages)."""
        self._fits(n, what)
        self.outside += n

    def free_bytes(self):
        return self.total - self.reserved - self.outside


def _install_fake_device_memory():
    """torch.accelerator's memory queries answer from the running worker's device."""
    import torch

    acc = torch.accelerator
    acc.memory_stats = _fake(
        lambda d=None: {
            "allocated_bytes.all.peak": SIM["gpu"].peak,
            "allocated_bytes.all.current": SIM["gpu"].allocated,
        }
    )
    acc.get_memory_info = _fake(lambda d=None: (SIM["gpu"].free_bytes(), SIM["gpu"].total))
    acc.memory_reserved = _fake(lambda d=None: SIM["gpu"].reserved)
    acc.reset_peak_memory_stats = _fake(lambda d=None: setattr(SIM["gpu"], "peak", SIM["gpu"].allocated))
    acc.empty_cache = _fake(lambda: setattr(SIM["gpu"], "reserved", SIM["gpu"].allocated))
    acc.synchronize = _fake(lambda d=None: None)
    acc.current_device_index = _fake(lambda: 0)
    acc.set_device_index = _fake(lambda d: None)
    # vLLM collects garbage before each measurement so freed tensors return to the
    # allocator; nothing is allocated here, and a full collection over the warm
    # parent's heap costs 0.6 s (24 of them per command at TP 8).
    import gc

    gc.collect = _fake(lambda generation=2: 0)
    # 0.34 caps torch's allocator once the extensible cache is sized; the cap
    # changes nothing that is measured here.
    torch.cuda.set_per_process_memory_fraction = _fake(lambda fraction, device=None: None)


@_fake
class _FakeVmmDriver:
    """The CUDA VMM driver behind 0.34's ExtensibleTensor: physical chunks are
    charged to the simulated device; the granularity is the request's (2 MiB, the
    driver's usual minimum, unless given)."""

    dlpack_device_type = 2

    def __init__(self, granularity):
        import itertools

        self._granularity, self._next, self._chunks = granularity, 1 << 40, {}
        self._handles = itertools.count(1)

    def granularity(self, device_index):
        return self._granularity

    def ensure_context(self, device_index):
        pass

    def reserve(self, size):
        self._next += size + self._granularity
        return self._next - size - self._granularity

    def create(self, size, device_index, export_handle_types=0):
        handle = next(self._handles)
        self._chunks[handle] = size
        SIM["gpu"].outside_torch(size, "KV cache pages")
        return handle

    def release(self, handle):
        SIM["gpu"].outside -= self._chunks.pop(handle)

    def map(self, addr, size, handle):
        pass

    def unmap(self, addr, size):
        pass

    def set_access(self, addr, size, device_index):
        pass

    def free_reserved(self, ptr, size):
        pass


def _install_fake_vmm(memory, unchecked):
    """0.34's extensible KV cache commits pages through the VMM driver."""
    try:
        import vllm.utils.extensible_tensor as et
    except ImportError:
        return  # 0.33: no extensible KV cache
    import torch

    granule = int(memory.get("vmm_granularity_bytes") or 2 << 20)
    if "vmm_granularity_bytes" not in memory:
        unchecked.append(
            "vmm_granularity_bytes: 2 MiB assumed (the driver's "
            "cuMemGetAllocationGranularity, utils/extensible_tensor.py granule_size)"
        )
    # The all-reduce that makes every rank warm up the same shapes: one rank here
    # (the engine core still takes the minimum block count over all workers).
    import vllm.v1.worker.gpu_worker as gw

    gw._min_across_ranks = _fake(lambda value: value)
    driver = _FakeVmmDriver(granule)
    et.get_vmm_driver = _fake(lambda: driver)
    # Views over the reservation: meta tensors (the bytes are never touched here).
    et.uint8_tensor_from_ptr = _fake(lambda ptr, n, dev: torch.empty(n, dtype=torch.uint8, device="meta"))


def _fake_process_groups(cfg, pp_rank):
    """vLLM's GroupCoordinator objects as rank 0 of its TP / DCP / EP groups and
    rank pp_rank of its pipeline, with the sizes the config resolved (what
    distributed/parallel_state.py initialize_model_parallel would have built)."""
    import vllm.distributed.parallel_state as ps

    p = cfg.parallel_config

    def group(name, size, rank=0):
        g = _standin(ps.GroupCoordinator.__new__(ps.GroupCoordinator))
        pg = _FakeProcessGroup(size, rank)
        g.unique_name, g.rank, g.ranks, g.world_size = name, rank, list(range(size)), size
        g.local_rank, g.rank_in_group = rank, rank
        g.cpu_group = g.device_group = pg
        g.device_communicator, g.use_device_communicator, g.mq_broadcaster = None, False, None
        return g

    tp, pcp = p.tensor_parallel_size, getattr(p, "prefill_context_parallel_size", 1)
    dp = p.data_parallel_size
    sizes = {
        "_WORLD": p.world_size,
        "_TP": tp,
        "_PP": p.pipeline_parallel_size,
        "_DP": dp,
        "_EP": dp * pcp * tp,
        "_EPLB": dp * pcp * tp,
        "_DCP": getattr(p, "decode_context_parallel_size", 1),
        "_PCP": pcp,
    }
    for name, size in sizes.items():
        if hasattr(ps, name):
            setattr(ps, name, group(name.strip("_").lower(), size, pp_rank if name == "_PP" else 0))
    if hasattr(ps, "_ETP"):
        ps._ETP = ps._TP


@_fake
class _FakeProcessGroup:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


@contextlib.contextmanager
def _building_on_meta():
    """What building a model on this CPU needs: kernel handles become stubs, CUDA
    streams/events inert, and the 'current CUDA device' the meta device (a model
    that moves a tower .to(current_device()) lands on meta with the rest)."""
    import torch

    saved = {k: getattr(torch.cuda, k) for k in ("Stream", "Event", "current_device")}
    _no_symmetric_memory()
    _flashinfer_sparse_mla()
    torch.cuda.Stream = _FakeStream
    torch.cuda.Event = _FakeStream
    torch.cuda.current_device = _fake(lambda: torch.device("meta"))
    BUILDING_MODEL[0] = True
    try:
        with _CudaOnMeta():
            yield
    finally:
        BUILDING_MODEL[0] = False
        for k, v in saved.items():
            setattr(torch.cuda, k, v)


def _cuda_on_meta_mode():
    import torch

    class CudaOnMeta(torch.overrides.TorchFunctionMode):
        """A tensor a layer asks for on the CUDA device by name while it is built (DeepSeek-V3.2 / GLM-5's shared
        top-k buffer: models/deepseek_v32/nvidia/model.py, device=current_platform.device_type) lands on the meta
        device with the rest of the model: the same shape and dtype, no memory."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    return CudaOnMeta


def _CudaOnMeta():  # noqa: N802 (a mode class, made where torch is imported)
    return _cuda_on_meta_mode()()


def _flashinfer_sparse_mla():
    """vLLM's pinned FlashInfer (flashinfer-python 0.7.2.post1 for 0.33; 0.34 pins 0.7.3) ships the sparse MLA
    decode API the SM 12.x sparse-attention backend asks for (utils/flashinfer.py has_flashinfer_sparse_mla_sm120:
    flashinfer.decode.trtllm_batch_decode_sparse_mla_dsv4 and trtllm_batch_decode_with_kv_cache_mla,
    flashinfer.autotuner.autotune, all in the 0.7.2.post1 wheel); this CPU install has no FlashInfer, so the query
    answers as a GPU install does. Building the backend calls no FlashInfer kernel."""
    try:
        import vllm.utils.flashinfer as flashinfer_utils
    except ImportError:
        return
    flashinfer_utils.has_flashinfer_sparse_mla_sm120 = _fake(lambda: True)


def _no_symmetric_memory():
    """Context-parallel attention layers probe NVLS symmetric memory when built
    (v1/attention/ops/cp_common.py direct_cp_enabled) to pick how DCP ranks gather
    queries and KV; it is a collective over real devices. Answer 'none here', as
    a CPU build would: they keep the all-gather path, which allocates nothing at
    build time. Which gather path runs does not change the KV cache spec."""
    try:
        import vllm.v1.attention.ops.cp_common as cp_common
    except ImportError:
        return
    cp_common.symm_mem_available = False


@_fake
class _FakeStream:
    def __init__(self, *a, **k):
        pass


SPEC_CACHE_DIR = os.environ.get("ORACLE_SPEC_CACHE_DIR")  # set per process in main()


def _spec_key(cfg, pp_rank):
    """What decides the layers a stage builds and the cache they ask for: the
    model and its overrides, the KV cache's dtype and block size, the parallel
    sizes, the attention backend, speculative decoding and multimodal switches."""
    m, c, p = cfg.model_config, cfg.cache_config, cfg.parallel_config
    mm = getattr(m, "multimodal_config", None)
    att = getattr(cfg, "attention_config", None)
    parts = [
        VLLM.__version__,
        m.model,
        str(m.dtype),
        m.quantization,
        str(m.hf_overrides),
        c.cache_dtype,
        c.block_size,
        str(getattr(c, "kv_cache_layout", None)),
        p.tensor_parallel_size,
        p.pipeline_parallel_size,
        pp_rank,
        getattr(p, "decode_context_parallel_size", 1),
        getattr(p, "prefill_context_parallel_size", 1),
        p.data_parallel_size,
        p.enable_expert_parallel,
        str(att),
        str(cfg.speculative_config),
        str(getattr(mm, "limit_per_prompt", None)),
        str(getattr(mm, "language_model_only", None)),
        GPU["capability"],
        GPU["name"],
    ]
    return json.dumps(parts, default=str)


def build_stage(cfg, pp_rank):
    """build_stage_uncached, remembered for the oracle process: the children of one
    parent share a directory (ORACLE_SPEC_CACHE=0 turns it off)."""
    import hashlib
    import pickle

    if not SPEC_CACHE_DIR:
        return build_stage_uncached(cfg, pp_rank)
    key = hashlib.sha256(_spec_key(cfg, pp_rank).encode()).hexdigest()
    path = os.path.join(SPEC_CACHE_DIR, key + ".pkl")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    found = build_stage_uncached(cfg, pp_rank)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(found, f)
    os.replace(tmp, path)
    return found


def build_stage_uncached(cfg, pp_rank):
    """Build the model as worker (pp_rank, tp 0) would, on the meta device, and ask
    vLLM what it caches: v1/worker/gpu/attn_utils.py get_kv_cache_spec (the V2 model
    runner's get_kv_cache_spec) and the KV layouts its attention backends support
    (v1/worker/worker_base.py WorkerBase.get_supported_kv_cache_layouts)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec
    from vllm.v1.worker.worker_base import WorkerBase

    _fake_process_groups(cfg, pp_rank)
    cfg.compilation_config.static_forward_context.clear()  # layers of another stage
    with _building_on_meta(), set_default_torch_dtype(cfg.model_config.dtype), torch.device("meta"):
        initialize_model(vllm_config=cfg)
    with set_current_vllm_config(cfg):
        spec = get_kv_cache_spec(cfg)
        layouts = WorkerBase.get_supported_kv_cache_layouts(_standin(types.SimpleNamespace(vllm_config=cfg)))
    cfg.compilation_config.static_forward_context.clear()
    return spec, layouts


class _SimRunner:
    """The parts of the model runner the memory path touches. Harness, not fake:
    vLLM's code is what calls these and decides with their answers."""

    def __init__(self, worker, cfg, memory):
        self.vllm_config, self.cache_config = cfg, cfg.cache_config
        self.compilation_config, self.model_config = cfg.compilation_config, cfg.model_config
        self._worker, self._memory = worker, memory
        self.model_memory_usage = 0
        self.extensible_kv_cache = None
        self.lora_config, self.is_pooling_model = None, False

    def profile_run(self, randomize_inputs=False):
        # The dummy forward over max_num_batched_tokens: its activation peak.
        SIM["gpu"].transient(int(self._memory["activation_peak_bytes"]))

    def profile_cudagraph_memory(self):
        """The V2 runner's own method (its 0.34 guard: nothing to estimate when the
        extensible cache measures capture after warmup), with the throwaway capture
        it runs (v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory) answered
        by the request's cuda_graph_bytes."""
        import vllm.v1.worker.gpu.model_runner as v2

        saved = v2._profile_cudagraph_memory
        v2._profile_cudagraph_memory = lambda runner: self._cuda_graph_bytes()
        try:
            return v2.GPUModelRunner.profile_cudagraph_memory(self)
        finally:
            v2._profile_cudagraph_memory = saved

    def _cuda_graph_bytes(self):
        from vllm.config import CUDAGraphMode

        if self.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:
            return 0  # cudagraph_utils.py: no decoder graphs, nothing captured
        return int(self._memory["cuda_graph_bytes"])

    @property
    def eplb(self):
        return _standin(types.SimpleNamespace(suppress=contextlib.nullcontext))

    def initialize_kv_cache(self, kv_cache_config, kv_cache_allocation_context=None, extensible=False, **kw):
        """v1/worker/gpu/model_runner.py initialize_kv_cache, as far as memory goes:
        an extensible cache reserves the capacity and commits its minimum (the
        allocate hook allocate_kv_cache calls); a plain one is allocated whole."""
        if not extensible:
            return
        from vllm.v1.worker.extensible_kv_cache import (
            ExtensibleKVCache,
            kv_cache_export_handle_types,
        )

        kv = ExtensibleKVCache(
            kv_cache_config,
            self._worker.device,
            self.cache_config.get_resolved_kv_cache_layout(),
            export_handle_types=kv_cache_export_handle_types(self.vllm_config),
        )
        kv.allocate(kv.size)
        self.extensible_kv_cache = kv

    def update_max_model_len(self, max_model_len):
        pass


def _worker_class():
    from vllm.v1.worker.gpu_worker import Worker

    class SimWorker(Worker):
        """A real gpu_worker.Worker (made without __init__, which would start CUDA)
        whose device is simulated. Methods overridden here are the harness."""

        def get_kv_cache_spec(self):
            return self._stage_spec

        def get_supported_kv_cache_layouts(self):
            return self._stage_layouts

        def extensible_kv_cache_unsupported_reason(self):
            return None  # VMM support assumed (listed as unchecked)

        @contextlib.contextmanager
        def _scoped_allocator_max_split(self, max_split_size_mb):
            yield  # allocator splitting does not change the simulated counters

        def initialize_from_config(self, kv_cache_config):
            self.kv_cache_config = kv_cache_config  # this worker's share, for the answer
            return super().initialize_from_config(kv_cache_config)

        def compile_or_warm_up_model(self):
            return _warm_up(self)

        def extend_kv_cache(self, num_blocks):
            self.cache_config.num_gpu_blocks = num_blocks  # pages are not committed

    return SimWorker


def _new_worker(cls, cfg, memory, rank, stage, spec, layouts):
    """A worker after init_device and load_model: the device holds what it held at
    vLLM's init snapshot (baseline_bytes), then the stage's weights and the non-torch
    memory that appears after the snapshot."""
    import torch
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    w = _standin(cls.__new__(cls))
    w.vllm_config, w.cache_config, w.model_config = cfg, cfg.cache_config, cfg.model_config
    w.parallel_config, w.scheduler_config = cfg.parallel_config, cfg.scheduler_config
    w.compilation_config = cfg.compilation_config
    w.rank = w.local_rank = rank
    w.device = torch.device("cuda:0")
    w.use_v2_model_runner = True
    w._external_weight_charges = _standin(types.SimpleNamespace(fallback_bytes=0, current_bytes=0))
    w._stage_spec, w._stage_layouts = spec, layouts
    w.gpu = SIM["gpu"] = _SimulatedGpu(int(memory["capacity_bytes"]))
    w.gpu.outside_torch(int(memory.get("baseline_bytes") or 0), "CUDA context and NCCL")
    # gpu_worker.py init_device: snapshot after NCCL, then the requested budget.
    w.init_snapshot = MemorySnapshot(device=w.device)
    w.requested_memory = request_memory(w.init_snapshot, cfg.cache_config, 0)
    w.model_runner = _SimRunner(w, cfg, memory)
    weights = int(memory["weights_bytes"][stage])
    STAGE[0] = "load"  # gpu_worker.py load_model: the weights land on the device
    w.gpu.alloc(weights, "weights")
    w.model_runner.model_memory_usage = weights
    w.gpu.outside_torch(int(memory["non_torch_bytes"]), "non-torch memory")
    STAGE[0] = "kv_pool"
    return w


def _warm_up(worker):
    """gpu_worker.py _compile_or_warm_up_model, as far as memory goes (replayed:
    the steps themselves need kernels). With 0.34's extensible KV cache: warmup and
    the sizing steps peak at the activation peak; the committed blocks are released
    around them; CUDA graphs are captured; then vLLM's measure_kv_cache_blocks sizes
    the cache from what is free. Without it, nothing here changes the pool."""
    from vllm.v1.worker import worker_base

    SIM["gpu"] = worker.gpu
    kv = worker.model_runner.extensible_kv_cache
    if kv is None or not worker.cache_config.enable_extensible_kv_cache:
        return worker_base.CompilationTimes(0.0, 0.0)
    from vllm.v1.worker.extensible_kv_cache import measure_kv_cache_blocks

    gpu, memory = worker.gpu, worker.model_runner._memory
    gpu.peak = gpu.allocated  # reset_peak_memory_stats
    gpu.transient(int(memory["activation_peak_bytes"]))  # warmup steps
    kv.commit(kv.min_committed_blocks, shrink=True)
    gpu.transient(int(memory["activation_peak_bytes"]))  # run_kv_cache_sizing_warmup
    kv.record_transient_peak()
    if not worker.model_config.enforce_eager:
        kv.commit(kv.min_committed_blocks, shrink=True)
        gpu.alloc(worker.model_runner._cuda_graph_bytes(), "CUDA graphs")  # capture_model()
    blocks = measure_kv_cache_blocks(
        kv,
        worker.vllm_config,
        worker.device,
        init_free_memory=worker.init_snapshot.free_memory,
        requested_memory=int(worker.requested_memory),
    )
    return worker_base.CompilationTimes(0.0, 0.0, num_kv_blocks=blocks)


def _executor(cfg, wrappers):
    """vLLM's Executor (abstract.py: determine_available_memory, get_kv_cache_specs,
    initialize_from_config, compile_or_warm_up_model, ... all its own), with
    collective_rpc calling each stand-in worker through vLLM's WorkerWrapperBase."""
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.serial_utils import run_method

    class SimExecutor(Executor):
        def _init_executor(self):
            pass  # the workers exist already

        def check_health(self):
            pass

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None, **_):
            results = []
            for w in wrappers:
                SIM["gpu"] = w.worker.gpu
                results.append(run_method(w, method, args, kwargs or {}))
            return results

    ex = _standin(SimExecutor.__new__(SimExecutor))
    ex.vllm_config = cfg
    return ex


def _wrap(worker, rank, cfg):
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    w = _standin(WorkerWrapperBase.__new__(WorkerWrapperBase))
    w.rpc_rank = w.global_rank = rank
    w.worker, w.vllm_config, w._worker_extension_cls = worker, cfg, None
    return w


def _check_memory(memory, pp):
    missing = [k for k in REQUIRED_MEMORY if k not in memory]
    if missing:
        raise ValueError(f"request memory lacks {missing}")
    weights = memory["weights_bytes"]
    if not isinstance(weights, list) or len(weights) not in (1, pp):
        raise ValueError(f"memory.weights_bytes needs one figure per pipeline stage ({pp})")
    return dict(memory, weights_bytes=weights * pp if len(weights) == 1 else weights)


def _unchecked(memory, cfg):
    """The terms vLLM would measure or query that the request (or the oracle) supplies."""
    out = [
        "weights_bytes: supplied per stage (vLLM measures model_runner.model_memory_usage while loading)",
        "non_torch_bytes: supplied (non-torch memory that appears after the worker's init snapshot, "
        "utils/mem_utils.py memory_profiling non_torch_increase)",
        "activation_peak_bytes: supplied (profile_run's torch peak above what stays allocated)",
        "cuda_graph_bytes: supplied (cudagraph_utils.py profile_cudagraph_memory estimate and capture_model)",
        "capacity_bytes: the device total torch reports (cudaMemGetInfo)",
    ]
    if "baseline_bytes" not in memory:
        out.append(
            "baseline_bytes: 0 assumed (CUDA context, NCCL, cuBLAS handles in use at vLLM's "
            "init snapshot, gpu_worker.py init_device)"
        )
    if getattr(cfg.cache_config, "enable_extensible_kv_cache", False):
        out += [
            "torch_reserve_growth_bytes: 0 assumed (extensible_kv_cache.py: torch's reservation "
            "growth over a sizing step)",
            "warmup transient peak: activation_peak_bytes assumed (run_kv_cache_sizing_warmup)",
            "VMM available on the driver assumed (extensible_kv_cache_unsupported_reason)",
            "warmup / capture order of gpu_worker.py _compile_or_warm_up_model replayed by the oracle",
        ]
    if (memory.get("capacity_bytes") or 0) != GPU["memory_mib"] << 20:
        out.append(
            f"capacity_bytes {memory.get('capacity_bytes')} differs from NVML's total "
            f"{GPU['memory_mib'] << 20} (gpu.memory_mib): sizing uses capacity_bytes"
        )
    return out


def build_model(cfg):
    """The model built on the meta device at each pipeline stage as its workers would, and no pool sized: for a
    command that comes without memory figures (shardwise refuses it while the model is built, so it has none)."""
    STAGE[0] = "load"
    _install_fake_device_memory()
    for stage in range(cfg.parallel_config.pipeline_parallel_size):
        build_stage(cfg, stage)
    BUILT[0] = True


def kv_pool(cfg, memory):
    """vLLM's own KV-cache sizing for a resolved config (see the KV stage note)."""
    from vllm.v1.engine.core import EngineCore

    STAGE[0] = "kv_pool"
    if cfg.speculative_config is not None:  # never answer with half the cache
        raise NotImplementedError(
            "the KV stage builds the target model only; a draft model's KV layers would be missing"
        )
    p = cfg.parallel_config
    pp, workers = p.pipeline_parallel_size, p.world_size
    memory = _check_memory(memory, pp)
    info = {"unchecked": _unchecked(memory, cfg)}
    KV_INFO.clear()
    KV_INFO.update(info)
    _install_fake_device_memory()
    _install_fake_vmm(memory, info["unchecked"])
    STAGE[0] = "load"  # the workers build the model (a refusal here is vLLM's at load)
    stages = [build_stage(cfg, s) for s in range(pp)]
    BUILT[0] = True
    STAGE[0] = "kv_pool"
    _fake_process_groups(cfg, 0)
    cls = _worker_class()
    per_stage = workers // pp
    wrappers = []
    for rank in range(workers):
        stage = rank // per_stage
        worker = _new_worker(cls, cfg, memory, rank, stage, *stages[stage])
        wrappers.append(_wrap(worker, rank, cfg))
    ex = _executor(cfg, wrappers)
    core = _standin(
        types.SimpleNamespace(model_executor=ex, available_gpu_memory_for_kv_cache=-1, collective_rpc=ex.collective_rpc)
    )
    max_len_before = cfg.model_config.max_model_len
    scheduler_kv = EngineCore._initialize_kv_caches(core, cfg)
    return _describe_pool(cfg, scheduler_kv, wrappers, info, max_len_before)


def _logical_block(groups, block, cfg):
    """Tokens a block holds as the scheduler counts them, asked of vLLM for the first group (its DCP-sharded
    groups hold block_size × DCP; the others block_size)."""
    from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size

    dcp = getattr(cfg.parallel_config, "decode_context_parallel_size", 1) or 1
    return resolve_dcp_kv_block_size(groups[0].kv_cache_spec, dcp) if groups else block


def _describe_pool(cfg, scheduler_kv, wrappers, info, max_len_before):
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
    from vllm.v1.core.kv_cache_planning import _pool_bytes_per_block_from_builder

    groups = scheduler_kv.kv_cache_groups
    block = cfg.cache_config.block_size
    builder = get_kv_cache_config_builder(cfg)
    out = {
        "num_blocks": scheduler_kv.num_blocks,
        "block_size": block,
        "tokens_per_rank": scheduler_kv.num_blocks * block,
        # what the scheduler counts: a block holds block_size tokens on each DCP rank
        # (v1/core/kv_cache_utils.py resolve_dcp_kv_block_size, single_type_kv_cache_manager.py)
        "logical_tokens_per_rank": scheduler_kv.num_blocks * _logical_block(groups, block, cfg),
        "bytes_per_block": _pool_bytes_per_block_from_builder(builder, cfg, groups) if groups else 0,
        "groups": [_group(g) for g in groups],
        "available_bytes": [
            w.worker.available_kv_cache_memory_bytes if hasattr(w.worker, "available_kv_cache_memory_bytes") else None
            for w in wrappers
        ],
        "engine_reported_tokens": getattr(cfg.cache_config, "kv_cache_size_tokens", None),
        "max_model_len": cfg.model_config.max_model_len,
        "max_model_len_auto_fitted": cfg.model_config.original_max_model_len == -1,
        "extensible": bool(getattr(cfg.cache_config, "enable_extensible_kv_cache", False)),
        "dcp": getattr(cfg.parallel_config, "decode_context_parallel_size", 1),
    }
    per_stage = len(wrappers) // cfg.parallel_config.pipeline_parallel_size
    out["stages"] = [_stage_pool(cfg, builder, w.worker) for w in wrappers[::per_stage]]
    kvs = [w.worker.model_runner.extensible_kv_cache for w in wrappers]
    if out["extensible"] and kvs[0] is not None:
        out["capacity_blocks"] = kvs[0].capacity_blocks
    if max_len_before != out["max_model_len"]:
        out["max_model_len_before"] = max_len_before
    out.update(info)
    return out


def _stage_pool(cfg, builder, worker):
    """One pipeline stage's share: its layers per KV group and what a block costs
    there (stages with other layer counts pay other bytes per block)."""
    from vllm.v1.core.kv_cache_planning import _pool_bytes_per_block_from_builder

    kv = getattr(worker, "kv_cache_config", None)
    if kv is None:
        return None
    groups = kv.kv_cache_groups
    return {
        "groups": [_group(g) for g in groups],
        "bytes_per_block": _pool_bytes_per_block_from_builder(builder, cfg, groups) if groups else 0,
        "available_bytes": getattr(worker, "available_kv_cache_memory_bytes", None),
    }


def _group(g):
    spec = g.kv_cache_spec
    first = getattr(spec, "first_spec", None) or spec
    return {
        "kind": type(first).__name__,
        "layers": len(g.layer_names),
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "dtype": str(getattr(first, "dtype", "")).replace("torch.", ""),
        "sliding_window": getattr(first, "sliding_window", None),
    }


# ------------------------------------------------------------- driver ----
def _gpu_of(req):
    gpu = req.get("gpu") or {}
    return {**DEFAULT_GPU, **gpu}, sorted(k for k in DEFAULT_GPU if k not in gpu)


def run_one(req):
    """Runs in the forked child."""
    gpu, assumed = _gpu_of(req)
    GPU.update(gpu)
    os.environ.update({k: str(v) for k, v in (req.get("env") or {}).items()})
    logging.Logger.handle = _capturing_handle
    before = set(sys.modules)
    out = {"ok": False, "error": None, "refusal": None, "crash": None, "resolved": None, "kv_pool": None}
    preload = None
    try:
        out["resolved"], cfg = resolve(list(req["argv"]))
        preload = [m for m in sys.modules if m not in before]  # before any model build
        if req.get("memory"):
            out["kv_pool"] = kv_pool(cfg, req["memory"])
        elif req.get("build"):
            build_model(cfg)
        out["ok"] = True
    except BaseException as e:  # noqa: BLE001
        out.update(verdict(e))
        if STAGE[0] in ("load", "kv_pool") and KV_INFO:
            out["kv_pool"] = dict(KV_INFO)  # what it rested on, no pool
        if os.environ.get("ORACLE_TRACEBACK"):
            traceback.print_exception(e)
    out["built"] = BUILT[0]
    if assumed:
        out["gpu_assumed"] = assumed
    out.update(CAPTURED)
    out["fake_ops_called"] = sorted(set(FAKE_OPS_CALLED))
    out["_new_modules"] = preload if preload is not None else [m for m in sys.modules if m not in before]
    return out


def preload(modules):
    """Import in the parent what a child had to import (model and quantization
    modules), so later forks start warm. ORACLE_PRELOAD=0 turns this off."""
    if os.environ.get("ORACLE_PRELOAD", "1") == "0":
        return
    import importlib

    level = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        for name in modules:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001
                    pass
    finally:
        logging.disable(level)


def _child_crash(typ, message):
    return {
        "ok": False,
        "error": f"{typ}: {message}",
        "refusal": None,
        "crash": {"type": typ, "message": message, "where": "child"},
        "resolved": None,
        "kv_pool": None,
    }


def run_forked(req):
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            res = json.dumps(run_one(req), default=str)
        except BaseException as e:  # noqa: BLE001
            res = json.dumps(_child_crash("OracleError", repr(e)[:2000]))
        with os.fdopen(wfd, "w") as w:
            w.write(res)
        os._exit(0)
    os.close(wfd)
    chunks, deadline = [], time.monotonic() + PER_COMMAND_TIMEOUT_S
    with os.fdopen(rfd) as r:
        signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError()))
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 1))
        try:
            chunks.append(r.read())
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    _, status = os.waitpid(pid, 0)
    data = "".join(chunks)
    if data:
        return json.loads(data)
    if time.monotonic() >= deadline:
        return _child_crash("Timeout", f"no answer within {PER_COMMAND_TIMEOUT_S:g} s")
    return _child_crash("ChildDied", f"wait status {status}")


def main():
    import tempfile

    global SPEC_CACHE_DIR
    with contextlib.ExitStack() as stack:
        if os.environ.get("ORACLE_SPEC_CACHE", "1") != "0" and not SPEC_CACHE_DIR:
            SPEC_CACHE_DIR = stack.enter_context(tempfile.TemporaryDirectory(prefix="vllm-oracle-specs-"))
        serve_lines()


def serve_lines():
    print(f"vllm_oracle: vllm {VLLM.__version__} ready", file=sys.stderr)
    for line in sys.stdin:
        if not line.strip():
            continue
        t0, req = time.perf_counter(), None
        try:
            req = json.loads(line)
            res = run_forked(req)
            preload(res.pop("_new_modules", None) or [])
        except Exception as e:  # noqa: BLE001
            res = _child_crash("OracleError", repr(e)[:2000])
            res["crash"]["where"] = "parent"
        res["seconds"] = round(time.perf_counter() - t0, 3)
        if isinstance(req, dict) and "tag" in req:  # echoed back untouched
            res = {"tag": req["tag"], **res}
        _OUT.write(json.dumps(res, default=str) + "\n")


if __name__ == "__main__":
    main()
