#!/usr/bin/env python
"""Resolve `vllm serve` launch commands with the real vLLM package, on a CPU box.

Run with a venv made by setup-vllm.sh:
    .engines/vllm-0.34.0/bin/python conformance/vllm_oracle.py < cmds.jsonl > out.jsonl

Input, one JSON object per line:
    {"argv": ["/path/to/model_dir", "-tp", "8", ...],
     "gpu": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 8,
             "capability": [9, 0]},
     "env": {"VLLM_...": "..."}}            # optional extra environment
Output, one JSON line per input:
    {"ok": bool, "error": "Type: message" | null, "resolved": {...},
     "warnings": [...], "notes": [...], "seconds": float}

What is faked (nothing under site-packages is edited; all patches are in memory):
  * every compiled module inside vllm/ (*.so: _C_stable_libtorch, FA2/FA3, FlashMLA,
    ...) is an empty module: they need libcuda.so.1 and torch 2.14 (we run torch
    2.13 CPU). torch.ops._C & co. expose only the cutlass capability queries some
    model modules call at import time; listed per command in "fake_ops_called".
  * NVML (vllm.utils.import_utils.import_pynvml()) answers with the requested GPU,
    so vllm.platforms picks NvmlCudaPlatform; CudaPlatform's name / capability /
    total memory / device_count / NVLink queries read the same GPU, and so do
    torch.cuda.is_available/device_count (so Triton sees an active CUDA driver
    and vLLM's HAS_TRITON is True, as on a GPU host).
  * the model registry's `python -m` subprocess (which would not see the fakes)
    runs in-process; results land in VLLM_CACHE_ROOT/modelinfos as usual.
Each command runs in a forked child of a warm parent: module-level caches,
warn-once state and os.environ never leak from one command to the next.
Extra output: "attention" = backend an attention layer would select (probe),
"warnings" = every vLLM WARNING+, "notes" = INFO lines that say something was
reset / ignored / overridden / fell back.

Stops at create_engine_config(), i.e. right before the engine/workers start.
"""
import enum
import json
import logging
import os
import re
import signal
import sys
import time
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(
    os.path.dirname(os.path.dirname(sys.executable)), "vllm-cache"))
if not os.environ.get("ORACLE_VERBOSE"):
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

# vLLM prints logs on stdout; keep our stdout for JSON only.
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

PER_COMMAND_TIMEOUT_S = float(os.environ.get("ORACLE_TIMEOUT_S", "120"))
DEFAULT_GPU = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
               "count": 8, "capability": [9, 0]}
GPU = dict(DEFAULT_GPU)  # the fake GPU the current command sees

# ---------------------------------------------------------------- fakes ----
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
                sys.modules.setdefault(name, types.ModuleType(name))


_stub_cuda_extensions()
FAKE_OPS_CALLED = []


def _cap():
    return GPU["capability"][0] * 10 + GPU["capability"][1]


# Capability queries that vLLM's kernels answer (csrc/quantization/...); some
# model modules call them at import time.
_SUPPORTS = {
    "cutlass_scaled_mm_supports_fp8": lambda cap: cap >= 89,
    "cutlass_scaled_mm_supports_block_fp8": lambda cap: cap >= 90,
    "cutlass_scaled_mm_supports_fp4": lambda cap: cap >= 100,
    "cutlass_group_gemm_supported": lambda cap: cap in (90, 100, 103),
}


class _FakeOp:
    def __init__(self, ns, name):
        self.ns, self.name = ns, name
        self.default = self

    def __call__(self, *a, **k):
        FAKE_OPS_CALLED.append(f"{self.ns}.{self.name}")
        return _SUPPORTS[self.name](int(a[0]) if a else _cap())


class _FakeOpNamespace:
    def __init__(self, ns):
        self._ns = ns

    def __getattr__(self, name):
        # Only the capability queries exist; kernels stay missing (hasattr False)
        # so vLLM skips their fake-tensor registrations, as in a CPU build.
        if name not in _SUPPORTS:
            raise AttributeError(f"fake torch.ops.{self._ns} has no op {name!r}")
        return _FakeOp(self._ns, name)


def _fake_torch_ops():
    import torch

    for ns in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_rocm_C",
               "_flashmla_C", "_flashmla_extension_C", "_vllm_fa2_C",
               "_vllm_fa3_C", "_deepselect_C", "_flashkda_C", "_C_utils"):
        torch.ops.__dict__[ns] = _FakeOpNamespace(ns)


_fake_torch_ops()


def _install_fake_nvml():
    from vllm.utils.import_utils import import_pynvml

    nv = import_pynvml()

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
        "nvmlDeviceGetP2PStatus": lambda a, b, idx: nv.NVML_P2P_STATUS_OK,
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlSystemGetDriverVersion": lambda: "580.00",
    }
    for k, v in fakes.items():
        setattr(nv, k, v)


def _install_fake_cuda_platform():
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    cls = cuda.CudaPlatform
    cm = classmethod
    cls.get_device_capability = cm(lambda c, device_id=0: DeviceCapability(*GPU["capability"]))
    cls.get_device_name = cm(lambda c, device_id=0: GPU["name"])
    cls._get_physical_device_name = cm(lambda c, device_id=0: GPU["name"])
    cls.get_device_total_memory = cm(lambda c, device_id=0: GPU["memory_mib"] << 20)
    cls.get_device_uuid = cm(lambda c, device_id=0: f"GPU-fake-{device_id}")
    cls.device_count = cm(lambda c: GPU["count"])
    cls.is_fully_connected = cm(lambda c, ids: True)
    cuda._cuda_device_count_stateless = lambda *a, **k: GPU["count"]


