"""The Kineto importer on the measured traces in ../shared/data/traces/kineto."""

import gzip
import json
import math
import re

import pytest

import gpusim
from gpusim.errors import ConfigError, TraceError
from gpusim.trace import compare, read_kineto
from gpusim.trace.compare import kernel_comparison
from gpusim.trace.kineto import coalesced_dims, kernel_class, library_kernel_of, short_name
from tests.conftest import shared_data

MI250 = "traces/kineto/mi250_minitoy_train_kineto.json.gz"
A100 = "traces/kineto/a100_2rank_cnn_nccl_kineto.json.gz"


def test_kernel_classes_from_names():
    assert kernel_class("Cijk_Alik_Bljk_SB_MT64x16x32_MI16x16x1", "kernel") == "gemm"
    assert kernel_class("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(x)", "kernel") == "gemm"
    assert kernel_class("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "kernel") == "collective"
    assert kernel_class("void at::native::reduce_kernel<512, 1>(x)", "kernel") == "reduction"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, F>(int)", "kernel") == "elementwise"
    assert kernel_class("Memcpy DtoD (Device -> Device)", "gpu_memcpy") == "memcpy"
    # cuBLAS's matrix-vector kernels: GEMMs with one output row, which the library's choice replays
    # (as GEMV kernels where the preset's BLAS has them, gpusim.kernels.gemv)
    gemv = "void gemv2T_kernel_val<int, int, __half, __half, __half, float, 128, 16, 4, 4, false, false>(x)"
    assert kernel_class(gemv, "kernel") == "gemm" and library_kernel_of(gemv, 128) == ""
    assert kernel_class("void gemvx::kernel<int, int, __half, __half, float, false, true>(x)", "kernel") == "gemm"
    assert short_name("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<T>(x)") == \
        "at::native::multi_tensor_apply_kernel"


def test_kernel_names_pick_the_library_tile():
    """Column-major BLAS tiles a x b are b x a tiles of the row-major product, with the measured K depth."""
    assert library_kernel_of("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1", 256) == "MT16x64x32_T64"
    assert library_kernel_of("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", 384) == "MT128x256x64_T256"
    assert kernel_class("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", "kernel") == "gemm"
    assert library_kernel_of("sm80_xmma_gemm_tilesize128x128x32_stage4", 256) == "MT128x128x32_T256"
    assert library_kernel_of("ampere_sgemm_32x32_sliced1x4_tn", 128) == "MT32x32x32_T64"
    assert library_kernel_of("cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4", 128) == ""  # no 64x256 tile
    # the H200 trace's fallback kernels: align1 of fp16 is 2-byte accesses; align8 is the library kernel
    align1 = "void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_tn_align1>(cutlass_75_tensorop_f16_s"
    assert library_kernel_of(align1, 256, 2) == "MT128x256x32_T256_V2"
    assert library_kernel_of("cutlass_80_tensorop_f16_s16816gemm_f16_256x128_32x3_nn_align8", 256, 2) == "MT128x256x32_T256"
    assert library_kernel_of("cutlass_80_tensorop_f16_s16816gemm_f16_256x128_32x3_nn_align2", 256, 2) == "MT128x256x32_T256_V4"
    assert library_kernel_of("at::native::elementwise_kernel", 128) == ""


def test_unmodelled_kernels_are_an_error_naming_the_event():
    with pytest.raises(TraceError, match=r"event \d+ \('Memcpy HtoD' .*field 'name': cannot be modelled: host"):
        read_kineto(shared_data(MI250))


def test_mi250_training_step_shapes_and_measured_durations():
    trace = read_kineto(shared_data(MI250), unsupported="delay")
    frame = trace.frame
    assert len(frame) == 16 and trace.gpus == [0]
    gemm = frame[frame["kind"] == "gemm"]
    assert list(zip(gemm["m"], gemm["n"], gemm["k"])) == [(5, 128, 128), (128, 128, 5)]  # addmm, then mm in backward
    assert set(gemm["dtype"]) == {"fp32"}
    assert list(gemm["kernel"]) == ["MT16x64x32_T64", "MT16x64x16_T64"]  # from MT64x16x32, MT64x16x16 (depth kept)
    delays = frame[frame["kind"] == "delay"]
    assert set(delays["kernel_class"]) == {"memcpy"}  # host-to-device copies
    assert delays["delay_s"].tolist() == delays["measured_s"].tolist()
    reasons = trace.metadata["not_modelled"]
    assert [r["op_id"] for r in reasons] == delays["op_id"].tolist()
    assert {r["reason"] for r in reasons} == {"host-device copies are not modelled"}
    assert frame["measured_s"].notna().all()
    relu = frame[frame["function"] == "relu"]
    assert relu["elements"].tolist() == [640, 640]  # 5 x 128 from the recorded input dims
    result = gpusim.run(gpusim.load_system("mi210"), trace)
    assert {"measured_s", "duration_s", "kind"} <= set(result.ops.columns)
    assert result.ops["measured_s"].notna().all()
    table = compare(result.ops, trace.metadata["measured_span_s"][0], result.kernels).set_index("kernel_class")
    assert table.loc["memcpy", "kernels"] == 0 and table.loc["memcpy", "not_simulated"] == 2
    assert table.loc["gemm", "kernels"] == 2
    everything = table.loc["all kernels", "measured_s"] + table.loc["all kernels", "not_simulated_s"]
    assert everything == pytest.approx(frame["measured_s"].sum())  # simulated kernels and measured delays
    # a profiled kernel lasts from its start to its end on the GPU: compared with the simulated kernels'
    # span, not with the op's duration, which counts from its measured launch call's return
    kernels = kernel_comparison(result.ops, result.kernels).set_index("op_id")
    ops = result.ops.set_index("op_id")
    modelled = kernels[kernels["modelled"]].index
    spans = result.kernels.groupby("op_id").agg(first=("start_s", "min"), last=("end_s", "max"))
    assert kernels.loc[modelled, "simulated_s"].to_numpy() == pytest.approx(
        (spans["last"] - spans["first"]).loc[modelled].to_numpy())
    assert (kernels.loc[modelled, "simulated_s"] <= ops.loc[modelled, "duration_s"] + 1e-12).all()


def test_a100_nccl_collectives_groups_and_waits():
    trace = read_kineto(shared_data(A100), unsupported="delay", iteration=5)
    frame = trace.frame
    collectives = frame[frame["kind"] == "collective"]
    assert len(collectives) == 5 and set(collectives["group"]) == {"0 1"}
    assert set(collectives["collective"]) == {"allreduce"} and set(collectives["dtype"]) == {"fp32"}
    assert set(collectives["channels"]) == {8}  # the NCCL kernels' grid [8, 1, 1]: one block per channel
    data = json.load(gzip.open(shared_data(A100), "rt"))
    sizes = sorted(4 * e["args"]["In msg nelems"] for e in data["traceEvents"]
                   if e.get("cat") == "kernel" and e["args"].get("Collective name") == "allreduce")
    assert set(collectives["bytes"]) <= set(sizes)
    assert (collectives["deps"] != "").any()  # an all-reduce waited for the compute stream
    assert frame[frame["kind"] == "delay"]["kernel_class"].isin(["gemm", "reduction", "elementwise", "other",
                                                                 "collective"]).all()
    everything = read_kineto(shared_data(A100), unsupported="delay")
    assert len(everything) > len(trace)
    with pytest.raises(TraceError, match="no ProfilerStep#99"):
        read_kineto(shared_data(A100), unsupported="delay", iteration=99)


def test_a_trace_without_gpu_kernels_says_what_it_holds_and_how_to_record_them(tmp_path):
    cpu_only = tmp_path / "cpu.json"
    cpu_only.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "args": {}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm", "ts": 2, "dur": 1, "args": {}}]}))
    with pytest.raises(TraceError, match=r"cpu.json: no GPU kernels \(events of category 'kernel', 'gpu_memcpy', "
                                         r"'gpu_memset'\); its complete events' categories: Kernel, cpu_op\. Profile "
                                         r"with activities=\[ProfilerActivity.CPU, ProfilerActivity.CUDA\]$"):
        read_kineto(cpu_only)


def test_two_ranks_share_their_collectives(tmp_path):
    data = json.load(gzip.open(shared_data(MI250), "rt"))
    for rank in (0, 1):
        events = [e for e in data["traceEvents"] if e.get("cat") != "gpu_memcpy"]
        nccl = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ts": 4203669612400.0,
                "dur": 20.0, "args": {"stream": 7, "correlation": 999999, "Collective name": "allreduce",
                                      "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float",
                                      "Process Group Ranks": "[0, 1]"}}
        copy = {**data, "traceEvents": [*events, nccl], "distributedInfo": {"rank": rank, "world_size": 2}}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(copy))
    trace = read_kineto([tmp_path / "rank0.json", tmp_path / "rank1.json"])
    collective = trace.frame[trace.frame["kind"] == "collective"]
    assert collective["gpu"].tolist() == [0, 1] and collective["op_id"].nunique() == 1
    assert collective["channels"].isna().all()  # no grid recorded: the node's channels
    result = gpusim.run(gpusim.load_system("mi210-4"), trace, mode="full")
    assert set(result.ops["gpu"]) == {0, 1}
    with pytest.raises(TraceError, match="not a readable Kineto JSON trace"):
        (tmp_path / "broken.json").write_text("{")
        read_kineto(tmp_path / "broken.json")


