"""Why a measurement sits far from its prediction: the mechanisms shardwise knows, each priced where the model
can price it.

A row is beyond the stated accuracy when a metric's error exceeds the median error over every row `validate --set
all` predicts of its kind of decoding (serve/accuracy.py stated_median). For such a row every mechanism whose
conditions hold is named. One the model can price comes with the prediction it gives: the row predicted again
with that one input changed (peer-to-peer transfers off, the roofline instead of the kernel tables, the launch
cost that would give the measured speed), and with what the same change does to the other rows measured on the
same machine by the same source, which the change must not break to be a likely cause. A priced mechanism that
moves the prediction away from the measurement cannot explain the gap and is left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from shardwise.hardware.calibration import Calibration
from shardwise.hardware.kernel_tables import spec
from shardwise.measure.reference import METRICS, Checked, check_row
from shardwise.serve.accuracy import beyond_stated, older_than_modelled
from shardwise.spec.cluster import ClusterSpec, with_intra_node

LARGE_BATCH = 256  # running requests per rank from which per-request host work is a step's visible share
REQUEST_HOST_S = (50e-6, 100e-6, 200e-6, 400e-6)  # per-request host times tried, doubling
PREFILL_SCALES = (1.5, 2.0, 3.0, 4.0)  # prefill steps this many times their priced time, tried in turn
FIRST_TOKEN_HOST_S = (0.025, 0.05, 0.1, 0.2, 0.4)  # host times before the scheduler sees a request, doubling
FEW_CLIENTS = 8  # closed loops of up to this many clients: a first token waits on few other requests
DECODE_METRICS = ("output_tok_s", "tpot_ms")
# share of a closed-loop run's duration its own latencies leave unaccounted for, from which the run is said to hold
# time without output: from their medians (which understate the mean latency), InferenceX runs after warm-up
# requests fall at most 12 % short (3 % at the median); from their means, where given, at most 3 %
IDLE_SHARE = 0.15
PRICED_ALIKE = 0.05  # two predictions of time per token this close are the same price to the model
# how far apart one configuration's runs on different days fall (InferenceX's README: up to about 30 %): two releases
# measured further apart than this differ by more than the day they ran
DAY_TO_DAY = 0.30


@dataclass(frozen=True, kw_only=True)
class Mechanism:
    name: str
    why: str
    predicted: dict[str, float | None] | None = None  # the row's metrics with the mechanism in force
    siblings: dict[str, float | None] = field(default_factory=dict)  # other rows' output tok/s error under it

    def payload(self) -> dict:
        return {"name": self.name, "why": self.why, "predicted": self.predicted, "siblings_error": self.siblings}


def beyond(c: Checked) -> list[str]:
    """The metrics on which a row's error exceeds the stated accuracy."""
    spec = c.row.accept_length is not None
    return [m for m in METRICS if beyond_stated(c.error(m), m, speculative=spec)]


def explain(c: Checked, others: list[Checked], *, priced: bool = True) -> list[Mechanism]:
    """The mechanisms that could put this row's measurement where it is (none when within the stated accuracy).
    `others` are every row validated with it: those of the same machine and source check a priced mechanism.
    `priced=False` names only what the measurements themselves say (what its source left open, time it spent without
    output, another release measured at the same load): what a set of hundreds of rows, summarised by group, can
    afford."""
    metrics = beyond(c)
    if not metrics or c.simulated is None:
        return []
    said = [_assumed(c), _time_without_output(c), _other_release(c, others)]
    if not priced:
        return [m for m in said if m is not None]
    siblings = [
        o
        for o in others
        if o is not c and o.row.gpus == c.row.gpus and o.row.source == c.row.source and o.simulated is not None
    ]
    found = [
        _release(c),
        _p2p(c, metrics, siblings),
        _graphs_off(c, metrics, siblings),
        _attention_dp(c, metrics),
        _tables(c, metrics),
        _roofline_only(c, metrics),
        _host_per_request(c, metrics, siblings),
        _prefill_under_load(c, metrics, siblings),
        _first_token_host(c, metrics, siblings),
        _preemption(c),
        *said,
    ]
    return [m for m in found if m is not None]


def _slower(c: Checked, metric: str) -> bool:
    """The measurement is slower than the prediction on this metric."""
    error = c.error(metric)
    return error is not None and (error > 0 if metric == "output_tok_s" else error < 0)


