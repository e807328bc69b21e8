"""Loading presets, overrides, and clear errors for bad configurations."""

import re
import textwrap
import warnings
from copy import deepcopy
from pathlib import Path

import pytest
import yaml

import gpusim
from gpusim.config import load_system_config
from gpusim.config.loader import list_presets, override_field
from gpusim.config.quantities import UNIT_SUFFIXES
from gpusim.errors import ConfigError, NoEffectWarning, UnknownPresetError

REPO = Path(__file__).resolve().parents[1]


def test_t3_table_8_1_numbers():
    system = gpusim.load_system("t3-ring8")
    gpu = system.gpu
    assert system.num_gpus == 8
    assert gpu.num_cus == 80
    assert gpu.clock_hz == 1.4e9
    assert gpu.l2.capacity_bytes == 16 * 2**20
    assert gpu.hbm.bandwidth_bytes_per_s == pytest.approx(1.024e12)
    assert system.config.links.bandwidth_bytes_per_s == 75e9
    assert system.config.links.latency_ns == 500


def test_overrides_with_aliases():
    system = gpusim.load_system("t3-ring8", {"gpu.num_cus": 160, "links.bandwidth": "300 GB/s"})
    assert system.gpu.num_cus == 160
    assert system.config.links.bandwidth_bytes_per_s == 300e9
    assert system.with_overrides({"gpu.num_cus": 40}).gpu.num_cus == 40
    with pytest.raises(ConfigError, match="'gpu.num_cus'.*less than or equal to 16384"):
        system.with_overrides({"gpu.num_cus": 10**9})  # would exhaust the simulator's memory


@pytest.mark.parametrize(("preset", "path", "value", "reason"), [
    ("t3-ring8", "switch.port_bandwidth", "1 GB/s", r"its topology is ring of 8 GPU\(s\), without a switch"),
    ("dgx-a100", "links.bandwidth", "1 GB/s", r"its GPUs reach each other through the switch's ports \(switch\.\*\)"),
    ("h100-sxm5", "links.bandwidth", "1 GB/s", "it has one GPU"),
    ("h100-sxm5", "topology.kind", "ring", "it has one GPU"),
])
def test_an_override_the_system_does_not_use_is_a_warning(preset, path, value, reason):
    """A what-if value that nothing reads would otherwise look like a result."""
    with pytest.warns(NoEffectWarning, match=rf"override '{path}': {preset} does not use .*: {reason}; the value "
                                             "changes nothing"):
        load_system_config(preset, {path: value})


@pytest.mark.parametrize(("preset", "overrides"), [
    ("dgx-a100", {"switch.port_bandwidth": "100 GB/s", "links.credit_bytes": "256 KiB"}),  # its routes take both
    ("dgx-a100", {"topology.kind": "ring", "links.bandwidth": "100 GB/s"}),
    ("t3-ring8", {"nodes": 2, "network.nic_bandwidth": "25 GB/s", "links.bandwidth": "150 GB/s"}),
])
def test_an_override_the_system_uses_is_no_warning(preset, overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        load_system_config(preset, overrides)


def test_two_overrides_of_one_field_are_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"override 'links.bandwidth_bytes_per_s': field 'links.bandwidth_bytes_per_s' "
                                          r"is set by override 'links.bandwidth' too; give it once"):
        load_system_config("t3-ring8", {"links.bandwidth": "300 GB/s", "links.bandwidth_bytes_per_s": 1e11})


def test_a_system_of_more_gpus_than_can_be_simulated_is_an_error_not_a_memory_error():
    with pytest.raises(ConfigError, match=r"override 'num_gpus': field 'num_gpus': .*less than or equal to 1024"):
        load_system_config("a100-4-nvlink", {"num_gpus": 100_000})  # its links alone would fill the memory
    with pytest.raises(ConfigError, match=r"override 'nodes'.*: 513 nodes of 8 GPUs are 4104 GPUs; at most 4096 are "
                                          r"simulated \(fields 'nodes' and 'num_gpus'\)"):
        load_system_config("dgx-a100", {"nodes": 513})
    assert load_system_config("dgx-a100", {"nodes": 512}).total_gpus == 4096


@pytest.mark.parametrize(("topology", "message"), [
    ("{kind: custom, edges: [[0, 0]]}", r"edge \[0, 0\] links GPU 0 to itself"),
    ("{kind: custom, edges: [[0, 1, 0]]}", r"edge \[0, 1, 0\]: its number of links must be at least 1, got 0"),
    ("{kind: custom, edges: [[0, 1, -2]]}", r"edge \[0, 1, -2\]: its number of links must be at least 1, got -2"),
    ("{kind: custom, edges: [[0, 1], [1, 0, 2]]}", r"edges \[0, 1\] and \[1, 0, 2\] link the same GPUs; give each pair once"),
    ("{kind: ring, edges: [[0, 1]]}", r"'edges' describe a custom topology; a ring topology makes its own links"),
])
def test_a_custom_topology_links_distinct_pairs_of_gpus(tmp_path, topology, message):
    path = tmp_path / "node.yaml"
    path.write_text(f"base: a100-4-nvlink\ntopology: {topology}\n")
    with pytest.raises(ConfigError, match=rf"node.yaml: field 'topology': {message}"):
        load_system_config(path)