def test_ranks_whose_collectives_differ_name_both_files_and_events(tmp_path):
    def nccl(rank, **args):
        kernel = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ts": 10.0, "dur": 5.0,
                  "args": {"stream": 7, "Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                           "Process Group Ranks": "[0, 1]", **args}}
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps({"traceEvents": [kernel], "distributedInfo": {"rank": rank, "world_size": 2}}))
        return path

    assert read_kineto([nccl(0), nccl(1)]).frame["op_id"].nunique() == 1
    for field, value, shown in [("In msg nelems", 2048, "bytes 8192 here, but 4096"),
                                ("dtype", "Half", "dtype 'fp16' here, but 'fp32'"),
                                ("Collective name", "reduce_scatter", "collective 'reducescatter' here, but 'allreduce'")]:
        with pytest.raises(TraceError, match=rf"rank1.json: event 0 \('ncclKernel_AllReduce_RING_LL_Sum_float'\): "
                                             rf"field '{field}': collective 1 of group 0 1 has {shown} in .*rank0.json "
                                             r"\(event 0\); every rank runs the same collectives"):
            read_kineto([nccl(0), nccl(1, **{field: value})])


def _kineto_file(tmp_path, change=None, info=None):
    """A one-kernel Kineto trace (event 1; event 0 is its CPU op), changed by ``change(kernel, events)``."""
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::foo", "ts": 0.0, "dur": 30.0, "args": {"External id": 1}}
    kernel = {"ph": "X", "cat": "kernel", "name": "mystery_kernel", "ts": 10.0, "dur": 5.0,
              "args": {"stream": 7, "External id": 1}}
    events = [cpu, kernel]
    if change is not None:
        change(kernel, events)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": info or {"rank": 0, "world_size": 1}}))
    return path