def _toward(c: Checked, variant: Checked, metrics: list[str]) -> bool:
    """The variant's prediction is closer to the measurement on the metrics beyond the stated accuracy: on one at
    least, and on every one it moves (a mechanism may leave one as it was, to a part in 10^9: a host time before the
    first token leaves TPOT so)."""
    closer = False
    for m in metrics:
        before, after = c.error(m), variant.error(m)
        if before is None or after is None:
            return False
        if math.isclose(1 + after, 1 + before, rel_tol=1e-9):
            continue
        if abs(after) >= abs(before):
            return False
        closer = True
    return closer


def _metrics(c: Checked) -> dict[str, float | None]:
    return {m: c.value(m) for m in METRICS}


def _sibling_errors(siblings: list[Checked], cluster: ClusterSpec) -> dict[str, float | None]:
    return {s.row.id: check_row(s.row, cluster=cluster).error("output_tok_s") for s in siblings}


def _release(c: Checked) -> Mechanism | None:
    modelled = older_than_modelled(c.engine, c.row.engine_version)
    if modelled is None:
        return None
    return Mechanism(
        name="older release",
        why=f"measured on {c.engine} {c.row.engine_version}; the model stands for {c.engine} {modelled.release} "
        f"and later ({modelled.why}): its kernels and scheduler may differ from these",
    )


def _p2p(c: Checked, metrics: list[str], siblings: list[Checked]) -> Mechanism | None:
    """PCIe boxes: collectives with peer-to-peer transfers off go through host memory (NCCL's SHM/NET paths),
    at far higher latency; priced with the link's P2P-off figures (the box otherwise as described)."""
    cluster = c.cluster
    if cluster is None or cluster.intra.link.kind != "pcie" or not cluster.intra.p2p:
        return None
    if c.step is None or not any(op.op_class.value == "comm" for op in c.step.ops if op.time_s > 0):
        return None
    intra = {
        "link": cluster.intra.link.name,
        "p2p": False,
        "numa_nodes": cluster.intra.numa_nodes,
        "pcie_switches": cluster.intra.pcie_switches,
    }
    off = with_intra_node(cluster, f"{cluster.name} with P2P off", intra)
    variant = check_row(c.row, cluster=off)
    if variant.simulated is None or not _toward(c, variant, metrics):
        return None
    return Mechanism(
        name="P2P off",
        why="collectives between GPUs without peer-to-peer transfers (disabled, or not allowed by the host's PCIe "
        "setup) go through host memory at a far higher latency per message; the same run priced so",
        predicted=_metrics(variant),
        siblings=_sibling_errors(siblings, off),
    )


def _graphs_off(c: Checked, metrics: list[str], siblings: list[Checked]) -> Mechanism | None:
    """Eager launches: at one request a host-bound step lasts as long as its launches, so the launch cost per
    kernel that gives the measured speed is about today's times the measured slowdown; priced at that cost."""
    step, cluster, layout = c.step, c.cluster, c.layout_spec
    if step is None or cluster is None or layout is None or layout.options.cuda_graph:
        return None
    if c.row.concurrency != 1 or c.row.output_tok_s is None or not _slower(c, "output_tok_s"):
        return None
    kernels = sum(op.kernels for op in step.ops)
    host = sum(s.host_s for s in step.stages)
    if not kernels or host < sum(s.gpu_s for s in step.stages):  # GPU-bound: launches do not set its pace
        return None
    per_launch_now = host / kernels
    needed = per_launch_now * (c.value("output_tok_s") or 0) / c.row.output_tok_s
    fitted = _with(cluster, eager_kernel_cpu_s=needed)
    variant = check_row(c.row, cluster=fitted)
    if variant.simulated is None or not _toward(c, variant, metrics):
        return None
    return Mechanism(
        name="CUDA graphs off",
        why=f"every kernel is launched from Python: {kernels:,} launches per step at {per_launch_now * 1e6:.1f} µs "
        f"each cost {host * 1e3:.1f} ms of the {step.time_s * 1e3:.1f} ms step; the measured speed needs about "
        f"{needed * 1e6:.1f} µs per launch",
        predicted=_metrics(variant),
        siblings=_sibling_errors(siblings, fitted),
    )


def _attention_dp(c: Checked, metrics: list[str]) -> Mechanism | None:
    """Attention DP runs its ranks in lockstep; what that costs the host is not priced."""
    layout = c.layout_spec
    if layout is None or layout.attn_dp < 2 or c.engine != "sglang" or not any(_slower(c, m) for m in metrics):
        return None
    return Mechanism(
        name="attention DP",
        why=f"{layout.attn_dp} attention-DP ranks run every step together: before each step they all-gather their "
        "batch sizes over the scheduler's process group, and a rank without work runs an idle batch to join the "
        "MoE layers' collectives (SGLang managers/scheduler_components/dp_attn.py prepare_mlp_sync_batch_raw); "
        "the model prices the busiest rank's kernels and the collectives, not that exchange",
    )


