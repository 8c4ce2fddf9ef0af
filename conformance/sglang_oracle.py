#!/usr/bin/env python3
"""Resolve SGLang launch commands with the real sglang package on a CPU-only box.

Run with the venv made by conformance/setup-sglang.sh:

    .engines/sglang-0.5.23/bin/python conformance/sglang_oracle.py < cmds.jsonl > out.jsonl

Input, one JSON object per line:
    {"argv": ["--model-path", "/dir/with/config.json", "--tp-size", "8"],
     "gpu": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 8,
             "capability": [9, 0]},
     "id": "optional, echoed back", "env": {"OPTIONAL_ENV": "for this command"}}
Optional gpu keys: "sm_count", "driver" (nvidia-smi driver_version), "cuda"
(torch.version.cuda).

Output, one JSON object per input line, in order:
    {"id", "ok", "error": "Type: message" | null, "resolved": {...} | null,
     "reset": [{"field", "given", "resolved", "by"}], "warnings": [...],
     "notes": [...], "trace": {...}, "ms": float}
"reset" lists flags the command set that resolution changed, with the handler
that did it (from SGLang's own _resolved_overrides); "warnings"/"notes" are the
WARNING+/INFO records SGLang logged; "trace" records what memory_hook's helpers
returned (GPU MiB, reserve_for_graph_mb, VLM adjustment) while resolving.

This follows `python -m sglang.launch_server` up to model loading:
prepare_server_args(argv) -> ServerArgs.resolve_once() (the whole resolution
pipeline, sglang/srt/arg_groups/pipeline.py) -> ServerArgs.check_server_args().

Design: this process is a router. Some SGLang modules freeze GPU facts into
module-level constants at import time (e.g. layers/deep_gemm_wrapper/configurer.py),
so each distinct "gpu" gets its own worker process that fakes that GPU *before*
importing sglang, and then serves every command for that GPU. Inside a worker,
each command runs on fresh objects, with SGLang's lru_caches cleared and
os.environ restored afterwards. A worker that dies or hangs costs one command.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import select
import subprocess
import sys
import time
import traceback

STUBBED_PACKAGES = ("torchvision", "sgl_kernel", "flashinfer")
DEFAULTS = {"driver": "580.95.05", "cuda": "13.0", "sm_count": 132}
WARMUP_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
NOISE = (DeprecationWarning, PendingDeprecationWarning, ResourceWarning, ImportWarning)
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Fields reported by default (all of them with --all-fields).
KEY_FIELDS = (
    "model_path", "device", "dtype", "quantization", "tp_size", "pp_size",
    "dp_size", "ep_size", "moe_dp_size", "attn_cp_size", "attn_dp_size",
    "dcp_size", "dcp_comm_backend", "enable_dp_attention", "enable_dp_lm_head",
    "nnodes", "node_rank", "dist_init_addr", "mem_fraction_static",
    "chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
    "max_total_tokens", "disable_cuda_graph", "attention_backend",
    "decode_attention_backend", "prefill_attention_backend",
    "moe_a2a_backend", "moe_runner_backend", "kv_cache_dtype", "page_size",
    "disable_overlap_schedule", "disable_radix_cache", "context_length",
    "language_model_only", "enable_eplb", "ep_num_redundant_experts",
)


# ----------------------------------------------------------------------------
# Worker side
# ----------------------------------------------------------------------------

def fake_gpu(gpu: dict) -> None:
    """Make torch (and nvidia-smi) report `gpu`; must run before sglang imports."""
    import types

    import torch

    g = {**DEFAULTS, **gpu}
    major, minor = (int(x) for x in g["capability"])
    total = int(g["memory_mib"]) * 1024 * 1024
    props = types.SimpleNamespace(
        name=g["name"], major=major, minor=minor, total_memory=total,
        multi_processor_count=int(g["sm_count"]), gcnArchName="", uuid="fake",
    )
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: int(g["count"])
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: (major, minor)
    cuda.get_device_name = lambda device=None: g["name"]
    cuda.get_device_properties = lambda device=None: props
    cuda.mem_get_info = lambda device=None: (total, total)
    torch.version.cuda = str(g["cuda"])

    # SGLang reads memory/compute capability/driver through nvidia-smi.
    real_run = subprocess.run
    answers = {
        "--query-gpu=memory.total": str(int(g["memory_mib"])),
        "--query-gpu=compute_cap": f"{major}.{minor}",
        "--query-gpu=driver_version": str(g["driver"]),
        "--query-gpu=name": g["name"],
    }

    def run(args, *a, **kw):
        if isinstance(args, (list, tuple)) and args and args[0] == "nvidia-smi":
            query = next((x for x in args if x.startswith("--query-gpu=")), None)
            if query in answers:
                out = "\n".join([answers[query]] * int(g["count"])) + "\n"
                text = kw.get("text") or kw.get("universal_newlines")
                return subprocess.CompletedProcess(
                    args, 0, out if text else out.encode(), "" if text else b""
                )
            return subprocess.CompletedProcess(args, 1, "", "unsupported query")
        return real_run(args, *a, **kw)

    subprocess.run = run


def install_import_stubs() -> None:
    """Empty stand-ins for CUDA-only packages a real install has but this box can't load.

    sgl_kernel/flashinfer ship CUDA binaries (imported at module level once
    is_cuda() is true; flashinfer's presence also drives has_flashinfer);
    torchvision's PyPI wheel links libtorch_cuda. Only their import matters here.
    """
    import importlib.abc
    import importlib.machinery
    import types

    # transformers caches this; keep it False so it never drives torchvision itself.
    import transformers.utils.import_utils as hf_imports

    hf_imports.is_torchvision_available()

    class Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return make(name)

    class Dummy(metaclass=Meta):
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return Dummy()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return make(name)

    def make(name):
        return Meta(name, (Dummy,), {})

    class StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return make(name)

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


class Capture:
    """Collects SGLang log records and Python warnings for one command."""

    def __init__(self):
        import logging

        self.records: list = []
        capture = self

        class Handler(logging.Handler):
            def emit(self, record):
                try:
                    msg = record.getMessage()
                except Exception:  # a broken format string must not fail the command
                    msg = str(record.msg)
                capture.records.append((record.levelno, ANSI.sub("", msg)))

        self.handler = Handler(level=logging.INFO)
        logger = logging.getLogger("sglang")
        logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)

    def split(self):
        import logging

        warn = [m for lvl, m in self.records if lvl >= logging.WARNING]
        info = [m for lvl, m in self.records if lvl < logging.WARNING]
        return warn, info


class Worker:
    def __init__(self, gpu: dict, all_fields: bool, verbose: bool):
        fake_gpu(gpu)
        install_import_stubs()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import logging

        from sglang.srt.arg_groups import memory_hook
        from sglang.srt.server_args import prepare_server_args

        self.logging = logging
        self.prepare_server_args = prepare_server_args
        self.all_fields = all_fields
        self.verbose = verbose
        self.capture = Capture()
        self.trace: dict = {}
        self._spy(memory_hook, "get_device_memory_capacity", "gpu_mem_mib")
        self._spy(memory_hook, "reserve_for_graph_mb", "reserve_for_graph_mb")
        self._spy(memory_hook, "reserve_for_deepep_a2a_mb", "reserve_for_deepep_a2a_mb")
        self._spy(memory_hook, "adjust_mem_fraction_for_vlm", "vlm_adjusted_mem_fraction",
                  arg0="mem_fraction_before_vlm_adjust")
        self._caches: list = []
        self._seen_modules = 0
        self._warm_up()

    def _warm_up(self) -> None:
        """Resolve one tiny model so import-time log noise is not charged to a command."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(WARMUP_CONFIG, f)
            self.resolve(["--model-path", tmp], None)

    def _spy(self, module, name, key, arg0=None):
        """Record what a memory_hook helper returned; behaviour is unchanged."""
        real = getattr(module, name)
        trace = self

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

    def resolve(self, argv: list, env: dict | None) -> dict:
        logging = self.logging
        env_before = dict(os.environ)
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        self.clear_caches()
        self.capture.records.clear()
        self.trace = {}
        result = {"ok": False, "error": None, "resolved": None, "reset": []}
        argparse_err = io.StringIO()
        import contextlib
        import warnings

        pywarn: list = []
        try:
            with warnings.catch_warnings(record=True) as pywarn:
                warnings.simplefilter("always")
                try:
                    with contextlib.redirect_stderr(argparse_err):
                        server_args = self.prepare_server_args(list(argv))
                finally:
                    if not self.verbose:  # prepare_server_args re-runs basicConfig
                        logging.getLogger().handlers[:] = [logging.NullHandler()]
                server_args.resolve_once()
                server_args.check_server_args()
                resolved = server_args.resolved_dict()
            result["ok"] = True
            result["resolved"] = self._select(resolved)
            result["reset"] = _explicit_flags_changed(server_args, resolved)
        except SystemExit as exc:  # argparse rejected the command line
            lines = argparse_err.getvalue().strip().splitlines()
            result["error"] = f"SystemExit: {lines[-1] if lines else exc.code}"
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
            if self.verbose:
                traceback.print_exc()
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        warn, info = self.capture.split()
        warn += [
            f"{w.category.__name__}: {ANSI.sub('', str(w.message))}"
            for w in pywarn
            if "/sglang/" in str(w.filename) and not issubclass(w.category, NOISE)
        ]
        result.update(warnings=warn, notes=info, trace=self.trace)
        return result

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

        for field in msgspec.structs.fields(ServerArgs):
            if field.default is not msgspec.NODEFAULT:
                _DEFAULTS_CACHE[field.name] = field.default
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
    worker = Worker(json.loads(gpu_json), all_fields, verbose)
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        res = worker.resolve(req["argv"], req.get("env"))
        res["ms"] = round((time.perf_counter() - t0) * 1000, 1)
        proto.write(json.dumps(res, default=str) + "\n")


# ----------------------------------------------------------------------------
# Router side
# ----------------------------------------------------------------------------

class WorkerProc:
    def __init__(self, gpu: dict, opts):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(gpu)]
        if opts.all_fields:
            cmd.append("--all-fields")
        if opts.verbose:
            cmd.append("--verbose")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=None if opts.verbose else subprocess.DEVNULL, text=True, bufsize=1,
        )
        if not self._read(opts.startup_timeout).get("ready"):
            self.close()
            raise RuntimeError("worker failed to start (run with --verbose)")

    def _read(self, timeout: float):
        """The worker's next answer, or a WorkerDied error result."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        why = f"exit code {self.proc.poll()}" if ready else f"no answer within {timeout}s"
        return {"ok": False, "error": f"WorkerDied: {why}", "resolved": None,
                "warnings": [], "notes": [], "trace": {}}

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
            res = workers[key].ask({"argv": req["argv"], "env": req.get("env")}, opts.timeout)
            if str(res.get("error")).startswith("WorkerDied"):
                workers.pop(key).close()
        except Exception as exc:
            res = {"ok": False, "error": f"OracleError: {type(exc).__name__}: {exc}",
                   "resolved": None, "warnings": [], "notes": [], "trace": {}}
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