def test_a_minimal_trace_imports(tmp_path):
    frame = read_kineto(_kineto_file(tmp_path), unsupported="delay").frame
    assert frame["kind"].tolist() == ["delay"] and frame["measured_s"].tolist() == [pytest.approx(5e-6)]


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda k, e: k.pop("dur"), r"event 1: field 'dur' is missing"),
        (lambda k, e: k.pop("ts"), r"event 1: field 'ts' is missing"),
        (lambda k, e: k.update(dur=-5.0), r"event 1: field 'dur' must be a duration >= 0 us, got -5.0"),
        (lambda k, e: k.update(dur=float("inf")), r"event 1: field 'dur' must be a finite number .*got inf"),
        (lambda k, e: k.update(dur="abc"), r"event 1: field 'dur' must be a finite number .*got 'abc'"),
        (lambda k, e: k.update(ts="abc"), r"event 1: field 'ts' must be a finite number .*got 'abc'"),
        (lambda k, e: k.update(ts=None), r"event 1: field 'ts' must be a finite number .*got None"),
        (lambda k, e: k.update(args=None), r"event 1: field 'args' must be a JSON object, got None"),
        (lambda k, e: k.update(name=None), r"event 1: field 'name' must be text, got None"),
        (lambda k, e: e.append(5), r"event 2: must be a JSON object, got 5"),
    ],
)
def test_malformed_events_name_the_file_event_and_field(tmp_path, change, pattern):
    path = _kineto_file(tmp_path, change)
    with pytest.raises(TraceError, match=rf"trace.json: {pattern}"):
        read_kineto(path, unsupported="delay")


ELEMENTWISE_KERNEL = "void at::native::vectorized_elementwise_kernel<4, F>(int)"
NCCL_KERNEL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _op(op_name, kernel_name, **args):
    """A change for :func:`_kineto_file`: the kernel is ``kernel_name``, launched by ``op_name`` with ``args``."""
    def change(kernel, events):
        kernel["name"] = kernel_name
        events[0]["name"] = op_name
        events[0]["args"].update(args)

    return change


def _nccl(**args):
    """A change for :func:`_kineto_file`: the kernel is an NCCL all-reduce whose arguments ``args`` change."""
    def change(kernel, events):
        kernel["name"] = NCCL_KERNEL
        kernel["args"].update({"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                               "Process Group Ranks": "[0, 1]", **args})

    return change


def _launched(kernel_args=None, **launch):
    """A change for :func:`_kineto_file`: the kernel (with ``kernel_args``) has a launch call (event 2)."""
    def change(kernel, events):
        kernel["name"] = ELEMENTWISE_KERNEL
        kernel["args"].update({"correlation": 5, **(kernel_args or {})})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 8.0, "dur": 1.0,
                       "args": {"correlation": 5}, **launch})

    return change


def _cpu_op(**fields):
    def change(kernel, events):
        events[0].update(fields)

    return change