def _tables(c: Checked, metrics: list[str]) -> Mechanism | None:
    """The kernel tables priced part of the step, and were collected on another release: the roofline instead."""
    coverage = c.coverage or {}
    if not coverage.get("tables"):
        return None
    variant = check_row(c.row, cluster=c.cluster, tables=False)
    if variant.simulated is None or not _toward(c, variant, metrics):
        return None
    measured_on = (
        f"the row ran {c.engine} {c.row.engine_version}"
        if c.row.engine_version
        else "the row's release is not recorded"
    )
    return Mechanism(
        name="kernel tables",
        why=f"{coverage['measured_share']:.0%} of the decode step comes from tables one engine release measured "
        f"({'; '.join(coverage['tables'])}; {measured_on}); priced on the roofline instead",
        predicted=_metrics(variant),
    )


def _roofline_only(c: Checked, metrics: list[str]) -> Mechanism | None:
    """No op of the step is priced from a measured table: the whole step sits at its roofline bounds, which real
    kernels reach only in part, so the prediction errs fast."""
    coverage = c.coverage or {}
    if coverage.get("measured_share", 0.0) > 0 or c.cluster is None or not any(_slower(c, m) for m in metrics):
        return None
    families = " and ".join(spec().priced)
    return Mechanism(
        name="roofline only",
        why=f"no op of this step on {c.cluster.gpu.name} under {c.engine} is priced from a measured kernel table "
        f"(tables price {families} where the package measured them): every op sits at its roofline bound (the "
        "least time its bytes and FLOPs take), which real kernels reach only in part",
    )


def _host_per_request(c: Checked, metrics: list[str], siblings: list[Checked]) -> Mechanism | None:
    """Host work that grows with the batch: scheduling, input preparation, sampling, and streaming each token to
    its client. The model has no measured figure for it (0 unless a calibration sets request_cpu_s); priced
    here as the per-request time, on a doubling grid, that brings the row closest to its measurement."""
    sim, cluster = c.simulated, c.cluster
    if sim is None or sim.peak_running < LARGE_BATCH or not any(_slower(c, m) for m in metrics):
        return None
    why = (
        f"up to {sim.peak_running:,} requests run at once per rank, and the host work per running request and "
        "per streamed token is not priced; vLLM's team measured a 57 % end-to-end gain at 1,024 concurrent "
        "requests from streaming tokens in groups instead of one by one, and about 10 % from overlapping the "
        "scheduler with the GPU (vLLM blog, 2026-02-01, gpt-oss optimizations on Blackwell)"
    )
    if cluster is None:
        return Mechanism(name="host work per request", why=why)
    # fitted to the decode metrics the row measured: host time per decode step delays first tokens only by the
    # decode steps a queued request waits out
    best = _closest_constant(c, cluster, "request_cpu_s", REQUEST_HOST_S, DECODE_METRICS, metrics)
    if best is None:
        return Mechanism(name="host work per request", why=why)
    _, value, variant = best
    return Mechanism(
        name="host work per request",
        why=why + f"; about {value * 1e6:.0f} µs of host time per running request per step would put the row here "
        "(a calibration can fit it from your own runs: request_cpu_s)",
        predicted=_metrics(variant),
        siblings=_sibling_errors(siblings, _with(cluster, request_cpu_s=value)),
    )


def _prefill_under_load(c: Checked, metrics: list[str], siblings: list[Checked]) -> Mechanism | None:
    """A load of many requests spends much of its time prefilling (a burst prefills every prompt, most of them
    while others decode): when the first tokens come later than predicted, say how much slower the prefill steps
    would have to be to put the row where it was measured, on every metric it measured together. What would
    slow them is not priced, so this names the size of the gap and where it sits, not its cause."""
    sim = c.simulated
    if sim is None or sim.peak_running < LARGE_BATCH or "ttft_ms" not in metrics or not _slower(c, "ttft_ms"):
        return None
    best = _closest(c, METRICS, metrics, PREFILL_SCALES, lambda v: check_row(c.row, cluster=c.cluster, prefill_scale=v))
    if best is None:
        return None
    worst, scale, variant = best
    return Mechanism(
        name="prefill under load",
        why=f"the predicted time to first token is {-c.error('ttft_ms'):.0%} below the measured one: prefill steps "
        f"taking about {scale:g}× their priced time bring the row closest on every metric it measured (worst error "
        f"{worst:.0%}; its running requests wait out the longer prefills too); what would make them so slow is not "
        "priced (the prefill kernels of the release measured, prefill attention on the roofline, the server taking in "
        "hundreds of requests at once)",
        predicted=_metrics(variant),
        siblings={
            s.row.id: check_row(s.row, cluster=s.cluster, prefill_scale=scale).error("output_tok_s") for s in siblings
        },
    )


