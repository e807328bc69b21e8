"""Hardware presets: vendor numbers, provenance of every calibrated value, node structure, rings."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.config import list_presets

HWCONFIGS = Path(__file__).resolve().parents[1] / "hwconfigs"
CALIBRATED_GPUS = ["v100-sxm2", "a100-sxm4", "h100-sxm5", "h200-sxm", "mi210", "t4"]
CALIBRATED_NODES = ["dgx-a100", "a100-4-nvlink", "dgx1-v100", "hgx-h100", "hgx-h200", "mi210-4"]
PROVENANCE = re.compile(r"#\s*\[(spec|lit|fit|trace|assumed|measured|(carried|fit|measured|trace): [\w.-]+)\]")
CALIBRATION_KEYS = ("max_inflight_bytes", "gemm_efficiency", "vector_efficiency", "kernel_launch_ns", "dependent_launch_ns",
                    "hit_latency_ns", "latency_ns", "streaming_inflight_bytes_per_thread", "sustained_efficiency",
                    "t_rrd_cycles", "t_faw_cycles", "port_bandwidth_bytes_per_s", "nic_bandwidth_bytes_per_s",
                    "node_bandwidth_bytes_per_s", "launch_ns", "cus", "protocols", "gemm_pipeline_stages",
                    "gemm_k_tile_bytes")


@pytest.mark.parametrize("name", list_presets()["gpus"] + list_presets()["nodes"])
def test_every_preset_loads(name):
    system = gpusim.load_system(name)
    assert system.num_gpus >= 1 and system.gpu.num_cus > 0


@pytest.mark.parametrize(
    ("name", "fp16_tflops", "hbm_gb_s"),
    [
        ("v100-sxm2", 125, 900),  # V100 whitepaper: 125 TFLOPS tensor, 900 GB/s
        ("a100-sxm4", 312, 2039),  # A100 whitepaper / 80GB datasheet
        # H100 SXM5 and H200 datasheets: 989 TFLOPS dense at 1.83 GHz; the presets run GH100 at the
        # 1.98 GHz the H200 measurements found (validation/measured/h200)
        ("h100-sxm5", 989 * 1.98 / 1.83, 3350),
        ("h200-sxm", 989 * 1.98 / 1.83, 4800),
        ("mi210", 181, 1638),  # MI210 datasheet: 181 TFLOPS, 1.6 TB/s
        ("t4", 65, 320),  # T4 datasheet
    ],
)
def test_gpu_presets_reproduce_the_datasheet(name, fp16_tflops, hbm_gb_s):
    gpu = gpusim.load_system(name).gpu
    assert gpu.matrix_flops_per_s("fp16") / 1e12 == pytest.approx(fp16_tflops, rel=0.02)
    assert gpu.hbm.bandwidth_bytes_per_s / 1e9 == pytest.approx(hbm_gb_s, rel=0.02)


@pytest.mark.parametrize(("name", "int8_tops"), [
    ("v100-sxm2", 62.7),  # no int8 tensor cores: DP4A on the 64 integer lanes of 80 SMs at 1.53 GHz
    ("t4", 130),  # T4 datasheet
    ("a100-sxm4", 624),  # A100 whitepaper, dense
    ("mi100", 184.6),  # MI100 datasheet
    ("mi210", 181),  # MI210 datasheet
])
def test_int8_gemms_run_on_the_units_the_gpu_has_for_them(name, int8_tops):
    """A GPU's int8 peak, matrix or vector, is its datasheet's; a GEMM there is compute-bound at it,
    not at the FP32 lanes' rate every dtype without units of its own falls back to."""
    system = gpusim.load_system(name)
    gpu = system.gpu
    peak = max(gpu.matrix_flops_per_s("int8"), gpu.vector_flops_per_s("int8"))
    assert peak / 1e12 == pytest.approx(int8_tops, rel=0.02)
    int8, fp32 = (gpusim.run(system, ops.Gemm(4096, 4096, 4096, dtype)).time_s for dtype in ("int8", "fp32"))
    assert int8 < fp32 / 3


@pytest.mark.parametrize("name", CALIBRATED_GPUS + CALIBRATED_NODES)
def test_calibrated_values_say_where_they_come_from(name):
    kind = "gpus" if name in CALIBRATED_GPUS else "nodes"
    path = HWCONFIGS / kind / f"{name}.yaml"
    text = path.read_text()
    assert "[uncalibrated]" not in text, f"{path} still has an uncalibrated first guess"
    assert yaml.safe_load(text)["sources"], f"{path} lists no sources"
    for number, line in enumerate(text.splitlines(), 1):
        key, _, value = line.partition(":")
        key, value = key.strip().lstrip("- "), value.split("#")[0].strip()
        if key in CALIBRATION_KEYS and value and not line.lstrip().startswith("#"):
            assert PROVENANCE.search(line), f"{path}:{number}: {key} has no provenance tag ([spec], [lit], [fit]...)"


def _tagged_calibrated(path: Path) -> dict[str, str]:
    """Dotted keys of the lines tagged [calibrated: v100-sxm2] and their raw values."""
    found, stack = {}, []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, _, rest = line.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if "[calibrated: v100-sxm2]" in rest:
            found[".".join([k for _, k in stack] + [key])] = rest.split("#")[0].strip()
        if not rest.split("#")[0].strip():
            stack.append((indent, key))
    return found