@pytest.mark.parametrize(
    ("change", "where", "field", "got"),
    [
        (_nccl(**{"Process Group Ranks": '[0, "a"]'}), "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')",
         "Process Group Ranks", '"[0, \\"a\\"]"'),
        (_nccl(**{"Process Group Ranks": 5}), "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')",
         "Process Group Ranks", "5"),
        (_nccl(**{"Process Group Ranks": "[0, 1"}), "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')",
         "Process Group Ranks", '"[0, 1"'),
        (_nccl(**{"Process Group Ranks": "[0, 0]"}), "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')",
         "Process Group Ranks", '"[0, 0]"'),
        (_nccl(**{"Process Group Ranks": "[]", "Group size": "2"}),
         "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')", "Group size", '"2"'),
        (_nccl(**{"In msg nelems": True}), "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')", "In msg nelems",
         "true"),
        (_nccl(dtype=["Float"]), "event 1 ('ncclKernel_AllReduce_RING_LL_Sum_float')", "dtype", '["Float"]'),
        (_launched({"correlation": [5]}), "event 1 ('at::native::vectorized_elementwise_kernel')", "correlation",
         "[5]"),
        (_launched(args={"correlation": {"a": 1}}), "event 2 ('cudaLaunchKernel')", "correlation", '{"a": 1}'),
        (_cpu_op(args={"External id": [1]}), "event 0 ('aten::foo')", "External id", "[1]"),
        (_launched({"grid": 5, "block": [128, 1, 1]}), "event 1 ('at::native::vectorized_elementwise_kernel')",
         "grid", "5"),
        (_launched({"grid": [1, 1, 1]}, args={"correlation": 5, "block": "128"}), "event 2 ('cudaLaunchKernel')",
         "block", '"128"'),
        (_launched({"stream": [7]}), "event 1 ('at::native::vectorized_elementwise_kernel')", "stream", "[7]"),
        (_op("aten::mm", "ampere_sgemm_64x64_nn", **{"Input Dims": [[64, None], [32, 16]]}), "event 0 ('aten::mm')",
         "Input Dims", "[[64, null], [32, 16]]"),
        (_op("aten::mm", "ampere_sgemm_64x64_nn", **{"Input Dims": [[64, -32], [-32, 16]]}), "event 0 ('aten::mm')",
         "Input Dims", "[[64, -32], [-32, 16]]"),
        (_op("aten::_softmax", "softmax_warp_forward", **{"Input Dims": [[4, "a"]]}), "event 0 ('aten::_softmax')",
         "Input Dims", '[[4, "a"]]'),
        (_op("aten::add", ELEMENTWISE_KERNEL, **{"Input Dims": [[64, 16], [64, 16]], "Input type": "float"}),
         "event 0 ('aten::add')", "Input type", '"float"'),
        (_op("aten::mm", "ampere_sgemm_64x64_nn", **{"Input Dims": [[64, 32], [32, 16]], "Input type": [None]}),
         "event 0 ('aten::mm')", "Input type", "[null]"),
        (_op("aten::add", "void at::native::elementwise_kernel<128, 2>(int)", **{
            "Input Dims": [[64, 16], [64, 16]], "Input type": ["float", "float"], "Input Strides": [[16, "1"], []]}),
         "event 0 ('aten::add')", "Input Strides", '[[16, "1"], []]'),
        (_op("aten::gelu", ELEMENTWISE_KERNEL,
             **{"Input Dims": [[64]], "Input type": ["float"], "Concrete Inputs": "tanh"}),
         "event 0 ('aten::gelu')", "Concrete Inputs", '"tanh"'),
    ],
)
def test_malformed_fields_name_the_event_and_field(tmp_path, change, where, field, got):
    path = _kineto_file(tmp_path, change)
    with pytest.raises(TraceError, match=rf"trace.json: {re.escape(where)}: field '{field}' must .*, got "
                                         rf"{re.escape(got)}$"):
        read_kineto(path, unsupported="delay")


@pytest.mark.parametrize(("change", "pattern"), [
    (_launched(dur="abc"), r"event 2: field 'dur' must be a finite number of microseconds, got 'abc'"),
    (_launched(dur=None), r"event 2: field 'dur' must be a finite number of microseconds, got None"),
    (_launched(ts="8"), r"event 2: field 'ts' must be a finite number of microseconds, got '8'"),
    (lambda k, e: e[0].pop("name"), r"event 0: field 'name' is missing \(a CPU op needs its operator's name\)"),
    (lambda k, e: k.update(dur=1e300), r"event 1: field 'dur' must be a duration of at most 1e\+12 us, got 1e\+300"),
])
def test_malformed_launch_calls_and_cpu_ops_name_the_event(tmp_path, change, pattern):
    with pytest.raises(TraceError, match=rf"trace.json: {pattern}$"):
        read_kineto(_kineto_file(tmp_path, change), unsupported="delay")


def test_an_empty_matrix_product_or_reduction_is_unsupported_not_malformed(tmp_path):
    mm = _op("aten::mm", "ampere_sgemm_64x64_nn", **{"Input Dims": [[64, 0], [0, 16]], "Input type": ["float"] * 2})
    with pytest.raises(TraceError, match=r"cannot be modelled: aten::mm with input shapes .* multiplies empty"):
        read_kineto(_kineto_file(tmp_path, mm))
    softmax = _op("aten::_softmax", "softmax_warp_forward", **{"Input Dims": [[64, 0]], "Input type": ["float"]})
    frame = read_kineto(_kineto_file(tmp_path, softmax), unsupported="delay").frame
    assert frame["kind"].tolist() == ["delay"]


