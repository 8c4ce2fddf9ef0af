"""Collective times against the published measurements they come from, and the α–β model by hand."""

import pytest

from shardwise import Collective, collective_cost, load_cluster

AR, AG, A2A, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.ALL_TO_ALL, Collective.REDUCE_SCATTER
MiB = 2**20


@pytest.fixture(scope="module")
def pcie_box():
    return load_cluster("8xrtx-pro-6000")


def test_measured_points_are_reproduced(pcie_box):
    # nccl-tests on 8x RTX PRO 6000 SE (AIC-NCCL): 8-GPU all_reduce 512 B in 24.6 µs; 1 MiB at 14.0 GB/s busbw
    assert collective_cost(pcie_box, AR, size_bytes=512, gpus=8).time_s == pytest.approx(24.6e-6)
    one_mib = collective_cost(pcie_box, AR, size_bytes=MiB, gpus=8)
    assert one_mib.time_s == pytest.approx(MiB * (2 * 7 / 8) / 14.0e9)  # 131.1 µs
    assert one_mib.method == "measured" and one_mib.bandwidth_bytes_per_s == pytest.approx(14.0e9)
    # custom all-reduce, TP8, 16 KiB: 27.5 µs (AIC-CAR, vLLM 0.24.0)
    assert collective_cost(pcie_box, AR, size_bytes=16 * 2**10, gpus=8, impl="custom").time_s == pytest.approx(27.5e-6)


def test_small_tp8_all_reduce_is_latency_bound(pcie_box):
    # one decode token's hidden state, 7168 × 2 B: ≈ 25 µs, nearly all latency
    cost = collective_cost(pcie_box, AR, size_bytes=7168 * 2, gpus=8)
    assert 24.6e-6 <= cost.time_s <= 27e-6


def test_between_and_beyond_points(pcie_box):
    small, mid, big = (collective_cost(pcie_box, AR, size_bytes=s, gpus=8).time_s for s in (512, 8 * MiB, 16 * MiB))
    assert small < mid < big
    # past the largest point (256 MiB at 20.3 GB/s) time grows at the best bus bandwidth, 24.7 GB/s
    t256 = 256 * MiB * 1.75 / 20.3e9
    t512 = collective_cost(pcie_box, AR, size_bytes=512 * MiB, gpus=8).time_s
    assert t512 == pytest.approx(t256 + 256 * MiB * 1.75 / 24.7e9)
    # below the smallest point, time does not shrink under the measured latency
    assert collective_cost(pcie_box, AR, size_bytes=8, gpus=8).time_s == pytest.approx(24.6e-6)


def test_reduce_scatter_uses_all_gather_curve(pcie_box):
    assert (
        collective_cost(pcie_box, RS, size_bytes=MiB, gpus=8).time_s
        == collective_cost(pcie_box, AG, size_bytes=MiB, gpus=8).time_s
    )


def test_unmeasured_group_uses_box_latency_and_link_bandwidth(pcie_box):
    # all_gather on 2 GPUs was not measured: latency of the fastest measured 2-GPU collective (alltoall 6.2 µs)
    # plus size × (n−1)/n over the measured all-reduce bus bandwidth of PCIe 5 (24.7 GB/s)
    cost = collective_cost(pcie_box, AG, size_bytes=MiB, gpus=2)
    assert cost.method == "alpha-beta"
    assert cost.time_s == pytest.approx(6.2e-6 + MiB * 0.5 / 24.7e9)


def test_alpha_beta_across_nodes():
    cluster = load_cluster("2x8xh100")
    cost = collective_cost(cluster, AR, size_bytes=16 * MiB, gpus=16)
    # ring over 16 GPUs: 30 steps × 1.59 µs (NDR) + size × 30/16 over min(NVLink 445, NDR 47 GB/s)
    assert cost.time_s == pytest.approx(30 * 1.59e-6 + 16 * MiB * 30 / 16 / 47e9)
    assert "ib-ndr" in cost.source


def test_p2p_off_pays_the_host_round_trip():
    on = collective_cost(load_cluster("2xrtx-pro-6000"), AR, size_bytes=1024, gpus=2)
    off = collective_cost(load_cluster("2x5090"), AR, size_bytes=1024, gpus=2)
    assert off.time_s == pytest.approx(2 * 14e-6 + 1024 / 24.7e9)  # 2 steps × 14 µs P2P-off latency
    assert on.time_s < off.time_s


