"""Data contract: every hardware figure has a unit of the right kind and a source that is listed."""

import datetime

import pytest

from shardwise.hardware.load import collective_tables, gpus, links, overheads, power_facts, runtime, sources
from shardwise.hardware.profile import Fact, Quantity

DIMENSIONS = {
    "memory": "bytes",
    "memory_visible": "bytes",
    "mem_bandwidth": "bytes_per_s",
    "mem_bandwidth_measured": "bytes_per_s",
    "tdp": "W",
    "l2_cache": "bytes",
    "sm_count": "count",
    "bandwidth": "bytes_per_s",
    "bandwidth_measured": "bytes_per_s",
    "cross_numa_bandwidth": "bytes_per_s",
    "collective_busbw": "bytes_per_s",
    "latency": "s",
    "collective_step_latency": "s",
    "p2p_off_latency": "s",
    "tensor_dense": "flop_per_s",
    "gemm_measured": "flop_per_s",
    "non_torch_single_gpu": "bytes",
    "non_torch_multi_gpu": "bytes",
    "deepep_buffers": "bytes",
    "vlm_cache": "bytes",
    "eager_kernel_cpu": "s",
    "eager_prefill_kernel_cpu": "s",
    "kernel_gpu": "s",
    "graph_launch_cpu": "s",
    "scheduler_step_cpu": "s",
    "speculative_step_cpu": "s",
    "tokenize_cpu_per_prose_token": "s",
    "tokenize_cpu_per_random_token": "s",
    "host_per_gpu": "W",
}


def _figures(profile):
    for field, value in profile:
        yield from _within(field, field, value)


def _within(where, field, value):
    """The figures of one field, however deep its tables nest them (by dtype; by engine, then model family)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _within(f"{where}.{key}", field, item)
    elif isinstance(value, (Quantity, Fact)):
        yield where, field, value


def _all_figures():
    for profile in [*gpus().values(), *links().values(), runtime(), overheads(), power_facts()]:
        for where, field, figure in _figures(profile):
            yield f"{profile.name}.{where}", field, figure


@pytest.mark.parametrize("where, field, figure", list(_all_figures()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_figure_has_a_listed_source_and_a_sound_unit(where, field, figure):
    key = figure.source.split()[0]
    assert key in sources(), f"{where}: source key {key!r} is not in sources.yaml"
    if key == "ASSUMED":
        assert figure.uncertain, f"{where}: an assumption must be marked uncertain"
    if isinstance(figure, Quantity):
        assert figure.si(DIMENSIONS[field]) > 0, where


def test_catalog_covers_the_required_gpus():
    required = {
        "rtx-pro-6000-workstation",
        "rtx-pro-6000-server",
        "h100-sxm",
        "h100-pcie",
        "h200-sxm",
        "b200",
        "b300",
        "gb200",
        "a100-sxm",
        "a100-pcie",
        "l40s",
        "l4",
        "rtx-4090",
        "rtx-5090",
        "mi300x",
        "mi325x",
        "mi355x",
    }
    assert required <= set(gpus())


@pytest.mark.parametrize("gpu", list(gpus().values()), ids=lambda g: g.name)
def test_gpu_figures_are_consistent(gpu):
    if gpu.memory_visible:  # the driver shows a little less than the part holds
        assert 0.9 * gpu.memory.si("bytes") <= gpu.memory_visible.si("bytes") <= gpu.memory.si("bytes")
    if gpu.mem_bandwidth_measured:
        assert gpu.mem_bandwidth_measured_bytes_per_s < gpu.mem_bandwidth_bytes_per_s
    for dtype, measured in gpu.gemm_measured.items():
        assert measured.si("flop_per_s") <= gpu.dense_flops_per_s(dtype), dtype
    assert gpu.host_link.value in links()
    assert gpu.gpu_link.value == "none" or gpu.gpu_link.value in links()
    assert gpu.name not in gpu.aliases


@pytest.mark.parametrize("gpu", [g for g in gpus().values() if g.price_per_hour], ids=lambda g: g.name)
def test_each_price_names_its_sources_and_sits_in_its_published_range(gpu):
    price = gpu.price_per_hour
    for key in price.source.split(" and "):
        assert key in sources(), f"{gpu.name}: price source {key!r} is not in sources.yaml"
    assert price.low_usd <= price.usd <= price.high_usd
    assert datetime.date.fromisoformat(price.date) <= datetime.date(2026, 12, 31)


def test_aliases_are_unique():
    names = [n for g in gpus().values() for n in (g.name, *g.aliases)]
    assert len(names) == len(set(names))


def test_collective_tables_refer_to_known_things():
    families = {g.family for g in gpus().values()}
    for tables in collective_tables():
        assert tables.applies_to.gpu_family in families
        assert tables.applies_to.link in links()
        assert tables.source.split()[0] in sources()
        for curve in tables.tables:
            pairs = curve.measured()
            assert [t for _, t in pairs] == sorted(t for _, t in pairs), "time must grow with size"