@pytest.mark.parametrize(("rank", "recorded", "group"), [
    (2, "[2, 3]", "0 3"),  # the file's rank 2 becomes GPU 0, and rank 0 takes number 2
    (2, "[0, 2]", "0 2"),
    (1, "[0, 1, 2, 3]", "0 1 2 3"),
    (3, "[1, 3]", "0 1"),
    (0, "[0, 1]", "0 1"),
])
def test_a_single_ranks_file_is_gpu_0_and_its_groups_are_renumbered_alike(tmp_path, rank, recorded, group):
    path = _kineto_file(tmp_path, _nccl(**{"Process Group Ranks": recorded}), info={"rank": rank, "world_size": 4})
    trace = read_kineto(path)
    assert trace.frame[["gpu", "group"]].values.tolist() == [[0, group]]
    result = gpusim.run(gpusim.load_system("dgx-a100"), trace, mode="symmetric")
    assert result.ops["gpu"].tolist() == [0]


def test_a_group_without_the_files_rank_names_the_event_and_rank(tmp_path):
    path = _kineto_file(tmp_path, _nccl(**{"Process Group Ranks": "[0, 1]"}), info={"rank": 2, "world_size": 4})
    with pytest.raises(TraceError, match=r"trace.json: event 1 \('ncclKernel_AllReduce_RING_LL_Sum_float'\): field "
                                         r"'Process Group Ranks' must contain the file's rank 2 .*, got \[0, 1\]$"):
        read_kineto(path)


def test_activities_on_several_devices_name_them(tmp_path):
    def two_devices(kernel, events):
        kernel["args"]["device"] = 0
        events.append({**kernel, "ts": 20.0, "args": {**kernel["args"], "device": 1}})
        events.append({**kernel, "ts": 30.0, "args": {**kernel["args"], "device": 1}})

    with pytest.raises(TraceError, match=r"trace.json: field 'device': the GPU activities ran on devices "
                                         r"0 \(1 activity\), 1 \(2 activities\); a file is one rank's trace"):
        read_kineto(_kineto_file(tmp_path, two_devices), unsupported="delay")

    def one_device(kernel, events):
        kernel["args"]["device"] = 3
        events.append({**kernel, "ts": 20.0})
        events.append({**kernel, "ts": 30.0, "args": {"stream": 7}})  # a device not recorded: not another one

    assert read_kineto(_kineto_file(tmp_path, one_device), unsupported="delay").gpus == [0]


def test_a_malformed_rank_names_the_field(tmp_path):
    path = _kineto_file(tmp_path, info={"rank": "x", "world_size": 2})
    with pytest.raises(TraceError, match=r"trace.json: field 'distributedInfo.rank' must be a whole number >= 0, got"):
        read_kineto(path, unsupported="delay")


@pytest.mark.parametrize(("kernel_name", "library"), [
    ("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 9, false, false>", "pytorch"),
    ("triton_per_fused__softmax_0", "inductor"),
])
def test_a_reduction_replays_as_its_library_s_kernel(tmp_path, kernel_name, library):
    def softmax(kernel, events):
        kernel["name"] = kernel_name
        events[0].update(name="aten::_softmax", args={"External id": 1, "Input Dims": [[64, 512]],
                                                        "Input type": ["c10::Half"]})

    frame = read_kineto(_kineto_file(tmp_path, softmax)).frame
    assert frame[["kind", "function", "rows", "cols", "kernel"]].values.tolist() == [
        ["reduction", "softmax", 64, 512, library]]


@pytest.mark.parametrize(("op", "function"), [("aten::_softmax_backward_data", "softmax_backward"),
                                               ("aten::native_layer_norm_backward", "layernorm_backward")])
def test_a_backward_reduction_replays_as_its_backward_kernel(tmp_path, op, function):
    def backward(kernel, events):
        kernel["name"] = "void (anonymous namespace)::softmax_warp_backward<c10::Half>(x)"
        events[0].update(name=op, args={"External id": 1, "Input Dims": [[64, 512], [64, 512]],
                                         "Input type": ["c10::Half", "c10::Half"]})

    frame = read_kineto(_kineto_file(tmp_path, backward)).frame
    assert frame[["kind", "function", "rows", "cols"]].values.tolist() == [["reduction", function, 64, 512]]


@pytest.mark.parametrize(("concrete", "expected"), [
    (["", "[0]", "True", ""], ["colsum", 4096, 768]),  # a bias gradient: the sum of each column
    (["", "[-1]", "False", ""], ["sum", 4096, 768]),  # the sum of each row
    (["", "", ""], ["sum", 1, 4096 * 768]),  # no dimension given: one sum of everything
    (["", "[1, 0]", "True", ""], ["sum", 1, 4096 * 768]),
    (None, ["sum", 4096, 768]),  # arguments not recorded: rows over the last dimension
])
def test_a_sum_reduces_the_dimensions_its_arguments_name(tmp_path, concrete, expected):
    def total(kernel, events):
        kernel["name"] = "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::Half>>(x)"
        args = {"External id": 1, "Input Dims": [[4096, 768], [], [], []], "Input type": ["c10::Half"]}
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        events[0].update(name="aten::sum", args=args)

    frame = read_kineto(_kineto_file(tmp_path, total)).frame
    assert frame[["kind", "function", "rows", "cols"]].values.tolist() == [["reduction", *expected]]