@pytest.mark.parametrize("path", ["name", "gpu.name", "collectives.protocols"])
def test_a_name_may_not_be_blank(path):
    value = "[{name: ' ', step_latency_ns: 1 us}]" if path == "collectives.protocols" else " "
    with pytest.raises(ConfigError, match=rf"override '{path}': field '{path}(.0.name)?': expected a name, got ' '$"):
        load_system_config("dgx-a100", {path: value})


def test_a_blank_name_in_a_gpu_file_is_one_error(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("base: a100-sxm4\nname: ''\n")
    with pytest.raises(ConfigError) as info:
        load_system_config(path)
    assert str(info.value) == f"{path}: field 'name': expected a name, got ''"  # not once for the GPU, once for its system


def test_with_overrides_replaces_a_field_however_it_was_spelled():
    system = gpusim.load_system("t3-ring8", {"links.bandwidth": "75 GB/s", "gpu.num_cus": 40})
    changed = system.with_overrides({"links.bandwidth_bytes_per_s": 3e11})
    assert changed.config.links.bandwidth_bytes_per_s == 3e11 and changed.gpu.num_cus == 40
    assert changed.overrides == {"gpu.num_cus": 40, "links.bandwidth_bytes_per_s": 3e11}
    with pytest.raises(ConfigError, match=r"override 5: paths must be dotted strings such as 'gpu.num_cus'"):
        system.with_overrides({5: 1})


@pytest.mark.parametrize(("text", "line"), [
    ("base: a100-sxm4\nl2: {capcity_bytes: 32 MiB}\n", "field 'l2.capcity_bytes': unknown field (did you mean 'capacity_bytes'?)"),
    ("base: a100-4-nvlink\nlinks: {bandwith: 50 GB/s}\n", "field 'links.bandwith': unknown field (did you mean "
                                                         "'bandwidth_bytes_per_s'?)"),
    ("base: a100-4-nvlink\ncollectives: {protocols: [{name: ll, step_latency_ns: 1 us, wire_eff: 0.5}]}\n",
     "field 'collectives.protocols.0.wire_eff': unknown field (did you mean 'wire_efficiency'?)"),
    ("base: a100-4-nvlink\nlinks: {zzz: 1}\n", "field 'links.zzz': unknown field; known fields: bandwidth_bytes_per_s, "
                                               "credit_bytes, latency_ns, packet_bytes"),
])
def test_an_unknown_field_in_a_file_says_what_was_meant_or_what_is_known(tmp_path, text, line):
    path = tmp_path / "what-if.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_system_config(path)
    assert f"{path}: {line}" in str(info.value).splitlines()


@pytest.mark.parametrize(("line", "got"), [("name: 1234", "1234"), ("description: yes", "True")])
def test_text_that_yaml_reads_as_a_number_or_a_boolean_is_to_be_quoted(tmp_path, line, got):
    path = tmp_path / "gpu.yaml"
    path.write_text(f"base: a100-sxm4\n{line}\n")
    field = line.split(":")[0]
    with pytest.raises(ConfigError, match=rf"gpu.yaml: field '{field}': Input should be a valid string \(got {got}\); "
                                          r"YAML reads it as a number or a boolean: quote the text$"):
        load_system_config(path)
    with pytest.raises(ConfigError, match=r"field 'sources.0': Input should be a valid string \(got 5\)$"):
        load_system_config("a100-sxm4", {"sources": [5]})  # no YAML involved: no advice about it


def test_override_field_names_the_field_and_its_resolved_value():
    overrides = {"links.bandwidth": "300 GB/s", "gpu.gemm_efficiency.fp16": 0.5, "gpu.clock": "1 GHz"}
    config = load_system_config("t3-ring8", overrides)
    fields = dict(override_field(config, path, value) for path, value in overrides.items())
    assert fields == {"links.bandwidth_bytes_per_s": 300e9, "gpu.gemm_efficiency.fp16": 0.5, "gpu.clock_hz": 1e9}
    assert override_field(config, "gpu.hbm", None)[1]["stacks"] == config.gpu.hbm.stacks  # a section as data
    with pytest.raises(ConfigError, match="gpu has no field 'clocks'"):
        override_field(config, "gpu.clocks", "1 GHz")


def test_unknown_preset_lists_known():
    with pytest.raises(UnknownPresetError) as info:
        gpusim.load_system("no-such-gpu")
    assert "t3-ring8" in str(info.value)
    assert "known presets" in str(info.value)


def test_unitless_bandwidth_override_is_an_error():
    with pytest.raises(ConfigError, match="links.bandwidth.*unit"):
        gpusim.load_system("t3-ring8", {"links.bandwidth": 300})


def test_a_wrong_unit_in_a_file_quotes_the_value_once(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text("base: t3-ring8\nlinks: {bandwidth_bytes_per_s: 75 GHz}\n")
    with pytest.raises(ConfigError) as info:
        gpusim.load_system(path)
    assert "unknown bandwidth unit 'GHz' in '75 GHz'" in str(info.value)
    assert str(info.value).count("75 GHz") == 1


def test_a_file_may_drop_a_unit_suffix_as_an_override_may(tmp_path):
    """``links.bandwidth: 300 GB/s`` in a file is ``links.bandwidth_bytes_per_s``, in a node's own
    sections, its inline GPU and a GPU's file alike; the value must then say its unit."""
    node = tmp_path / "node.yaml"
    node.write_text("base: t3-ring8\nlinks: {bandwidth: 300 GB/s, latency: 1 us}\ngpu: {clock: 1.5 GHz}\n")
    system = gpusim.load_system(node)
    assert (system.config.links.bandwidth_bytes_per_s, system.config.links.latency_ns) == (300e9, 1000)
    assert system.gpu.clock_hz == 1.5e9
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("base: t3-table8.1\ndma: {setup: 0 ns}\n")
    assert gpusim.load_system(gpu).gpu.dma.setup_ns == 0
    node.write_text("base: t3-ring8\nlinks: {bandwidth: 300}\n")
    with pytest.raises(ConfigError, match=r"node.yaml: field 'links.bandwidth' \(for 'bandwidth_bytes_per_s'\): "
                                          r"expected a bandwidth with a unit"):
        gpusim.load_system(node)
    node.write_text("base: t3-ring8\nlinks: {bandwidth: 300 GB/s, bandwidth_bytes_per_s: 300 GB/s}\n")
    with pytest.raises(ConfigError, match=r"field 'links.bandwidth': gives the field 'bandwidth_bytes_per_s' that "
                                          r"'links.bandwidth_bytes_per_s' gives too; give it once"):
        gpusim.load_system(node)


def unit_suffixes_dropped(node):
    """A description with every key whose value says its unit (``75 GB/s``) written without its suffix."""
    if isinstance(node, list):
        return [unit_suffixes_dropped(item) for item in node]
    if not isinstance(node, dict):
        return node
    dropped = {}
    for key, value in node.items():
        suffix = next((s for s in UNIT_SUFFIXES if key.endswith(s)), None)
        says_unit = isinstance(value, str) and any(c.isalpha() for c in value)
        dropped[key.removesuffix(suffix) if suffix and says_unit else key] = unit_suffixes_dropped(value)
    return dropped


@pytest.mark.parametrize("kind", ["gpus", "nodes"])
def test_every_preset_loads_the_same_with_its_unit_suffixes_dropped(tmp_path, kind):
    changed = []
    for name in list_presets()[kind]:
        written = yaml.safe_load((REPO / "hwconfigs" / kind / f"{name}.yaml").read_text())
        rewritten = unit_suffixes_dropped(written)
        if rewritten != written:  # a derived preset (hgx-h200) may give no value with a unit
            changed.append(name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(rewritten))
        assert load_system_config(path).model_dump() == load_system_config(name).model_dump(), name
    assert len(changed) >= len(list_presets()[kind]) - 2, changed


def test_negative_bandwidth_is_an_error():
    with pytest.raises(ConfigError, match="links.bandwidth_bytes_per_s.*greater than 0"):
        gpusim.load_system("t3-ring8", {"links.bandwidth_bytes_per_s": "-3 GB/s"})


def test_misspelled_override_names_field():
    with pytest.raises(ConfigError, match=r"override 'gpu.num_cu': gpu has no field 'num_cu' \(did you mean "
                                          r"'num_cus'\?\); known fields: clock_hz, cu, "):
        gpusim.load_system("t3-ring8", {"gpu.num_cu": 3})
    with pytest.raises(ConfigError, match=r"links has no field 'zzz'; known fields: bandwidth_bytes_per_s, "):
        gpusim.load_system("t3-ring8", {"links.zzz": 3})


def test_misspelled_key_in_file_names_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent(
            """
            name: bad
            gpu: t3-table8.1
            num_gpus: 2
            topology: {kind: ring}
            links: {bandwith_bytes_per_s: 10 GB/s}
            """
        )
    )
    with pytest.raises(ConfigError) as info:
        load_system_config(path)
    message = str(info.value)
    assert str(path) in message
    assert "bandwith_bytes_per_s" in message
    assert "unknown field" in message


def test_invalid_yaml_names_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="broken.yaml.*not valid YAML"):
        load_system_config(path)