def test_t3_gpu_carries_the_v100_calibration():
    t3 = gpusim.load_system("t3-table8.1").config.gpu.model_dump()
    v100 = gpusim.load_system("v100-sxm2").config.gpu.model_dump()
    tagged = _tagged_calibrated(HWCONFIGS / "gpus" / "t3-table8.1.yaml")
    assert {"gemm_efficiency.fp16", "kernel_launch_ns", "cu.max_inflight_bytes"} <= set(tagged)
    for dotted in tagged:
        mine, theirs = t3, v100
        for part in dotted.split("."):
            mine, theirs = mine[part], theirs[part]
        assert mine == theirs, f"t3-table8.1 {dotted} = {mine}, but v100-sxm2 has {theirs}"


def _differences(a: dict, b: dict, prefix: str = "") -> set[str]:
    keys = set(a) | set(b)
    found = set()
    for key in keys:
        left, right = a.get(key), b.get(key)
        if isinstance(left, dict) and isinstance(right, dict):
            found |= _differences(left, right, f"{prefix}{key}.")
        elif left != right:
            found.add(prefix + key)
    return found


def test_hgx_h200_is_the_hgx_h100_with_hbm3e_and_the_whole_l2():
    h100 = gpusim.load_system("hgx-h100").config.model_dump()
    h200 = gpusim.load_system("hgx-h200").config.model_dump()
    hbm = {f"gpu.hbm.{key}" for key in ("stacks", "clock_hz", "t_rp_cycles", "t_rcd_cycles", "t_ras_cycles",
                                         "t_cl_cycles", "t_faw_cycles", "capacity_bytes")} | {"gpu.l2.capacity_bytes"}
    identity = {"name", "description", "sources", "gpu.name", "gpu.description", "gpu.sources"}
    assert _differences(h100, h200) == hbm | identity
    assert h200["gpu"]["sources"][-1] == h100["gpu"]["sources"][-1]  # the base's sources follow the preset's own


def test_dgx_a100_structure_and_two_nodes():
    system = gpusim.load_system("dgx-a100")
    assert system.num_gpus == 8 and system.config.topology.kind == "switch"
    assert system.config.switch.port_bandwidth_bytes_per_s == pytest.approx(12 * 20e9)  # 12 NVLink3 x 20 GB/s
    two = system.with_overrides({"nodes": 2})
    assert two.num_gpus == 16
    route = two.topology.route(0, 8)
    kinds = [two.topology.graph.edges[edge]["kind"] for edge in route]
    assert kinds == ["nic", "uplink", "uplink", "nic"]  # through both nodes' shared uplinks


def test_node_presets_have_the_specified_links():
    dgx1 = gpusim.load_system("dgx1-v100").topology
    for gpu in range(8):
        links = sum(dgx1.link_capacity(gpu, other) for other in range(8) if other != gpu)
        assert links == pytest.approx(6 * 20e9)  # six NVLink2 links per GPU
    a100 = gpusim.load_system("a100-4-nvlink").topology
    assert a100.link_capacity(0, 3) == pytest.approx(4 * 20e9)  # four NVLink3 links per pair
    mi210 = gpusim.load_system("mi210-4").topology
    assert mi210.link_capacity(1, 2) == pytest.approx(50e9)  # 100 GB/s bidirectional


def _loads(rings):
    return Counter((a, b) for ring in rings for a, b in zip(ring, ring[1:] + ring[:1]))


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["mi210-4", "a100-4-nvlink", "dgx1-v100"]), st.integers(1, 30))
def test_rings_are_cycles_over_direct_links(name, count):
    topology = gpusim.load_system(name).topology
    gpus = list(range(topology.num_gpus))
    rings = topology.rings(gpus, count)
    assert len(rings) == count
    for ring in rings:
        assert sorted(ring) == gpus
        assert all(topology.link_capacity(a, b) > 0 for a, b in zip(ring, ring[1:] + ring[:1]))


@pytest.mark.parametrize("name", ["mi210-4", "a100-4-nvlink", "dgx1-v100"])
@pytest.mark.parametrize("count", [12, 24])
def test_ring_loads_are_proportional_to_link_bandwidth(name, count):
    topology = gpusim.load_system(name).topology
    gpus = list(range(topology.num_gpus))
    loads = _loads(topology.rings(gpus, count))
    links = [(a, b) for a in gpus for b in gpus if a != b and topology.link_capacity(a, b) > 0]
    shares = {edge: loads.get(edge, 0) / topology.link_capacity(*edge) for edge in links}
    assert max(shares.values()) == pytest.approx(min(shares.values()))  # every link direction equally busy


def test_fully_connected_allreduce_uses_every_link():
    system = gpusim.load_system("mi210-4")
    result = gpusim.run(system, ops.AllReduce(8 * 2**20), mode="full")
    used = result.links.groupby("link")["bytes"].sum()
    assert len(used) == 12  # all three links of every GPU, both directions
    assert used.max() < 1.5 * used.min()


def test_protocol_choice_trades_latency_for_bandwidth():
    system = gpusim.load_system("dgx-a100")
    small = gpusim.run(system, ops.AllReduce(64 * 2**10), mode="symmetric").ops["protocol"].iloc[0]
    large = gpusim.run(system, ops.AllReduce(64 * 2**20), mode="symmetric").ops["protocol"].iloc[0]
    assert small in ("ll", "ll128") and large == "simple"


def test_symmetric_mode_agrees_with_full_mode_on_dgx_a100():
    system = gpusim.load_system("dgx-a100", {"num_gpus": 4})
    op = ops.AllReduce(16 * 2**20)
    full = gpusim.run(system, op, mode="full").time_s
    symmetric = gpusim.run(system, op, mode="symmetric").time_s
    assert symmetric == pytest.approx(full, rel=0.03)