def test_a_triton_column_sum_replays_as_a_delay(tmp_path):
    def total(kernel, events):
        kernel["name"] = "triton_red_fused_sum_0"
        events[0].update(name="aten::sum", args={"External id": 1, "Input Dims": [[4096, 768]],
                                                   "Input type": ["c10::Half"], "Concrete Inputs": ["", "[0]"]})

    frame = read_kineto(_kineto_file(tmp_path, total), unsupported="delay").frame
    assert frame["kind"].tolist() == ["delay"]


@pytest.mark.parametrize(("dims", "types", "function"), [
    ([[8, 512, 3072], []], ["c10::Half", "double"], "scale"),  # x * 0.5: one tensor read
    ([[8, 512, 3072], [8, 512, 3072]], ["c10::Half", "c10::Half"], "mul"),
    ([[8, 12, 512, 512], [8, 1, 512, 512]], ["c10::Half", "c10::Half"], "scale"),  # a mask broadcast over heads
    ([[4, 1024], [1024]], ["float", "float"], "scale"),  # a bias row
    ([[1024], [1024]], ["float", "float"], "mul"),
])
def test_a_binary_op_with_a_scalar_or_small_broadcast_operand_reads_one_tensor(tmp_path, dims, types, function):
    def mul(kernel, events):
        kernel["name"] = "void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)"
        events[0].update(name="aten::mul", args={"External id": 1, "Input Dims": dims, "Input type": types})

    frame = read_kineto(_kineto_file(tmp_path, mul)).frame
    assert frame[["kind", "function", "elements"]].values.tolist() == [
        ["elementwise", function, max(math.prod(d) for d in dims)]]


def _chain_file(tmp_path, shapes):
    """A trace of element-wise tanh kernels on one stream, one per shape, back to back."""
    events = []
    for index, dims in enumerate(shapes):
        ident = index + 1
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::tanh", "ts": 10.0 * index, "dur": 5.0,
                       "args": {"External id": ident, "Input Dims": [dims], "Input type": ["c10::Half"]}})
        events.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4, F>(int)",
                       "ts": 10.0 * index + 1, "dur": 3.0, "args": {"stream": 7, "External id": ident}})
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_inferred_dataflow_links_a_kernel_to_its_predecessor_of_the_same_size(tmp_path):
    path = _chain_file(tmp_path, [[1024, 1024], [1024, 1024], [512, 1024], [512, 1024]])
    frame = read_kineto(path).frame  # the default since stop 20
    assert frame["output"].tolist() == ["t1", "t2", "t3", "t4"]
    assert frame["inputs"].tolist() == ["", "t1", "", "t3"]  # the third kernel's input is smaller: not t2
    assert (read_kineto(path, dataflow=False).frame["inputs"] == "").all()  # private inputs


def test_a_chained_kernel_finds_its_input_in_the_l2(tmp_path):
    path = _chain_file(tmp_path, [[2048, 1024], [2048, 1024]])
    system = gpusim.load_system("h200-sxm")
    private, chained = (gpusim.run(system, read_kineto(path, dataflow=flow)).kernels["duration_s"].tolist()
                        for flow in (False, True))
    assert chained[1] < private[1]
    assert chained[0] == private[0]


@pytest.mark.parametrize(("layouts", "dims"), [
    ([([8, 512, 768], [393216, 768, 1])], 1),  # contiguous: one dimension
    ([([8, 12, 512, 64], [393216, 32768, 64, 1]), ([8, 12, 512, 64], [393216, 64, 768, 1])], 4),  # heads transposed
    ([([8, 12, 512, 512], [3145728, 262144, 512, 1]), ([8, 1, 1, 512], [512, 512, 512, 1])], 3),  # a mask over heads
    ([([4096, 1], [1, 1]), ([4096, 1], [1, 1])], 1),  # size-1 dimensions drop out
    ([([16, 32], [1, 16])], 2),  # a transposed matrix into a new one
    ([], 1),
])
def test_tensoriterator_merges_dimensions_contiguous_in_every_tensor(layouts, dims):
    assert coalesced_dims(layouts) == dims