def _first_token_host(c: Checked, metrics: list[str], siblings: list[Checked]) -> Mechanism | None:
    """Host time before the scheduler sees a request besides the front end's tokenising (HTTP, the hops between
    the server's processes) delays every first token by the same amount at any load. The model has no measured
    figure for it (0 unless a calibration sets first_token_host_s); priced here as the time, on a doubling grid,
    that brings the row closest on every metric it measured. Read only at a few clients, where a request waits on
    few others: under a burst or a full batch, queueing and prefill would hide in the same figure."""
    cluster, row = c.cluster, c.row
    if cluster is None or row.benchmark != "serving" or row.concurrency is None or row.concurrency > FEW_CLIENTS:
        return None
    if row.request_rate not in (None, float("inf")):  # an open loop: arrivals, not clients, set the wait
        return None
    if "ttft_ms" not in metrics or not _slower(c, "ttft_ms"):
        return None
    best = _closest_constant(c, cluster, "first_token_host_s", FIRST_TOKEN_HOST_S, METRICS, metrics)
    if best is None:
        return None
    worst, value, variant = best
    return Mechanism(
        name="host time before the first token",
        why=f"about {value * 1e3:.0f} ms per request between its send and the scheduler seeing it brings the row "
        f"closest on every metric it measured (worst error {worst:.0%}); that time (HTTP and the hops between the "
        "server's processes, beyond the tokenising priced) is not priced, differs between machines running the same "
        "image, and a "
        "calibration can fit it from your own runs (first_token_host_s)",
        predicted=_metrics(variant),
        siblings=_sibling_errors(siblings, _with(cluster, first_token_host_s=value)),
    )


def _closest_constant(
    c: Checked,
    cluster: ClusterSpec,
    name: str,
    values: tuple[float, ...],
    fitted: tuple[str, ...],
    beyond_metrics: list[str],
) -> tuple[float, float, Checked] | None:
    """`_closest` over the values of one calibration constant `name`, the rest of the cluster as it is."""
    return _closest(c, fitted, beyond_metrics, values, lambda v: check_row(c.row, cluster=_with(cluster, **{name: v})))


def _closest(
    c: Checked,
    fitted: tuple[str, ...],
    beyond_metrics: list[str],
    values: tuple[float, ...],
    predict: Callable[[float], Checked],
) -> tuple[float, float, Checked] | None:
    """(worst error on the `fitted` metrics the row measured, value, the row predicted at it) for the one of
    `values`, tried in order, that brings the row closest: the search stops once the worst error stops falling. None
    when no value is priced or the closest one does not move every metric beyond the stated accuracy toward the
    measurement."""
    measured = [m for m in fitted if c.error(m) is not None]
    best: tuple[float, float, Checked] | None = None
    for value in values:
        variant = predict(value)
        errors = [variant.error(m) for m in measured]
        if variant.simulated is None or any(e is None for e in errors):
            break
        worst = max(abs(e) for e in errors if e is not None)
        if best is not None and worst >= best[0]:
            break  # past the best value: the error only grows from here
        best = (worst, value, variant)
    if best is None or not _toward(c, best[2], beyond_metrics):
        return None
    return best


_VARIANTS: dict[tuple, tuple[ClusterSpec, ClusterSpec]] = {}


def _with(cluster: ClusterSpec, **constants: float) -> ClusterSpec:
    """The cluster with these calibration constants set, beside any it has; the same object for the same change,
    so rows priced with it share their step costs."""
    key = (id(cluster), tuple(sorted(constants.items())))
    held = _VARIANTS.get(key)
    if held is None or held[0] is not cluster:
        base = cluster.calibration.constants if cluster.calibration else {}
        fitted_on = cluster.calibration.fitted_on if cluster.calibration else ()
        variant = cluster.calibrated(
            Calibration(gpu=cluster.gpu.name, constants={**base, **constants}, fitted_on=fitted_on)
        )
        if len(_VARIANTS) >= 64:
            _VARIANTS.clear()
        held = _VARIANTS[key] = (cluster, variant)
    return held[1]