@pytest.mark.parametrize(("content", "message"), [
    (b"base: a100-sxm4\nname: caf\xe9\n", r"bad.yaml: line 2: not UTF-8 text \(byte 0xe9\); save the file as UTF-8"),
    (b"base: a100-sxm4\nname: a\x00b\n", r"bad.yaml: line 2: not valid YAML: character 0x0000: special characters"),
    (b"base: a100-sxm4\nnum_cus: [1\n", r"bad.yaml: not valid YAML: .*\n  in \".*bad.yaml\", line 2, column 10"),
    (b"", r"bad.yaml: expected a mapping of fields at the top level, got nothing \(the file is empty\)"),
    (b"# only a comment\n", r"bad.yaml: expected a mapping of fields at the top level, got nothing"),
    (b"- a100-sxm4\n", r"bad.yaml: expected a mapping of fields at the top level, got a list"),
])
def test_an_unreadable_file_is_an_error_naming_the_file_and_the_line(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_system_config(path)
    based = tmp_path / "derived.yaml"  # the same when it is the base of another file
    based.write_text("base: bad.yaml\nnum_cus: 4\n")
    with pytest.raises(ConfigError, match=message):
        load_system_config(based)


def test_a_folder_is_not_a_description(tmp_path):
    (tmp_path / "gpu.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"gpu.yaml: is a folder; expected a YAML file"):
        load_system_config(tmp_path / "gpu.yaml")
    with pytest.raises(ConfigError, match=r"is a folder; expected a preset name or a YAML file"):
        load_system_config(tmp_path)
    with pytest.raises(UnknownPresetError, match=r"unknown hardware preset ''; known presets: a100-4-nvlink"):
        load_system_config("")  # not the current folder


def test_gpu_preset_is_a_single_gpu_system():
    system = gpusim.load_system("t3-table8.1")
    assert system.num_gpus == 1


def test_every_preset_loads():
    for kind, names in gpusim.list_presets().items():
        for name in names:
            system = gpusim.load_system(name)
            assert system.gpu.num_cus > 0, (kind, name)


def test_l2_efficiency_above_one_is_an_error():
    with pytest.raises(ConfigError, match=r"gpu\.l2\.sustained_efficiency.*less than or equal to 1"):
        gpusim.load_system("mi100", {"gpu.l2.sustained_efficiency": 1.4})


def test_a_description_can_start_from_a_preset(tmp_path):
    path = tmp_path / "half-h100.yaml"
    path.write_text("base: h100-sxm5\nnum_cus: 66\nsources: [my guess]\nhbm: {stacks: 3}\n")
    mine = gpusim.load_system(path).gpu
    h100 = gpusim.load_system("h100-sxm5").gpu
    assert mine.name == "half-h100" and mine.num_cus == 66 and mine.hbm.stacks == 3
    assert mine.hbm.clock_hz == h100.hbm.clock_hz and mine.l2 == h100.l2  # merged, not replaced
    assert mine.sources == ["my guess", *h100.sources]


def test_an_inline_gpu_can_start_from_a_preset(tmp_path):
    path = tmp_path / "ring.yaml"
    path.write_text("base: t3-ring8\ngpu: {base: t3-table8.1, num_cus: 160}\n")
    system = gpusim.load_system(path)
    assert system.num_gpus == 8 and system.gpu.num_cus == 160 and system.gpu.name == "ring.gpu"
    assert system.config.links == gpusim.load_system("t3-ring8").config.links


def test_errors_name_the_file_in_the_chain_that_wrote_the_field(tmp_path):
    (tmp_path / "base.yaml").write_text("base: t3-table8.1\nclock_hz: fast\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nnum_cu: 3\n")
    with pytest.raises(ConfigError) as info:
        load_system_config(tmp_path / "child.yaml")
    lines = str(info.value).splitlines()
    assert any(line.startswith(f"{tmp_path / 'base.yaml'}: field 'clock_hz'") for line in lines), lines
    assert any(line.startswith(f"{tmp_path / 'child.yaml'}: field 'num_cu': unknown field") for line in lines), lines


def test_a_loop_of_bases_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nnum_cus: 3\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"b.yaml: field 'base': the chain of bases loops \(.*a.yaml -> .*b.yaml -> .*a.yaml\)"):
        load_system_config(tmp_path / "a.yaml")


def test_an_unknown_base_lists_the_presets(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("base: h300\n")
    with pytest.raises(ConfigError, match=r"x.yaml: field 'base': unknown preset 'h300'; known: .*h200-sxm"):
        load_system_config(path)


def test_a_whole_system_check_names_the_file_and_the_override():
    with pytest.raises(ConfigError, match=r"dgx1-v100.yaml with override 'num_gpus': .*hybrid_cube_mesh is defined for 8"):
        gpusim.load_system("dgx1-v100", {"num_gpus": 4})
    with pytest.raises(ConfigError, match=r"with override 'topology.kind': .*needs 'switch'") as info:
        gpusim.load_system("t3-ring8", {"topology.kind": "switch"})
    assert "{" not in str(info.value)  # the section is not dumped
    with pytest.raises(ConfigError, match=r"^\S*a100-sxm4.yaml with override 'gpu.hbm.interleave_bytes': field 'hbm': "
                                          r"interleave_bytes \(1\) must be a multiple of burst_bytes \(32\)$"):
        gpusim.load_system("a100-4-nvlink", {"gpu.hbm.interleave_bytes": "1 B"})  # a check of a GPU's section


def test_overrides_must_be_a_mapping_of_dotted_paths():
    with pytest.raises(ConfigError, match="overrides must be a mapping"):
        gpusim.load_system("t3-ring8", [("gpu.num_cus", 3)])
    with pytest.raises(ConfigError, match="override 3: paths must be dotted strings"):
        gpusim.load_system("t3-ring8", {3: 4})


def test_a_text_field_takes_a_numeric_looking_override():
    assert gpusim.load_system("t3-ring8", {"name": 123}).config.name == "123"


def test_a_derived_node_changes_its_base_gpu(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text("base: t3-ring8\ngpu: {num_cus: 160}\n")
    system = gpusim.load_system(path)
    ring8 = gpusim.load_system("t3-ring8")
    assert system.gpu.num_cus == 160 and system.gpu.hbm == ring8.gpu.hbm and system.num_gpus == 8


def test_a_negative_flop_rate_is_an_error():
    with pytest.raises(ConfigError, match=r"override 'gpu.cu.matrix_flops_per_cycle.fp16'.*greater than 0"):
        gpusim.load_system("a100-sxm4", {"gpu.cu.matrix_flops_per_cycle.fp16": -1})


@pytest.mark.parametrize(("override", "message"), [
    ({"gpu.dispatch_policy": "lifo"}, r"field 'gpu.dispatch_policy': Input should be 'round_robin' or 'fifo' \(got 'lifo'\)"),
    ({"gpu.l2.shared_fraction": 1.5}, r"field 'gpu.l2.shared_fraction': Input should be less than or equal to 1"),
    ({"gpu.l2.shared_fraction": 0}, r"field 'gpu.l2.shared_fraction': Input should be greater than 0"),
])
def test_the_dispatch_policy_and_the_l2_shared_fraction_are_checked(override, message):
    with pytest.raises(ConfigError, match=message):
        gpusim.load_system("h200-sxm", override)


def test_a_key_given_twice_is_an_error_naming_the_file_the_field_and_the_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("base: t3-table8.1\nnum_cus: 80\nclock_hz: 1 GHz\nnum_cus: 160\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: field 'num_cus' is given twice \(lines 2 and 4\)"):
        load_system_config(path)
    nested = tmp_path / "ring.yaml"
    nested.write_text("base: t3-ring8\nlinks:\n  latency_ns: 1 us\n  packet_bytes: 64 KiB\n  latency_ns: 2 us\n")
    with pytest.raises(ConfigError, match=r"ring.yaml: field 'links.latency_ns' is given twice \(lines 3 and 5\)"):
        load_system_config(nested)


def test_a_key_may_override_what_a_yaml_merge_brought_in(tmp_path):
    path = tmp_path / "merged.yaml"
    path.write_text(textwrap.dedent(
        """
        base: t3-ring8
        collectives:
          protocols:
            - &ll {name: ll, step_latency_ns: 1 us, wire_efficiency: 0.5}
            - <<: *ll
              name: ll128
              wire_efficiency: 0.9375
        """
    ))
    ll, ll128 = load_system_config(path).collectives.protocols
    assert (ll.name, ll128.name, ll128.step_latency_ns, ll128.wire_efficiency) == ("ll", "ll128", 1000.0, 0.9375)


@pytest.mark.parametrize("path", [
    "gpu.l2.capacity_bytes", "gpu.clock_hz", "links.bandwidth_bytes_per_s", "gpu.hbm.t_rp_cycles", "gpu.l2.write_cost",
    "gpu.nmc.op_cycles.div", "gpu.cu.matrix_flops_per_cycle.fp16", "gpu.memctrl.mca.thresholds",
])
def test_an_infinite_override_is_an_error_naming_the_override_and_the_field(path):
    value = [0.1, float("inf")] if path.endswith("thresholds") else float("inf")
    with pytest.raises(ConfigError, match=rf"override '{path}': field '{path}(\.1)?': .*finite"):
        gpusim.load_system("t3-ring8", {path: value})


@pytest.mark.parametrize("text", [".inf", "1e400", "1e400 GHz"])
def test_an_infinite_number_in_a_file_is_an_error_naming_the_file_and_the_field(tmp_path, text):
    path = tmp_path / "fast.yaml"
    path.write_text(f"base: t3-table8.1\nclock_hz: {text}\n")
    with pytest.raises(ConfigError, match=r"fast.yaml: field 'clock_hz': .*finite"):
        load_system_config(path)


def _with_leaf(container, keys, value):
    """A deep copy of the nested lists and dicts ``container`` with the item at ``keys`` set to ``value``."""
    copy = deepcopy(container)
    node = copy
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return copy


def _bool_overrides(data, path=()):
    """``(dotted path, value)`` overrides that each put ``True`` where ``data`` (a dumped description) has a
    number; a number inside a list (which a dotted path cannot index) replaces the whole list."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _bool_overrides(value, (*path, key))
    elif isinstance(data, list | tuple):
        for index, item in enumerate(data):
            for inner, _ in _bool_overrides(item):
                yield ".".join(path), _with_leaf(list(data), [index, *inner.split(".")] if inner else [index], True)
    elif isinstance(data, int | float) and not isinstance(data, bool):
        yield ".".join(path), True


def _numeric_overrides_of_every_preset():
    """One ``(preset, path, value)`` per numeric field that some preset gives (each path once)."""
    found = {}
    for name in gpusim.list_presets()["gpus"] + gpusim.list_presets()["nodes"]:
        for path, value in _bool_overrides(load_system_config(name).model_dump()):
            found.setdefault(path, (name, path, value))
    return list(found.values())


def test_a_boolean_is_not_a_number_for_any_numeric_field():
    cases = _numeric_overrides_of_every_preset()
    paths = {path for _, path, _ in cases}
    assert {"gpu.num_cus", "gpu.hardware_queues", "gpu.l2.write_cost", "gpu.memctrl.mca.thresholds",
            "gpu.nmc.op_cycles.add", "gpu.gemm_efficiency.fp16", "network.nics_per_gpu",
            "gpu.gemm_tma.cluster_size", "gpu.gemm_fallback.access_cycles", "collectives.protocols"} <= paths
    for name, path, value in cases:
        with pytest.raises(ConfigError, match=rf"override '{re.escape(path)}': field '{re.escape(path)}[.\w]*': "
                                              r"expected a .*, got (the boolean )?True"):
            gpusim.load_system(name, {path: value})


def test_a_boolean_number_in_a_file_is_an_error_and_ints_still_make_floats(tmp_path):
    path = tmp_path / "yes.yaml"
    path.write_text("base: t3-table8.1\nnum_cus: true\n")
    with pytest.raises(ConfigError, match=r"yes.yaml: field 'num_cus': expected a number, got the boolean True"):
        load_system_config(path)
    system = gpusim.load_system("t3-ring8", {"gpu.vector_efficiency": 1, "gpu.hbm.t_rp_cycles": 10, "gpu.num_cus": "96"})
    assert (system.gpu.vector_efficiency, system.gpu.hbm.t_rp_cycles, system.gpu.num_cus) == (1.0, 10.0, 96)


def test_an_all_lower_case_bandwidth_override_is_ambiguous_not_bits():
    with pytest.raises(ConfigError, match=r"override 'links.bandwidth' \(field 'bandwidth_bytes_per_s'\): bandwidth "
                                          r"unit 'gb/s' in '150 gb/s' is ambiguous: write 'GB/s' \(bytes\) or 'Gbit/s'"):
        gpusim.load_system("t3-ring8", {"links.bandwidth": "150 gb/s"})
    assert gpusim.load_system("t3-ring8", {"links.bandwidth": "150 Gb/s"}).config.links.bandwidth_bytes_per_s == 18.75e9


@pytest.mark.parametrize(("path", "what", "known"), [
    ("gpu.gemm_efficiency.fp61", "dtype", "fp64, fp32, tf32, fp16, bf16, fp8, int8"),
    ("gpu.cu.matrix_flops_per_cycle.fp61", "dtype", "fp64, fp32, tf32, fp16, bf16, fp8, int8"),
    ("gpu.cu.vector_flops_per_cycle.fp61", "dtype", "fp64, fp32, tf32, fp16, bf16, fp8, int8"),
    ("gpu.nmc.op_cycles.foo", "NMC operation", "mov, add, sub, mul, fma, max, shift, div, sqrt"),
])
def test_an_unknown_key_of_a_table_is_an_error_listing_the_known_keys(path, what, known):
    key = path.rsplit(".", 1)[1]
    with pytest.raises(ConfigError, match=rf"^override '{path}': field '{path}': unknown {what} '{key}'; known: {known}$"):
        gpusim.load_system("t3-ring8", {path: 0.5})


def test_an_unknown_dtype_in_a_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("base: t3-table8.1\ngemm_efficiency: {fp16: 0.8, fp61: 0.9}\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: field 'gemm_efficiency.fp61': unknown dtype 'fp61'; known: fp64"):
        load_system_config(path)


def test_the_nmc_operations_a_config_may_price_are_the_instruction_set():
    from gpusim.config.gpu import NMC_OPERANDS, NMC_OPS, NmcConfig

    assert set(NMC_OPS) == set(NMC_OPERANDS) == set(NmcConfig().op_cycles)


def _gpu_file_text(old: str, new: str) -> str:
    """The t3-table8.1 preset's file with ``old`` replaced by ``new`` (no base: a standalone GPU file)."""
    from gpusim.config.loader import hwconfig_dirs

    text = (hwconfig_dirs()[-1] / "gpus" / "t3-table8.1.yaml").read_text()
    assert old in text
    return text.replace(old, new)


def test_a_gpu_file_with_num_cus_misspelled_or_missing_is_still_read_as_a_gpu(tmp_path):
    misspelled = tmp_path / "misspelled.yaml"
    misspelled.write_text(_gpu_file_text("num_cus: 80", "num_cu: 80"))
    with pytest.raises(ConfigError) as info:
        load_system_config(misspelled)
    lines = str(info.value).splitlines()
    assert f"{misspelled}: field 'num_cu': unknown field (did you mean 'num_cus'?)" in lines, lines
    assert f"{misspelled}: field 'num_cus': Field required" in lines, lines
    missing = tmp_path / "missing.yaml"
    missing.write_text(_gpu_file_text("num_cus: 80", ""))
    with pytest.raises(ConfigError, match=r"^\S*missing.yaml: field 'num_cus': Field required$"):
        load_system_config(missing)


def test_a_file_that_is_neither_or_both_a_gpu_and_a_node_is_an_error(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text(_gpu_file_text("num_cus: 80", "num_cus: 80\nnum_gpus: 2"))
    with pytest.raises(ConfigError, match=r"both.yaml: has fields of a GPU \(.*num_cus.*\) and of a node \(num_gpus\); "
                                          r".*a node's gives its GPU in field 'gpu'"):
        load_system_config(both)
    neither = tmp_path / "neither.yaml"
    neither.write_text("name: x\nnum_cu: 80\n")
    with pytest.raises(ConfigError, match=r"neither.yaml: neither a GPU's description \(which needs fields num_cus, "
                                          r"clock_hz, cu, l2, hbm\) nor a node's .*; unknown fields: num_cu"):
        load_system_config(neither)


@pytest.mark.parametrize(("text", "message"), [
    ("base: dgx-a100\nnum_cus: 80\n", r"field 'base': 'dgx-a100' is a node's description, but this file gives a "
                                       r"GPU's fields \(num_cus\); start from a GPU preset \(a100-sxm4, .*\) or a GPU's "
                                       r"file, or give the node's GPU these fields under 'gpu'"),
    ("base: a100-sxm4\nnum_gpus: 4\n", r"field 'base': 'a100-sxm4' is a GPU's description, but this file gives a "
                                        r"node's fields \(num_gpus\); start from a node preset, or name the GPU in "
                                        r"field 'gpu' \(gpu: a100-sxm4\)"),
    ("base: a100-4-nvlink\ngpu: {base: dgx-a100}\n", r"field 'gpu.base': 'dgx-a100' is a node's description, but a "
                                                      r"node's 'gpu' is a GPU's; start from a GPU preset .* or a GPU's file"),
])
def test_a_description_starts_from_a_base_of_its_own_kind(tmp_path, text, message):
    path = tmp_path / "mixed.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {message}$"):
        load_system_config(path)


@pytest.mark.parametrize("node_text", ["base: a100-4-nvlink\nnum_gpus: 2\n", "gpu: a100-sxm4\nnum_gpus: 1\n"])
def test_a_node_file_is_not_a_gpu(tmp_path, node_text):
    (tmp_path / "node.yaml").write_text(node_text)
    path = tmp_path / "outer.yaml"
    path.write_text("base: a100-4-nvlink\ngpu: node.yaml\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: field 'gpu': {re.escape(str(tmp_path))}/node.yaml "
                                          r"is a node's description \(it has a 'gpu' of its own\); a node's 'gpu' is a "
                                          r"GPU preset, a GPU's file or the GPU's fields$"):
        load_system_config(path)


def test_unknown_fields_of_one_section_list_its_fields_once(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("base: a100-sxm4\nzzz: 1\nyyy: 2\n")
    with pytest.raises(ConfigError) as info:
        load_system_config(path)
    assert str(info.value).splitlines()[1:] == [f"{path}: field 'yyy': unknown field"]
    assert str(info.value).startswith(f"{path}: field 'zzz': unknown field; known fields: clock_hz, cu, ")


def test_a_node_file_without_its_gpu_says_so(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("name: n\nnum_gpus: 2\ntopology: {kind: ring}\nlinks: {bandwidth_bytes_per_s: 1 GB/s}\n")
    with pytest.raises(ConfigError, match=r"node.yaml: field 'gpu': none given; a node's description names its GPU"):
        load_system_config(path)


def test_an_override_into_an_empty_section_names_the_override_and_what_the_new_section_needs():
    with pytest.raises(ConfigError) as info:
        gpusim.load_system("t3-ring8", {"network.latency": "1 us"})
    assert str(info.value) == (
        "override 'network.latency': field 'network.nic_bandwidth_bytes_per_s': Field required (the description "
        "leaves 'network' empty, so the override creates it; a new 'network' needs this field too)"
    )
    with pytest.raises(ConfigError, match=r"^override 'gpu.gemm_fallback.access_cycles': field "
                                          r"'gpu.gemm_fallback.mma_fraction': Field required \(the description leaves "
                                          r"'gpu.gemm_fallback' empty, so the override creates it"):
        gpusim.load_system("t3-table8.1", {"gpu.gemm_fallback.access_cycles": 0.1, "gpu.dma.engines": 2})
    with pytest.raises(ConfigError, match=r"^overrides 'network.latency', 'network.packet': field "
                                          r"'network.nic_bandwidth_bytes_per_s': Field required \(.*the overrides create"):
        gpusim.load_system("t3-ring8", {"network.latency": "1 us", "network.packet": "4 KiB"})
    network = gpusim.load_system("t3-ring8", {"network.latency": "1 us", "network.nic_bandwidth": "25 GB/s"}).config.network
    assert (network.latency_ns, network.nic_bandwidth_bytes_per_s, network.packet_bytes) == (1000.0, 25e9, 65536)


def test_an_override_into_an_empty_optional_section_creates_it_with_defaults():
    from gpusim.config.gpu import GemmTmaConfig

    assert gpusim.load_system("t3-table8.1").gpu.gemm_tma is None
    assert gpusim.load_system("t3-table8.1", {"gpu.gemm_tma.cluster_size": 2}).gpu.gemm_tma == GemmTmaConfig(cluster_size=2)


def test_an_override_into_a_section_the_description_leaves_out_keeps_the_section_defaults():
    from gpusim.config.gpu import NmcConfig

    gpu = gpusim.load_system("t3-table8.1", {"gpu.nmc.op_cycles.div": 2}).gpu
    assert gpu.nmc.op_cycles == {**NmcConfig().op_cycles, "div": 2.0}
    system = gpusim.load_system("t3-table8.1", {"topology.links_per_pair": 2}).config
    assert (system.topology.kind, system.topology.links_per_pair) == ("fully_connected", 2)


def test_a_text_field_keeps_text_as_typed_and_takes_a_boolean_looking_override():
    system = gpusim.load_system("t3-ring8", {"gpu.name": "007", "name": "1e3", "description": True})
    assert (system.gpu.name, system.config.name, system.config.description) == ("007", "1e3", "true")


def _leaves(data, path=()):
    """``(dotted path, value)`` of every scalar of a dumped description outside lists."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif not isinstance(data, list | tuple) and data is not None:
        yield ".".join(path), data


def test_a_list_field_takes_a_yaml_list_as_text():
    config = load_system_config("a100-4-nvlink", {"topology.kind": "custom", "topology.edges": "[[0, 1], [1, 2, 2]]",
                                                  "sources": "[measured, guessed]",
                                                  "gpu.memctrl.mca.thresholds": "[0.1, 0.2, 0.5, 1.0]"})
    assert config.topology.edges == [[0, 1], [1, 2, 2]] and config.sources == ["measured", "guessed"]
    assert config.gpu.memctrl.mca.thresholds == (0.1, 0.2, 0.5, 1.0)
    for text in ("[[0, 1", "0, 1"):
        with pytest.raises(ConfigError, match=rf"override 'topology.edges': field 'edges' takes a list, written as YAML "
                                              rf"writes one \(such as .*\), got '{re.escape(text)}'"):
            load_system_config("a100-4-nvlink", {"topology.kind": "custom", "topology.edges": text})
    with pytest.raises(ConfigError, match=r"override 'topology.edges': field 'topology.edges.0.1': .*valid integer"):
        load_system_config("a100-4-nvlink", {"topology.kind": "custom", "topology.edges": "[[0, a]]"})


@pytest.mark.parametrize("name", ["t3-ring8", "dgx-a100", "h200-sxm"])
def test_every_field_takes_the_text_a_command_line_would_pass(name):
    config = load_system_config(name)
    text = {path: str(value).lower() if isinstance(value, bool) else str(value) for path, value in _leaves(config.model_dump())}
    assert load_system_config(name, text) == config


@pytest.mark.parametrize("preset", ["h100-sxm5", "a100-sxm4", "mi210", "t3-table8.1", "v100-pcie"])
def test_the_l2_runs_at_the_sm_clock_and_follows_an_override_of_it(preset):
    """Every preset runs its L2 at the SM clock; a faster SM clock speeds the L2 up with it, unless
    the L2's own clock is given."""
    system = gpusim.load_system(preset)
    assert system.gpu.l2.clock_hz == system.gpu.clock_hz
    faster = gpusim.load_system(preset, {"gpu.clock_hz": system.gpu.clock_hz * 2})
    assert faster.gpu.l2.clock_hz == faster.gpu.clock_hz == 2 * system.gpu.clock_hz
    apart = gpusim.load_system(preset, {"gpu.clock_hz": system.gpu.clock_hz * 2, "gpu.l2.clock": "1 GHz"})
    assert apart.gpu.l2.clock_hz == 1e9