@pytest.mark.parametrize(("kernel_name", "op", "args", "expected"), [
    ("void at::native::vectorized_elementwise_kernel<4, AddFunctor<c10::Half>>(int)", "aten::add",
     {"Input Dims": [[8, 512, 768], [8, 512, 768]], "Input type": ["c10::Half", "c10::Half"]}, ["add", "fp16", 0]),
    ("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>(int)", "aten::copy_",
     {"Input Dims": [[8, 512], [8, 512]], "Input type": ["float", "c10::Half"]}, ["copy", "fp32", 1]),
    ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>(int)", "aten::copy_",
     {"Input Dims": [[8, 12, 512, 64], [8, 12, 512, 64]], "Input type": ["c10::Half", "c10::Half"],
      "Input Strides": [[393216, 32768, 64, 1], [393216, 64, 768, 1]]}, ["copy", "fp16", 4]),
    ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>(int)", "aten::copy_",
     {"Input Dims": [[8, 512], [8, 512]], "Input type": ["c10::Half", "c10::Half"]}, ["copy", "fp16", 2]),  # no strides
    ("void at::native::CatArrayBatchedCopy<at::native::OpaqueType<2u>, unsigned int, 4, 64, 64>(x)", "aten::cat",
     {"Input Dims": [[[0], [8, 12, 512, 64]], []], "Input type": ["TensorList", "Scalar"],
      "Input Strides": [[[1], [1179648, 64, 2304, 1]], []]}, ["cat", "fp16", 4]),
    ("void at::native::CatArrayBatchedCopy_aligned16_contig<OpaqueType<4u>, unsigned int, 3, 128, 1>(x)",
     "aten::cat", {"Input Dims": [[[8, 512], [8, 512]], []], "Input type": ["TensorList", "Scalar"]}, ["cat", "fp32", 0]),
    ("void at::native::CatArrayBatchedCopy<at::native::OpaqueType<2u>, unsigned int, 3, 64, 64>(x)", "aten::cat",
     {"Input Dims": [[[8, 512, 768], [8, 512, 768]], []], "Input type": ["TensorList", "Scalar"],
      "Input Strides": [[[393216, 768, 1], [393216, 1, 512]], []]}, ["cat", "fp16", 3]),  # the rank, unmerged
])
def test_an_elementwise_kernel_replays_as_pytorchs_access_path(tmp_path, kernel_name, op, args, expected):
    """Vectorized kernels run as contiguous 16-byte streams; the unrolled kernel and the offset-calculator
    kernel (and the concatenation of strided tensors) one element per access, over the dimensions the
    recorded strides leave; a tensor list's element size comes from the kernel's OpaqueType."""
    def elementwise(kernel, events):
        kernel["name"] = kernel_name
        events[0].update(name=op, args={"External id": 1, **args})

    frame = read_kineto(_kineto_file(tmp_path, elementwise)).frame
    assert frame[["kind", "function", "dtype", "index_dims"]].values.tolist() == [["elementwise", *expected]]


@pytest.mark.parametrize(("concrete", "function"), [
    (["", "'none'"], "gelu_erf"), (["", "'tanh'"], "gelu"), (["", "tanh"], "gelu"),
    (None, "gelu_erf"),  # not recorded: PyTorch's default, the exact GeLU
])
def test_gelu_replays_as_the_approximation_its_arguments_name(tmp_path, concrete, function):
    def gelu(kernel, events):
        kernel["name"] = "void at::native::vectorized_elementwise_kernel<8, GeluCUDAKernelImpl>(int)"
        args = {"External id": 1, "Input Dims": [[4096, 3072], []], "Input type": ["c10::Half", ""]}
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        events[0].update(name="aten::gelu", args=args)

    frame = read_kineto(_kineto_file(tmp_path, gelu)).frame
    assert frame[["function", "elements"]].values.tolist() == [[function, 4096 * 3072]]


def test_tanh_backward_reads_the_gradient_and_the_output(tmp_path):
    def backward(kernel, events):
        kernel["name"] = "void at::native::vectorized_elementwise_kernel<4, TanhBackward>(int)"
        events[0].update(name="aten::tanh_backward", args={"External id": 1, "Input Dims": [[4096, 3072], [4096, 3072]],
                                                            "Input type": ["c10::Half", "c10::Half"]})

    frame = read_kineto(_kineto_file(tmp_path, backward)).frame
    assert frame[["function", "elements"]].values.tolist() == [["mul", 4096 * 3072]]


FLASH_FORWARD = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
                 "cutlass::half_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t>>, false, true>(Flash_fwd_params)")