def _preemption(c: Checked) -> Mechanism | None:
    sim = c.simulated
    if sim is None or not sim.retractions:
        return None
    pool = f" of {c.kv_tokens:,} tokens" if c.kv_tokens else ""
    return Mechanism(
        name="KV preemption",
        why=f"the simulated run preempted {sim.retractions:,} requests when the KV pool{pool} filled: how the "
        "engine sizes its pool and whom it preempts decide the waits",
    )


def _assumed(c: Checked) -> Mechanism | None:
    if not c.row.assumed:
        return None
    return Mechanism(name="assumption", why=f"the source left this open and the row assumes it: {c.row.assumed}")


def _other_release(c: Checked, others: list[Checked]) -> Mechanism | None:
    """The very command of this row (its options and environment as given) run on another release of the engine, on
    the same GPUs at the same load and statistic, which the model matches within its stated accuracy and prices within
    a few per cent of this row, while the two measurements differ by more than one configuration's runs on different
    days do: the rest of this row's gap in time per token is its own release's kernels and scheduler. The model prices
    releases alike where their rules agree: its kernel tables are one release's, and where there are none the
    rooflines are every release's."""
    speculative = c.row.accept_length is not None
    measured, predicted = c.row.tpot_ms, c.value("tpot_ms")
    if (
        measured is None
        or predicted is None
        or not beyond_stated(c.error("tpot_ms"), "tpot_ms", speculative=speculative)
    ):
        return None
    alike = []
    for o in others:
        o_measured, o_predicted = o.row.tpot_ms, o.value("tpot_ms")
        if (
            o.engine != c.engine
            or o.row.engine_version == c.row.engine_version
            or (o.row.command, o.row.gpus, o.row.model, o.row.isl, o.row.osl, o.row.concurrency, o.row.latency)
            != (c.row.command, c.row.gpus, c.row.model, c.row.isl, c.row.osl, c.row.concurrency, c.row.latency)
            or o.row.accept_length != c.row.accept_length
            or o_measured is None
            or o_predicted is None
            or not math.isfinite(o_predicted)
            or abs(o_predicted / predicted - 1) > PRICED_ALIKE
            or max(measured, o_measured) / min(measured, o_measured) - 1 <= DAY_TO_DAY
            or beyond_stated(o.error("tpot_ms"), "tpot_ms", speculative=speculative)
        ):
            continue
        alike.append(o)
    if not alike:
        return None
    best = min(alike, key=lambda o: abs(o.error("tpot_ms") or 0.0))
    return Mechanism(
        name="another release",
        why=f"the same command on {c.engine} {best.row.engine_version}, on the same GPUs at the same load, measured "
        f"{best.row.tpot_ms:,.1f} ms per token ({best.row.id}; predicted {best.value('tpot_ms'):,.1f}), and on "
        f"{c.row.engine_version} {measured:,.1f} ms (predicted {predicted:,.1f}): the model prices the two alike, "
        "so what differs is this release's kernels and scheduler",
    )


def _time_without_output(c: Checked) -> Mechanism | None:
    """The measurement disagrees with itself: C clients that each wait TTFT + (n − 1) × TPOT for a request of n
    output tokens receive about C × n / (TTFT + (n − 1) × TPOT) tokens a second (Little's law, from the run's own
    latencies). A throughput well below that means part of the run's duration passed with no client receiving
    tokens, which no prediction of serving holds."""
    row, w = c.row, c.workload
    measured = (row.output_tok_s, row.ttft_ms, row.tpot_ms)
    if w is None or w.concurrency is None or w.request_rate != float("inf") or None in measured:
        return None
    n, clients = w.mean_lengths[1], w.concurrency
    expected_tok_s = clients * n / ((row.ttft_ms + (n - 1) * row.tpot_ms) / 1e3)
    served_s = w.num_requests * n / expected_tok_s  # the run's duration had it never been idle
    idle_s = w.num_requests * n / row.output_tok_s - served_s
    if idle_s - c.cold_start_s <= IDLE_SHARE / (1 - IDLE_SHARE) * served_s:
        return None
    held = f"serving and the run's cold start ({c.cold_start_s:,.1f} s)" if c.cold_start_s else "serving"
    return Mechanism(
        name="time without output",
        why=f"the run's own {row.latency} latencies give {clients} clients about {expected_tok_s:,.0f} tok/s, and "
        f"it measured {row.output_tok_s:,.0f}: about {idle_s:,.0f} s of its duration passed with no tokens to any "
        "client (a run without warm-up requests may spend its engine's first-use compilation and tuning there); "
        f"the prediction is of {held}, not of the rest",
    )