def _fake_torch_cuda():
    """torch.cuda agrees with NVML. Must precede `import vllm`: Triton's CUDA
    driver counts as active iff torch.cuda.is_available(), and vLLM reads
    HAS_TRITON once at import (it gates e.g. Model Runner V2)."""
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: GPU["count"]
    torch.cuda.get_device_capability = lambda d=None: tuple(GPU["capability"])
    torch.cuda.get_device_name = lambda d=None: GPU["name"]


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
NOTE_RE = re.compile(r"reset|ignor|overrid|disabl|fall(ing)? ?back|forc|"
                     r"not supported|unsupported|defaulting|capping|instead",
                     re.I)
CAPTURED = {"warnings": [], "notes": []}
_orig_handle = logging.Logger.handle


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


# ------------------------------------------------------------ resolving ----
class _Resolved(Exception):
    def __init__(self, config, headless):
        self.config, self.headless = config, headless


def _engine_config(args, headless):
    """What run_server / run_headless / run_multi_api_server do before spawning."""
    from vllm.entrypoints.common import cli_args
    from vllm.usage.usage_lib import UsageContext

    engine_args = VLLM.AsyncEngineArgs.from_cli_args(args)
    if hasattr(cli_args, "propagate_flash_late_interaction"):
        cli_args.propagate_flash_late_interaction(args, engine_args)
    if not headless and (args.api_server_count or 1) > 1:
        engine_args._api_process_count = args.api_server_count
        engine_args._api_process_rank = -1
    kw = {"headless": True} if headless else {}
    cfg = engine_args.create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER, **kw)
    if headless and cfg.parallel_config.data_parallel_size_local <= 0:
        raise ValueError("data_parallel_size_local must be > 0 in headless mode")
    raise _Resolved(cfg, headless)


def resolve(argv):
    parser = FlexibleArgumentParser(description="vLLM CLI")
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
        return summarize(r.config, args, r.headless)
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
        "attention_backend_flag": _plain(_get(att, "backend")),
        "speculative_config": str(cfg.speculative_config) if cfg.speculative_config else None,
    }
    r["attention"] = attention_probe(cfg)
    mm = getattr(m, "multimodal_config", None)
    if mm is not None:
        r["limit_per_prompt"] = _plain(_get(mm, "limit_per_prompt"))
        r["mm_encoder_tp_mode"] = _plain(_get(mm, "mm_encoder_tp_mode"))
        r["language_model_only"] = _get(mm, "language_model_only")
        r["supports_multimodal_inputs"] = _get(m, "supports_multimodal_inputs")
    return r


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
                cls = get_attn_backend(m.get_head_size(), m.dtype, cfg.cache_config.cache_dtype,
                                       use_mla=m.use_mla, **kw)
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


# ------------------------------------------------------------- driver ----
def run_one(req):
    """Runs in the forked child."""
    GPU.update(req.get("gpu") or {})
    os.environ.update({k: str(v) for k, v in (req.get("env") or {}).items()})
    logging.Logger.handle = _capturing_handle
    before = set(sys.modules)
    out = {"ok": False, "error": None, "resolved": None}
    try:
        out["resolved"] = resolve(list(req["argv"]))
        out["ok"] = True
    except SystemExit as e:  # argparse errors
        out["error"] = f"SystemExit: argparse exit {e.code}: {(_ARGPARSE_MSG or [''])[-1]}"
    except BaseException as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        out["error"] = f"{type(e).__name__}: {' '.join(x.strip() for x in msg)}"[:2000]
    out.update(CAPTURED)
    out["fake_ops_called"] = sorted(set(FAKE_OPS_CALLED))
    out["_new_modules"] = [m for m in sys.modules if m not in before]
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


_ARGPARSE_MSG = []
_orig_error = __import__("argparse").ArgumentParser.error


def _argparse_error(self, message):
    _ARGPARSE_MSG.append(message)
    return _orig_error(self, message)


__import__("argparse").ArgumentParser.error = _argparse_error


def run_forked(req):
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            res = json.dumps(run_one(req), default=str)
        except BaseException as e:  # noqa: BLE001
            res = json.dumps({"ok": False, "error": f"OracleError: {e!r}", "resolved": None})
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
    why = "timeout" if time.monotonic() >= deadline else f"wait status {status}"
    return {"ok": False, "error": f"OracleCrash: child died ({why})", "resolved": None}


def main():
    import vllm
    print(f"vllm_oracle: vllm {vllm.__version__} ready", file=sys.stderr)
    for line in sys.stdin:
        if not line.strip():
            continue
        t0, req = time.perf_counter(), None
        try:
            req = json.loads(line)
            res = run_forked(req)
            preload(res.pop("_new_modules", None) or [])
        except Exception as e:  # noqa: BLE001
            res = {"ok": False, "error": f"OracleError: {e!r}", "resolved": None}
        res["seconds"] = round(time.perf_counter() - t0, 3)
        if isinstance(req, dict) and "tag" in req:  # echoed back untouched
            res = {"tag": req["tag"], **res}
        _OUT.write(json.dumps(res, default=str) + "\n")


if __name__ == "__main__":
    main()
