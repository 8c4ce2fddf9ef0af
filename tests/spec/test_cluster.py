"""Cluster short forms and YAML files."""

import pytest

from shardwise import load_cluster
from shardwise.errors import ShardwiseError, SpecError


def test_default_is_the_users_pcie_box():
    cluster = load_cluster()
    assert cluster.num_gpus == 8 and cluster.nodes == 1
    assert cluster.gpu.family == "rtx-pro-6000" and cluster.gpu.memory_type.value == "GDDR7"
    assert cluster.intra.link.name == "pcie5-x16" and cluster.intra.p2p
    assert cluster.collectives is not None and cluster.collectives.name == "rtx-pro-6000-pcie5"
    assert cluster.inter is None


@pytest.mark.parametrize(
    "text, nodes, per_node, gpu, link",
    [
        ("8xrtx-pro-6000", 1, 8, "rtx-pro-6000-server", "pcie5-x16"),
        ("2x8xh100", 2, 8, "h100-sxm", "nvlink4"),
        ("4xRTX-5090", 1, 4, "rtx-5090", "pcie5-x16"),
        ("8x4090", 1, 8, "rtx-4090", "pcie4-x16"),
        ("h200", 1, 1, "h200-sxm", "nvlink4"),
        ("8xmi300x", 1, 8, "mi300x", "xgmi-mi300"),
    ],
)
def test_short_forms(text, nodes, per_node, gpu, link):
    cluster = load_cluster(text)
    assert (cluster.nodes, cluster.gpus_per_node, cluster.gpu.name, cluster.intra.link.name) == (
        nodes,
        per_node,
        gpu,
        link,
    )


def test_multi_node_short_form_assumes_one_ndr_nic_per_gpu():
    cluster = load_cluster("2x8xh100")
    assert cluster.inter is not None and cluster.inter.assumed and cluster.inter.network.name == "ib-ndr"
    assert cluster.network_bytes_per_s_per_gpu == pytest.approx(47e9)  # measured 46-48 GB/s per NDR NIC


def test_p2p_follows_the_gpu():
    assert not load_cluster("4x4090").intra.p2p  # GeForce: peer access not supported


@pytest.mark.parametrize(
    "text, message",
    [
        ("8xnotagpu", "unknown GPU"),
        ("0xh100", "zero GPUs"),
        ("8x", "unknown GPU"),
        ("8 x h100", "cannot read cluster"),
        ("1000xh100", "too large"),
        ("8xh10", "did you mean"),
        ("missing.yaml", "does not exist"),
    ],
)
def test_bad_cluster_strings(text, message):
    with pytest.raises(ShardwiseError, match=message):
        load_cluster(text)


def test_yaml_form(tmp_path):
    path = tmp_path / "box.yaml"
    path.write_text(
        "name: lab\ngpu: rtx-pro-6000-ws\ngpus_per_node: 4\nnodes: 2\n"
        "intra_node: {p2p: false, numa_nodes: 2}\ninter_node: {network: roce-400g, nics_per_node: 2}\n"
    )
    cluster = load_cluster(str(path))
    assert cluster.name == "lab" and cluster.num_gpus == 8
    assert not cluster.intra.p2p and cluster.intra.numa_nodes == 2
    assert cluster.collectives is None  # the measured box had P2P on
    assert cluster.inter is not None and not cluster.inter.assumed
    assert cluster.network_bytes_per_s_per_gpu == pytest.approx(400e9 / 8 * 2 / 4)
    assert cluster.numa_of(1) == 0 and cluster.numa_of(2) == 1 and cluster.node_of(5) == 1


@pytest.mark.parametrize(
    "content, message",
    [
        ("gpu: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "YAML mapping"),
        ("gpu: h100\n", "gpus_per_node"),
        ("gpu: h100\ngpus_per_node: 0\n", "gpus_per_node"),
        ("gpu: h100\ngpus_per_node: 8\nintra_node: {link: nvlink9}\n", "unknown link"),
        ("gpu: h100\ngpus_per_node: 8\nintra_node: {speed: 3}\n", "unknown intra_node keys"),
        ("gpu: h100\ngpus_per_node: 8\nextra: 1\n", "extra"),
    ],
)
def test_bad_cluster_files(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ShardwiseError, match=message):
        load_cluster(str(path))


def test_errors_are_shardwise_errors():
    assert issubclass(SpecError, ShardwiseError)