def test_send_recv_uses_point_to_point_bandwidth(pcie_box):
    # not measured on the box: the box's 2-GPU latency (6.2 µs) plus size over PCIe 5 P2P (53 GB/s measured)
    cost = collective_cost(pcie_box, Collective.SEND_RECV, size_bytes=64 * MiB, gpus=[0, 1])
    assert cost.time_s == pytest.approx(6.2e-6 + 64 * MiB / 53e9)


def test_trivial_and_bad_groups(pcie_box):
    assert collective_cost(pcie_box, AR, size_bytes=MiB, gpus=1).time_s == 0
    with pytest.raises(ValueError):
        collective_cost(pcie_box, AR, size_bytes=MiB, gpus=[0, 0])
    with pytest.raises(ValueError):
        collective_cost(pcie_box, AR, size_bytes=MiB, gpus=9)


def test_a_collective_costs_the_same_on_every_group_with_the_same_span():
    """Step costs share one collective's time between every group that spans the cluster alike (how many GPUs,
    whether across nodes, whether across a node's CPU sockets): the link model must read nothing else of a group.
    Checked on every group of 2, 4 and 8 GPUs drawn by stride on a PCIe box split over two sockets and on two NVLink
    nodes."""
    from shardwise import Collective as C

    box = load_cluster("8xrtx-pro-6000")
    two_sockets = box.model_copy(update={"intra": box.intra.model_copy(update={"numa_nodes": 2})})
    for cluster in (two_sockets, load_cluster("2x8xh100")):
        groups = {tuple(range(start, start + n * stride, stride))
                  for n in (2, 4, 8) for stride in (1, 2, 3, 4) for start in range(cluster.num_gpus)
                  if start + (n - 1) * stride < cluster.num_gpus}  # fmt: skip
        by_span: dict = {}
        for g in groups:
            by_span.setdefault(cluster.span(g), []).append(g)
        for span, same in by_span.items():
            for op in (C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.ALL_TO_ALL, C.SEND_RECV):
                for size in (512, MiB, 64 * MiB):
                    for impl in ("nccl", "custom"):
                        times = {collective_cost(cluster, op, size_bytes=size, gpus=g, impl=impl).time_s for g in same}
                        assert len(times) == 1, (cluster.name, span, op, size, impl)
    nodes = load_cluster("2x8xh100")
    inside, across = (collective_cost(nodes, AR, size_bytes=64 * MiB, gpus=g).time_s for g in ((0, 1), (0, 8)))
    assert inside < across  # the span is not all alike: crossing nodes is slower


def test_custom_all_reduce_on_nvlink_and_nccl_past_its_largest_input():
    """8× B200: one decode token's hidden state (14 KiB) through the engines' custom all-reduce, linear between the
    measured 2 KiB (4.8 µs) and 16 KiB (5.3 µs) points (AIC-CAR, SGLang 0.5.14), against NCCL's 25.1 µs; past 8 MiB
    the engines hand the input to NCCL (custom_all_reduce.py max_size 8192 × 1024), so the NCCL curve prices it."""
    box = load_cluster("8xb200")
    token = collective_cost(box, AR, size_bytes=14 * 2**10, gpus=8, impl="custom")
    assert token.impl == "custom" and token.time_s == pytest.approx(4.8e-6 + 12 / 14 * 0.5e-6)
    nccl = 25.1e-6 + (14 * 2**10 - 512) * 1.75 / 704e9  # its 512 B point, then its best bus bandwidth
    assert collective_cost(box, AR, size_bytes=14 * 2**10, gpus=8).time_s == pytest.approx(nccl)
    at_limit = collective_cost(box, AR, size_bytes=8 * MiB, gpus=8, impl="custom")
    past = collective_cost(box, AR, size_bytes=8 * MiB + 2, gpus=8, impl="custom")
    assert at_limit.impl == "custom" and at_limit.time_s == pytest.approx(36.2e-6)
    assert past.impl == "nccl" and past.time_s == pytest.approx(
        collective_cost(box, AR, size_bytes=8 * MiB + 2, gpus=8).time_s
    )