@pytest.mark.parametrize(("op", "dims", "concrete", "expected"), [
    # PyTorch's inner op: [batch, seq, heads, head_dim] tensors, is_causal at position 8
    ("aten::_flash_attention_forward", [[2, 1024, 32, 128], [2, 4096, 8, 128], [2, 4096, 8, 128]] + [[]] * 8,
     ["", "", "", "", "", "1024", "4096", "0.", "True", "False", ""], ["forward", 2, 32, 8, 1024, 4096, 128, True]),
    # SDPA's op: [batch, heads, seq, head_dim], is_causal at position 4
    ("aten::_scaled_dot_product_flash_attention", [[4, 16, 512, 64], [4, 16, 512, 64], [4, 16, 512, 64], [], [], []],
     ["", "", "", "0.", "False", "False"], ["forward", 4, 16, 16, 512, 512, 64, False]),
])
def test_a_flash_attention_kernel_replays_as_fused_attention(tmp_path, op, dims, concrete, expected):
    def flash(kernel, events):
        kernel["name"] = FLASH_FORWARD
        events[0].update(name=op, args={"External id": 1, "Input Dims": dims, "Input type": ["c10::Half"] * 3,
                                         "Concrete Inputs": concrete})

    frame = read_kineto(_kineto_file(tmp_path, flash)).frame
    columns = ["function", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal"]
    assert frame["kind"].tolist() == ["attention"]
    assert frame[columns].values.tolist() == [expected]


def test_a_flash_attention_helper_kernel_is_simulated_with_its_main_kernel(tmp_path):
    def combine(kernel, events):
        kernel["name"] = "void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, 4, 1>(x)"
        events[0].update(name="aten::_flash_attention_forward", args={"External id": 1})

    frame = read_kineto(_kineto_file(tmp_path, combine)).frame
    assert frame[["kind", "kernel_class", "delay_s"]].values.tolist() == [["delay", "attention", 0.0]]


def test_flash_attention_without_recorded_arguments_is_unsupported(tmp_path):
    def bare(kernel, events):
        kernel["name"] = FLASH_FORWARD
        events[0].update(name="aten::_flash_attention_forward",
                         args={"External id": 1, "Input Dims": [[2, 1024, 32, 128], [2, 1024, 32, 128]]})

    with pytest.raises(TraceError, match="is_causal not recorded"):
        read_kineto(_kineto_file(tmp_path, bare))


VLLM_OPS = {
    "act": ("void vllm::act_and_mul_kernel<c10::Half, &vllm::silu_kernel<c10::Half>, true>(c10::Half*, c10::Half "
            "const*, int)", "_C::silu_and_mul", [[64, 11008], [64, 22016]], ["c10::Half", "c10::Half"]),
    "rope": ("void vllm::rotary_embedding_kernel<c10::Half, true>(long const*, c10::Half*, c10::Half*, c10::Half "
             "const*, int, long, long, int, int, int)", "_C::rotary_embedding",
             [[64], [64, 4096], [64, 1024], [], [4096, 128], []],
             ["long int", "c10::Half", "c10::Half", "Scalar", "c10::Half", "Scalar"]),
    "norm": ("void vllm::rms_norm_kernel<c10::Half>(c10::Half*, c10::Half const*, c10::Half const*, float, int, int)",
             "_C::rms_norm", [[64, 4096], [64, 4096], [4096], []], ["c10::Half", "c10::Half", "c10::Half", "Scalar"]),
}


@pytest.mark.parametrize(("which", "expected"), [
    ("act", {"kind": "elementwise", "function": "silu_and_mul", "elements": 64 * 11008, "rows": 64}),
    ("rope", {"kind": "elementwise", "function": "rope", "elements": 64 * (4096 + 1024), "rows": 64}),
    ("norm", {"kind": "reduction", "function": "rmsnorm", "rows": 64, "cols": 4096, "kernel": "vllm"}),
])
def test_vllms_kernels_replay_as_its_per_row_kernels(tmp_path, which, expected):
    """vLLM's custom ops (``torch.ops._C``) record their tensors' shapes; the kernels give each
    token's row a workgroup (gpusim.kernels.rowreduce.vllm_row_kernel)."""
    kernel_name, op, dims, types = VLLM_OPS[which]

    def vllm(kernel, events):
        kernel["name"] = kernel_name
        events[0].update(name=op, args={"External id": 1, "Input Dims": dims, "Input type": types})

    trace = read_kineto(_kineto_file(tmp_path, vllm))
    row = trace.frame.iloc[0]
    assert {field: row[field] for field in expected} == expected and row["dtype"] == "fp16"
    result = gpusim.run(gpusim.load_system("h100-sxm5"), trace)
    assert result.ops["impl"].iloc[0] == {"act": "act_and_mul_kernel", "rope": "rotary_embedding_kernel",
                                          "norm": "rms_norm_kernel"}[which]


def test_vllms_kernels_without_shapes_or_with_another_activation_are_unsupported(tmp_path):
    def unrecorded(kernel, events):
        kernel["name"] = VLLM_OPS["act"][0]

    with pytest.raises(TraceError, match="without its op's recorded shapes"):
        read_kineto(_kineto_file(tmp_path, unrecorded))

    def gelu(kernel, events):
        kernel["name"] = VLLM_OPS["act"][0].replace("silu_kernel", "gelu_kernel")
        events[0].update(name="_C::gelu_and_mul", args={"External id": 1, "Input Dims": VLLM_OPS["act"][2],
                                                        "Input type": VLLM_OPS["act"][3]})

    with pytest.raises(TraceError, match="other than SiLU"):
        read_kineto(_kineto_file(tmp_path, gelu))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unsupported": "skip"}, "read_kineto(): unsupported must be 'error' or 'delay', got 'skip'"),
        ({"iteration": "3"}, "read_kineto(): iteration must be the whole number N of a ProfilerStep#N or None, got '3'"),
        ({"iteration": True}, "read_kineto(): iteration must be the whole number N of a ProfilerStep#N or None, got True"),
        ({"dataflow": "no"}, "read_kineto(): dataflow must be True or False, got 'no'"),
    ],
)
def test_bad_reading_options_are_config_errors_naming_the_option(tmp_path, kwargs, message):
    """They were a bare ValueError (unsupported), or looked for a 'ProfilerStep#True' (iteration), or read
    'no' as true (dataflow)."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        read_kineto(_kineto_file(tmp_path), **kwargs)
