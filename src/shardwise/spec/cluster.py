"""ClusterSpec: what the model runs on — nodes × GPUs, the link inside a node, the network between nodes.

Two ways to say it: a short form, `8xrtx-pro-6000` (one node of 8) or `2x8xh100` (2 nodes of 8), which
takes each link from the GPU's own profile; or a YAML file for anything else (NUMA split, P2P off, a given
network). Measured collective tables attach themselves when the GPU family, the link and P2P match.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import Field

from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.calibration import Calibration
from shardwise.hardware.collectives import CollectiveTables
from shardwise.hardware.load import collective_tables, load_gpu, load_link, read_yaml, validate
from shardwise.hardware.profile import GpuProfile, HourlyPrice, LinkProfile, Quantity

DEFAULT_CLUSTER = "8xrtx-pro-6000"
DEFAULT_NETWORK = "ib-ndr"  # one 400 Gb/s NIC per GPU, the usual H100/H200 build (AIC-S)
MAX_GPUS_PER_NODE = 72  # an NVL72 rack is the largest single NVLink domain sold
MAX_NODES = 4096  # a sanity bound on input (larger clusters are typos), not a physical limit
_SHORT = re.compile(r"^(?:(\d+)x)?(?:(\d+)x)?([a-z0-9][a-z0-9.\-]*)$")


class IntraNode(Frozen):
    link: LinkProfile
    p2p: bool = Field(description="GPUs reach each other's memory directly (PCIe P2P, NVLink)")
    numa_nodes: int = Field(1, ge=1, description="CPU sockets the GPUs are split across (PCIe boxes)")
    pcie_switches: int = Field(0, ge=0, description="PCIe switches the GPUs hang off (0: CPU root ports)")


class InterNode(Frozen):
    network: LinkProfile
    nics_per_node: int = Field(ge=1)
    assumed: bool = Field(False, description="chosen by default, not given by the user")


class ClusterSpec(Frozen):
    name: str
    nodes: int = Field(ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    gpu: GpuProfile
    intra: IntraNode
    inter: InterNode | None = None
    collectives: CollectiveTables | None = Field(None, description="measured tables of a matching box")
    calibration: Calibration | None = Field(None, description="constants fitted to this machine's measurements")

    def calibrated(self, calibration: Calibration | None) -> ClusterSpec:
        """The same cluster with `calibration` applied; a profile of another GPU is one clear error."""
        if calibration is not None and calibration.gpu != self.gpu.name:
            raise SpecError(
                f"the calibration profile was fitted on {calibration.gpu}, not on {self.gpu.name}; "
                "calibrate on this machine's measurements"
            )
        return self.model_copy(update={"calibration": calibration})

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def network_bytes_per_s_per_gpu(self) -> float | None:
        """Inter-node bandwidth one GPU gets, one direction."""
        if self.inter is None:
            return None
        per_nic = self.inter.network.bandwidth_bytes_per_s
        return per_nic * self.inter.nics_per_node / self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return _place(gpu, self.gpus_per_node, self._per_numa())[0]

    def numa_of(self, gpu: int) -> int:
        return _place(gpu, self.gpus_per_node, self._per_numa())[1]

    def span(self, gpus: Sequence[int]) -> Span:
        """How a group of GPUs lies on the cluster: how many, whether they span nodes, whether they span a node's
        CPU sockets. All the link model reads of a group (cost/comm.py): groups with one span cost the same."""
        per_node, per_numa = self.gpus_per_node, self._per_numa()
        places = {_place(g, per_node, per_numa) for g in gpus}
        nodes, sockets = {node for node, _ in places}, {numa for _, numa in places}
        return Span(len(gpus), len(nodes) > 1, len(sockets) > 1)

    def _per_numa(self) -> int:
        return max(1, self.gpus_per_node // self.intra.numa_nodes)


def _place(gpu: int, per_node: int, per_numa: int) -> tuple[int, int]:
    """(the node of `gpu`, its CPU socket within the node)."""
    return gpu // per_node, (gpu % per_node) // per_numa


class Span(NamedTuple):
    gpus: int
    across_nodes: bool
    across_sockets: bool


class ClusterFile(Frozen):
    """The YAML form, before names are resolved."""

    name: str | None = None
    gpu: str
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    intra_node: dict[str, Any] = Field(default_factory=dict)
    inter_node: dict[str, Any] | None = None
    # this box's own figures instead of the catalog's: what one GPU-hour costs (USD) and each GPU's power limit (W)
    gpu_hour_usd: float | None = Field(None, gt=0, allow_inf_nan=False)
    gpu_power_w: float | None = Field(None, gt=0, allow_inf_nan=False)


def _matching_tables(gpu: GpuProfile, intra: IntraNode) -> CollectiveTables | None:
    for tables in collective_tables():
        match = tables.applies_to
        if match.gpu_family == gpu.family and match.link == intra.link.name and match.p2p == intra.p2p:
            return tables
    return None


def build_cluster(
    *,
    name: str,
    gpu: str,
    nodes: int,
    gpus_per_node: int,
    intra_node: dict[str, Any] | None = None,
    inter_node: dict[str, Any] | None = None,
    gpu_hour_usd: float | None = None,
    gpu_power_w: float | None = None,
) -> ClusterSpec:
    """Resolve GPU and link names into a ClusterSpec, taking unstated links from the GPU's profile; `gpu_hour_usd`
    and `gpu_power_w` replace the catalog's price and TDP with the box's own."""
    profile = load_gpu(gpu)
    own = f"cluster {name}"
    if gpu_hour_usd is not None:
        price = HourlyPrice(usd=gpu_hour_usd, low_usd=gpu_hour_usd, high_usd=gpu_hour_usd, source=own, date="given")
        profile = profile.model_copy(update={"price_per_hour": price})
    if gpu_power_w is not None:
        profile = profile.model_copy(update={"tdp": Quantity(value=gpu_power_w, unit="W", source=own)})
    intra_node = dict(intra_node or {})
    default_link = profile.gpu_link.value if profile.has_gpu_link else profile.host_link.value
    unknown = set(intra_node) - {"link", "p2p", "numa_nodes", "pcie_switches"}
    if unknown:
        raise SpecError(f"unknown intra_node keys {sorted(unknown)}; use link, p2p, numa_nodes, pcie_switches")
    intra = validate(
        IntraNode,
        {
            "link": load_link(str(intra_node.pop("link", default_link))),
            "p2p": intra_node.pop("p2p", profile.p2p.value),
            **intra_node,
        },
        origin=f"cluster {name} intra_node",
    )
    inter = None
    if nodes > 1 or inter_node:
        given = dict(inter_node or {})
        network = load_link(str(given.pop("network", DEFAULT_NETWORK)))
        inter = validate(
            InterNode,
            {
                "network": network,
                "nics_per_node": given.pop("nics_per_node", gpus_per_node),
                "assumed": inter_node is None,
                **given,
            },
            origin=f"cluster {name} inter_node",
        )
    return validate(
        ClusterSpec,
        {
            "name": name,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "gpu": profile,
            "intra": intra,
            "inter": inter,
            "collectives": _matching_tables(profile, intra),
        },
        origin=f"cluster {name}",
    )


def with_intra_node(cluster: ClusterSpec, name: str, intra_node: dict[str, Any]) -> ClusterSpec:
    """`cluster` with other links inside each node (`build_cluster`'s intra_node), named `name`: its measured
    collective tables matched to them again, its network and calibration kept."""
    rebuilt = build_cluster(
        name=name, gpu=cluster.gpu.name, nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node, intra_node=intra_node
    )
    return rebuilt.model_copy(update={"inter": cluster.inter, "calibration": cluster.calibration})


def parse_short(text: str) -> ClusterSpec:
    """`8xrtx-pro-6000` → 1 node × 8; `2x8xh100` → 2 nodes × 8; `h200` → 1 × 1."""
    match = _SHORT.match(text.strip().lower())
    if match is None:
        raise SpecError(
            f"cannot read cluster {text!r}; write GPUSxNAME (8xrtx-pro-6000), NODESxGPUSxNAME "
            "(2x8xh100) or a cluster YAML file"
        )
    first, second, gpu = match.groups()
    nodes, per_node = (int(first), int(second)) if second else (1, int(first or 1))
    if nodes < 1 or per_node < 1:
        raise SpecError(f"cluster {text!r} has zero GPUs or nodes; counts start at 1")
    if per_node > MAX_GPUS_PER_NODE or nodes > MAX_NODES:
        raise SpecError(
            f"cluster {text!r} is too large: at most {MAX_GPUS_PER_NODE} GPUs per node and {MAX_NODES} nodes"
        )
    return build_cluster(name=text.strip().lower(), gpu=gpu, nodes=nodes, gpus_per_node=per_node)


def _bundled(name: str) -> Path | None:
    path = Path(str(resources.files("shardwise") / "data" / "clusters" / f"{name}.yaml"))
    return path if path.is_file() else None


def load_cluster(ref: str = DEFAULT_CLUSTER) -> ClusterSpec:
    """A cluster from a YAML file, a bundled cluster name, or the short form."""
    path = Path(ref).expanduser()
    if not path.is_file():
        path = _bundled(ref.strip().lower()) or path
    if not path.is_file():
        if ref.endswith((".yaml", ".yml")):
            raise SpecError(f"cluster file {ref} does not exist")
        return parse_short(ref)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise SpecError(
            f"{path} must hold a YAML mapping with gpu, gpus_per_node and optionally nodes, intra_node, inter_node"
        )
    spec = validate(ClusterFile, raw, origin=str(path))
    return build_cluster(
        name=spec.name or path.stem,
        gpu=spec.gpu,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        intra_node=spec.intra_node,
        inter_node=spec.inter_node,
        gpu_hour_usd=spec.gpu_hour_usd,
        gpu_power_w=spec.gpu_power_w,
    )
