"""Hardware description of one GPU: compute units, L2, HBM, memory controller, near-memory ALUs, DMA.

All rates are per the whole GPU unless the field says ``per_cu`` / ``per_channel``.  Timing
parameters of the DRAM are in DRAM command-clock cycles (``*_cycles``) as in datasheets; everything
else carries its unit in its name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from gpusim.config.quantities import (
    Bandwidth,
    Bytes,
    Float,
    Fraction,
    Hertz,
    Int,
    Model,
    Name,
    Nanoseconds,
    PositiveFloat,
    PositiveInt,
)

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
GEMM_WIDENING = {"tf32": ("fp32",), "fp16": ("fp32",), "bf16": ("fp32",), "fp8": ("fp16", "bf16", "fp32")}
"""Types whose matrix units compute a GEMM of another type exactly: a narrower type never runs
slower than the wider one on a GPU that lacks matrix units of its own (:meth:`CuConfig.gemm_peak`)."""
MAX_CUS = 16384
"""Most compute units a GPU description may have (64 times an H100's)."""
NMC_OPERANDS = {"mov": 1, "add": 2, "sub": 2, "mul": 2, "fma": 3, "max": 2, "shift": 2, "div": 2, "sqrt": 1}
"""The instruction set of the near-memory ALUs: each operation and its number of source operands."""
NMC_OPS = tuple(NMC_OPERANDS)
"""The near-memory ALUs' operations."""


def _one_of(known: tuple[str, ...], what: str) -> AfterValidator:
    """A check that a key of a table is among ``known`` (``what`` they are, for the message)."""

    def check(key: str) -> str:
        if key not in known:
            raise ValueError(f"unknown {what} {key!r}; known: {', '.join(known)}")
        return key

    return AfterValidator(check)


Dtype = Annotated[str, _one_of(DTYPES, "dtype")]
"""A key of a per-dtype table: one of :data:`DTYPES`."""
NmcOp = Annotated[str, _one_of(NMC_OPS, "NMC operation")]
"""A key of a per-operation table of the near-memory ALUs: one of :data:`NMC_OPS`."""


class CuConfig(Model):
    """Resources and rates of one compute unit (an SM on NVIDIA GPUs).

    Attributes
    ----------
    max_threads
        Resident threads per CU.
    max_workgroups
        Resident workgroups (thread blocks) per CU.
    wavefront_size
        Threads per wavefront (warp).
    max_wavefronts
        Resident wavefronts per CU.
    lds_bytes
        Local data share (shared memory) per CU, bytes.
    lds_bytes_per_cycle
        Local data share bandwidth per CU, bytes per cycle: 32 banks of 4 bytes on NVIDIA SMs
        since Maxwell and on CDNA CUs (the default).  Fused attention's products read their
        operands from it (:mod:`gpusim.kernels.attention`).
    lone_workgroup_lds_exposure
        Share of a kernel's shared-memory traffic time that adds to its matrix time where the CU
        holds a single workgroup of it: the workgroup's wavefronts meet at the barriers between
        its products and read their operands at once, so the reads overlap the matrix
        instructions only in part, and no other workgroup's products fill the gaps (with two or
        more resident workgroups the model hides them).  Fused attention's backward kernels use
        it.  The default is the H100's fitted value (``hwconfigs/gpus/h100-sxm5.yaml``).
    register_file_bytes
        Vector register file per CU, bytes.
    matrix_flops_per_cycle
        Dense matrix-unit (tensor/matrix core) FLOPs per cycle per CU, by input dtype (keys from
        :data:`DTYPES`, as in every per-dtype table).
    vector_flops_per_cycle
        Vector ALU FLOPs per cycle per CU, by dtype (an FMA counts 2).
    max_inflight_bytes
        Bytes of memory requests one CU can have outstanding (miss-status registers x line size);
        with the loaded memory latency this bounds one CU's memory bandwidth (Little's law).
    transcendentals_per_cycle
        Special-function results (exp2, reciprocal, square root) per cycle per CU.  The default, 16,
        is every preset's: CUDA's arithmetic-throughput table gives 16 per clock per SM for compute
        capability 7.0-9.0, and a CDNA CU's quarter-rate transcendentals are 64 / 4 (docs/model.md).
    transcendentals_on_vector_alu
        Whether those special functions issue on the vector ALUs, taking their issue slots
        (CDNA: quarter-rate VALU instructions), instead of on separate units that run beside them
        (NVIDIA's SFUs).
    int32_ops_per_cycle
        32-bit integer instructions (add, multiply-add, shift) per cycle per CU, lanes: 64 on
        Volta, Turing, Ampere and Hopper SMs (half their FP32 lanes on Ampere and Hopper) and on a
        CDNA CU (four SIMD16 units); CDNA's 32-bit multiplies issue at a quarter of that, which
        this does not model.  It paces the offset arithmetic of kernels over strided tensors.  The
        default, 64, is every preset's.
    shuffle_cycles
        Latency of one dependent step of a cross-lane reduction (a shuffle and an add), cycles.
        The default, 30, is every preset's and an estimate: set with the row-reduction model
        (stop 19), neither measured nor fitted on any GPU (docs/model.md).
    barrier_cycles
        Latency of a workgroup barrier once every wavefront has arrived, with the local data share
        round trip that follows it, cycles.  The default, 40, is every preset's and an estimate, as
        ``shuffle_cycles``.
    issue_lanes_per_cycle
        Vector instructions a CU issues per cycle, in lanes (an instruction of a whole wavefront
        counts its lanes), whichever pipe runs them: 128 on Volta, Turing, Ampere and Hopper SMs
        (four schedulers, each issuing one 32-wide warp instruction a cycle to its FP32, INT32,
        load/store or special-function pipe), 64 on a CDNA CU (four SIMD16 units, each taking four
        cycles per wave64 instruction).  Row reductions, counted in instructions, issue at this rate.
    dependent_issue_cycles
        Issue slots of its SIMD between one wavefront's consecutive instructions, apart from memory
        waits, barriers and other wavefronts' turns: each waits for the one before it (the ALU's
        latency, special-function and shared-memory results, branches), so a SIMD needs this many
        wavefronts to issue every slot.  1 (the default) lets one wavefront per SIMD fill it, as a
        CDNA wave64 instruction's four cycles hide the ALU's latency.  Row reductions use it; the
        element-wise kernels' FLOP efficiency covers it for them.
    """

    max_threads: PositiveInt = 2048
    max_workgroups: PositiveInt = 32
    wavefront_size: PositiveInt = 64
    max_wavefronts: PositiveInt = 40
    lds_bytes: Bytes = 65536
    lds_bytes_per_cycle: PositiveFloat = 128.0
    lone_workgroup_lds_exposure: Float = Field(default=0.3, ge=0, le=1)
    register_file_bytes: Bytes = 262144
    matrix_flops_per_cycle: dict[Dtype, PositiveFloat]
    vector_flops_per_cycle: dict[Dtype, PositiveFloat]
    max_inflight_bytes: Bytes = 32768
    transcendentals_per_cycle: PositiveFloat = 16.0
    transcendentals_on_vector_alu: bool = False
    int32_ops_per_cycle: PositiveFloat = 64.0
    shuffle_cycles: PositiveFloat = 30.0
    barrier_cycles: PositiveFloat = 40.0
    issue_lanes_per_cycle: PositiveFloat = 64.0
    dependent_issue_cycles: PositiveFloat = 1.0

    def vector_peak(self, dtype: str) -> float:
        """Peak vector FLOPs per cycle for ``dtype``: its own rate, else the FP32 lanes'."""
        table = self.vector_flops_per_cycle
        return table.get(dtype) or table.get("fp32") or max(table.values())

    def gemm_units(self, dtype: str) -> str | None:
        """The type whose matrix units run a GEMM of ``dtype``: its own, else the fastest of those it
        widens to exactly (:data:`GEMM_WIDENING`: TF32 on FP32 units, FP8 on FP16 or BF16 ones, as a
        GPU without units of its own computes it); ``None`` where none has matrix units."""
        candidates = [d for d in (dtype, *GEMM_WIDENING.get(dtype, ())) if self.matrix_flops_per_cycle.get(d)]
        return max(candidates, key=lambda d: self.matrix_flops_per_cycle[d], default=None)

    def gemm_peak(self, dtype: str) -> float:
        """Peak FLOPs per cycle a GEMM of ``dtype`` runs at: the matrix units' of :meth:`gemm_units`,
        else :meth:`vector_peak`."""
        units = self.gemm_units(dtype)
        return self.matrix_flops_per_cycle[units] if units else self.vector_peak(dtype)


class L2Config(Model):
    """The last-level cache shared by all CUs of a GPU.

    Attributes
    ----------
    capacity_bytes
        Total capacity.
    shared_fraction
        Fraction of the capacity that holds data all CUs read and write: the capacity of the
        simulated LRU is ``capacity_bytes x shared_fraction``.  A partitioned L2 (NVIDIA's A100 and
        Hopper: two halves joined by a crossbar) keeps some lines in both halves, so a working set
        every SM touches falls out of it before the nominal capacity.  Measured with a working-set
        sweep (``validation/measured/h200/measure.py``, section ``l2``); 1 means all of it, the
        default, which the GPUs without such a measurement or fit keep (docs/model.md).
    block_bytes
        Granularity of the simulated cache (LRU over address blocks of this size): a simulation
        granularity, not a line size (the default 16 KiB, every preset's; hits and misses are
        decided per byte present, tracked per 512-byte sector of a block, docs/model.md).
    banks, bytes_per_cycle_per_bank, clock_hz
        Together they give the L2's peak bandwidth to the CUs.  ``clock_hz`` may be left out of a
        GPU's description: it is then the GPU's SM clock (``GpuConfig.clock_hz``), as on every
        preset, and follows an override of it.
    rated_clock_hz
        The L2 clock the GPU is rated at, which its kernel library's heuristic assumes when it
        picks a GEMM kernel; ``None``: ``clock_hz`` (see :attr:`GpuConfig.rated_clock_hz`).
    sustained_efficiency
        Fraction of that peak the CUs sustain when many of them stream hits from the L2, for the
        losses the model does not simulate (slice conflicts of the address hash, the crossbar, tag
        and request queues); 1 means the peak.  Measured with an L2-resident read microbenchmark.
    write_cost
        L2 bandwidth a written byte takes, in read bytes: 1 when the L2 serves writes as fast as
        reads. Measured with the same microbenchmark scaling an L2-resident buffer in place (half
        reads, half writes) against summing it.  The default 1 stands where it was not measured
        (every preset but the Hopper ones).
    hit_latency_ns
        Load-to-use latency of an L2 hit.
    remote_writes_allocate
        Whether writes arriving over links from peer GPUs allocate in this L2 (NVIDIA-like) or go to
        DRAM (the dissertation's model, the default).
    remote_writes_through
        Whether writes arriving over links that allocate in this L2 also go on to DRAM as they
        arrive, leaving the block clean, whatever ``write_through`` says of the GPU's own writes:
        the receiving memory controller (where T3's tracker counts a fused collective's stores)
        sees them as they land.  Default ``False``: they follow ``write_through``; only the Hopper
        presets set it (an assumption, h100-sxm5.yaml).
    write_through
        Whether a write that allocates in the L2 also goes on to DRAM as it arrives, leaving the
        block clean (later reads still hit it), instead of staying dirty until it is evicted: a
        kernel pays for its own writes, not the kernels after it.  The default, write-back, is the
        simulator's original L2; it was measured only on Hopper (write-back) and chosen against
        data only for the MI210 (write-through); the other presets keep it unmeasured
        (docs/validation-log.md, stops 23 and 33).
    dirty_fraction
        Fraction of the capacity that written data may occupy while it waits for its write-back (a
        write-back L2 only).  Once the bytes written and not yet written back pass it, the oldest
        write is written back (its block stays cached): a kernel pays for its writes at the DRAM's
        pace even where it rewrites resident data, and a long write (a benchmark's L2 flush) leaves
        its last writes dirty for the kernels after it to write back as they evict them.  1 keeps
        every written block dirty until it is evicted: the default, the write-back L2 before stop
        33, which every preset keeps but the Hopper ones (fitted: 0.55).
    """

    capacity_bytes: Bytes
    shared_fraction: Fraction = 1.0
    block_bytes: Bytes = 16384
    banks: PositiveInt
    bytes_per_cycle_per_bank: Bytes = 64
    clock_hz: Hertz
    rated_clock_hz: Hertz | None = None
    sustained_efficiency: Fraction = 1.0
    write_cost: Float = Field(default=1.0, ge=1.0)
    hit_latency_ns: Nanoseconds = 200.0
    remote_writes_allocate: bool = False
    remote_writes_through: bool = False
    write_through: bool = False
    dirty_fraction: Fraction = 1.0

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Peak L2 bandwidth to the CUs, bytes/s."""
        return self.banks * self.bytes_per_cycle_per_bank * self.clock_hz

    @property
    def sustained_bandwidth_bytes_per_s(self) -> float:
        """L2 bandwidth the CUs sustain: the peak times the sustained efficiency, bytes/s."""
        return self.bandwidth_bytes_per_s * self.sustained_efficiency


class HbmConfig(Model):
    """High-bandwidth memory: stacks of channels, each with bank groups of banks and row buffers.

    Attributes
    ----------
    stacks, channels_per_stack
        Independent channels (pseudo-channels) in all = stacks x channels_per_stack.
    bank_groups, banks_per_group
        Banks per channel = bank_groups x banks_per_group.  The defaults (4 x 4) and those of
        ``row_bytes`` (2 KiB) and ``burst_bytes`` (32) are HBM2's in Accel-Sim's QV100
        configuration (``gpgpusim.config``: nbk=16, nbkgrp=4, 16-byte bus x burst length 2),
        which every HBM2/HBM2e preset repeats.
    row_bytes
        Row-buffer (page) size of one bank.
    burst_bytes
        Bytes moved by one column command (bus width x burst length).
    clock_hz
        DRAM command clock; the ``t_*_cycles`` timings count this clock.
    t_rp_cycles, t_rcd_cycles, t_ras_cycles, t_cl_cycles
        Precharge, activate-to-column, activate-to-precharge and column (CAS) latencies.  The
        defaults (14, 14, 33, 14) match Accel-Sim's QV100 timing for a 1 GHz HBM (RP, RCD, RAS,
        CL; its comment: from JESD235 and Chatterjee et al., HPCA 2017).
    t_ccd_s_cycles, t_ccd_l_cycles
        Column-to-column spacing to a different / the same bank group.  Defaults 1 and 2:
        Accel-Sim's QV100 (CCD=1, CCDL=2).
    t_ccd_wl_cycles
        Spacing after a near-bank op-and-store (read-modify-write at the bank), same bank group.
        Default 4: seeds/002 Table 8.1's CCDWL, 2 x CCDL.
    t_wtr_cycles, t_rtw_cycles
        Bus turnaround write-to-read and read-to-write.  The defaults (4 each) are estimates with
        no recorded source, which every preset but t3-table8.1 (t_wtr 3) keeps; for comparison,
        gpgpu-sim derives tWTR = 6 and tRTW = 13 cycles from Accel-Sim's QV100 timings.
    t_wr_cycles
        Write recovery: from the last write data into a bank to a precharge of that bank (default
        16 ns at 1 GHz; DRAMsim3's HBM2 configuration has tWR = 8 cycles of 2 ns).
    t_rrd_cycles, t_faw_cycles
        Activate-to-activate spacing (different banks) and the four-activate window of one
        channel (of each pseudo-channel): a channel opens at most ``pseudo_channels`` rows per
        ``max(t_rrd, t_faw / 4)``.  They limit strided traffic whose short runs each need their
        own row (transposed GEMM panels).  0 (the default) leaves activations unlimited.
    pseudo_channels
        Pseudo-channels a channel is split into (HBM2/2e's pseudo-channel mode: two halves of the
        bus with their own banks and their own activate windows, sharing the channel's command
        bus); the channel's banks and bus are simulated as one, its activate windows as this
        many (default 1).
    refresh_overhead
        Fraction of time a channel is unavailable because of refresh (a derating).  The default,
        0.04, is an estimate with no recorded source; every preset repeats it.
    sustained_efficiency
        Fraction of the (refresh-derated) data-bus rate that a channel sustains on streaming
        traffic, for losses the model does not simulate (controller scheduling at cache-line
        granularity, ECC, address-hashing conflicts, memory power states).  1 means the data bus
        reaches its timing limit; calibrated per GPU against memory-bound measurements.  The
        default 1 is kept by the V100 (a joint grid with its launch cost picked 1.0,
        docs/validation.md), the H100 and H200 (the H200's measured streams reach 0.89-0.98 of its
        4.8 TB/s, memory.csv, against the model's 0.96 after refresh), and, unmeasured, by t4 and
        t3-table8.1.
    interleave_bytes
        Consecutive addresses stay on one channel for this many bytes, then move to the next.  The
        default, 4 KiB, every preset's, is a simulation granularity (Accel-Sim's QV100 address
        mapping moves to the next channel every 256 bytes).
    capacity_bytes
        Total capacity.
    lockstep_channels
        Simulation granularity: this many physical channels are simulated as one channel working
        in lockstep (bursts, rows and interleave units ``lockstep_channels`` times wider; the same
        bandwidth and timing).  Fewer, wider channels cost fewer simulated requests.
    bank_xor
        Permutation-based bank interleaving (Zhang, Zhu and Zhang, MICRO 2000): the bank index is
        XORed with the row's bits folded to the bank index's width, as memory controllers hash
        addresses, so that streams whose addresses differ by a multiple of a channel's bank span
        (tensors of a size such as 3 x 2^22 elements on 12 channels) fall into different banks
        instead of taking turns opening rows in one.  Needs a power-of-two bank count.  ``False``
        keeps the plain rotation.
    """

    stacks: PositiveInt
    channels_per_stack: PositiveInt
    bank_groups: PositiveInt = 4
    banks_per_group: PositiveInt = 4
    row_bytes: Bytes = 2048
    burst_bytes: Bytes = 32
    clock_hz: Hertz
    t_rp_cycles: Float = Field(14, ge=0)
    t_rcd_cycles: Float = Field(14, ge=0)
    t_ras_cycles: Float = Field(33, ge=0)
    t_cl_cycles: Float = Field(14, ge=0)
    t_ccd_s_cycles: Float = Field(1, gt=0)
    t_ccd_l_cycles: Float = Field(2, gt=0)
    t_ccd_wl_cycles: Float = Field(4, gt=0)
    t_wtr_cycles: Float = Field(4, ge=0)
    t_rtw_cycles: Float = Field(4, ge=0)
    t_wr_cycles: Float = Field(16, ge=0)
    t_rrd_cycles: Float = Field(0, ge=0)
    t_faw_cycles: Float = Field(0, ge=0)
    pseudo_channels: PositiveInt = 1
    refresh_overhead: Float = Field(0.04, ge=0, lt=1)
    sustained_efficiency: Fraction = 1.0
    interleave_bytes: Bytes = 4096
    capacity_bytes: Bytes = 32 * 2**30
    lockstep_channels: PositiveInt = 1
    bank_xor: bool = False

    @model_validator(mode="after")
    def _xor_needs_power_of_two_banks(self) -> HbmConfig:
        banks = self.bank_groups * self.banks_per_group
        if self.bank_xor and banks & (banks - 1):
            raise ValueError(f"bank_xor needs a power-of-two number of banks per channel; "
                             f"bank_groups x banks_per_group = {banks}")
        return self

    @property
    def channels(self) -> int:
        """Number of physical channels."""
        return self.stacks * self.channels_per_stack

    @property
    def sim_channels(self) -> int:
        """Number of simulated (lockstep-ganged) channels."""
        return self.channels // self.lockstep_channels

    @property
    def sim_interleave_bytes(self) -> int:
        """Interleave unit of a simulated channel."""
        return int(self.interleave_bytes) * self.lockstep_channels

    @property
    def sim_row_bytes(self) -> int:
        """Row-buffer size of a simulated channel's bank (the lockstep rows together)."""
        return int(self.row_bytes) * self.lockstep_channels

    @property
    def sim_burst_bytes(self) -> int:
        """Bytes of one column command of a simulated channel."""
        return int(self.burst_bytes) * self.lockstep_channels

    @property
    def banks_per_channel(self) -> int:
        """Banks in one channel."""
        return self.bank_groups * self.banks_per_group

    @property
    def channel_bandwidth_bytes_per_s(self) -> float:
        """Peak data-bus bandwidth of one physical channel, bytes/s."""
        return self.burst_bytes * self.clock_hz / self.t_ccd_s_cycles

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Peak bandwidth of all channels together, bytes/s."""
        return self.channels * self.channel_bandwidth_bytes_per_s

    @property
    def sustained_bandwidth_bytes_per_s(self) -> float:
        """Bandwidth of all channels on streaming traffic: peak less refresh and the sustained efficiency, bytes/s."""
        return self.bandwidth_bytes_per_s * (1.0 - self.refresh_overhead) * self.sustained_efficiency

    @model_validator(mode="after")
    def _check_geometry(self) -> HbmConfig:
        if self.interleave_bytes % self.burst_bytes:
            raise ValueError(
                f"interleave_bytes ({self.interleave_bytes:.0f}) must be a multiple of burst_bytes "
                f"({self.burst_bytes:.0f})"
            )
        if self.t_ccd_l_cycles < self.t_ccd_s_cycles:
            raise ValueError("t_ccd_l_cycles must be at least t_ccd_s_cycles")
        if self.channels % self.lockstep_channels:
            raise ValueError(
                f"lockstep_channels ({self.lockstep_channels}) must divide the channel count ({self.channels})"
            )
        return self


class McaConfig(Model):
    """T3's communication-aware memory-controller arbitration (dissertation section 8.3.5).

    Attributes
    ----------
    thresholds
        Candidate queue-occupancy thresholds as fractions of the queue size, most restrictive
        first; the last may be ``1.0`` (no limit).  The dissertation's 5, 10, 30 of Accel-Sim's
        64-entry queue and "no limit" are the defaults.
    intensity_cutoffs
        Memory intensity (mean queue occupancy fraction observed during the kernel's first,
        isolated stage) above which the threshold at the same index is chosen.  The defaults are
        this model's: the dissertation does not give its mapping (docs/t3.md).
    starvation_limit_ns
        The communication stream is served regardless once it has waited this long.  The default,
        20 us, is an estimate: the dissertation gives no value.
    """

    thresholds: tuple[Float, ...] = (5 / 64, 10 / 64, 30 / 64, 1.0)
    intensity_cutoffs: tuple[Float, ...] = (0.5, 0.25, 0.1, 0.0)
    starvation_limit_ns: Nanoseconds = 20000.0

    @model_validator(mode="after")
    def _check(self) -> McaConfig:
        if len(self.thresholds) != len(self.intensity_cutoffs):
            raise ValueError("thresholds and intensity_cutoffs must have the same length")
        return self


class MemCtrlConfig(Model):
    """Memory controller, one per HBM channel.

    Attributes
    ----------
    queue_entries
        Capacity of the request queue; a full queue back-pressures requesters.  Every preset sets
        16, t3-table8.1's reading of Accel-Sim's QV100 queue (64 entries) held as fewer, larger
        requests; the default 32 has no recorded source.
    max_request_bytes
        Largest single request (contiguous bytes of one channel) the controller schedules: a
        simulation granularity (the default 16 KiB, every preset's; real requests are 32-128 B).
    policy
        Default arbitration policy name (see :mod:`gpusim.hw.memctrl`).  The default,
        ``fr-fcfs``, is Accel-Sim's QV100 scheduler (``-gpgpu_dram_scheduler 1``).
    latency_ns
        Fixed latency added to each DRAM access for the on-chip network and controller pipeline.
    schedule_window_ns
        The controller commits requests to the channel up to this far ahead of the data bus
        (its command queue); arrivals within the window cannot overtake committed requests.
        Larger windows cost fewer simulation events.  A simulation knob: the default, 200 ns,
        every preset's, is not a hardware value.
    mca
        Parameters of the T3-MCA policy.
    """

    queue_entries: PositiveInt = 32
    max_request_bytes: Bytes = 16384
    policy: str = "fr-fcfs"
    latency_ns: Nanoseconds = 250.0
    schedule_window_ns: Nanoseconds = 200.0
    mca: McaConfig = McaConfig()


class NmcConfig(Model):
    """Near-bank ALUs in the HBM (dissertation sections 2.5.2, 6.2.2, 8.3.3).

    Every ALU executes the instructions the GPU broadcasts to all channels; all banks of a channel
    run the same instruction (all-bank mode).  An instruction processes one column (``simd_bytes``
    of SIMD words) per column command; back-to-back commands are ``t_ccd_l`` apart, an
    op-and-store (read, combine and write back the same column) ``t_ccd_wl`` (dissertation section
    8.4.1: "NMC operations can be issued ... with the same column-to-column access (CCDL) delay").

    Attributes
    ----------
    enabled
        Whether the memory supports op-and-store and NMC commands.  The default (``True``) is the
        dissertation's proposed compute-enhanced HBM, not a product's: every HBM preset inherits
        it so that its near-memory what-ifs (T3, the optimizer offload) run; t4 turns it off.
    banks_per_alu
        1 for an ALU at every bank; 4 for one per bank group of 4, and so on.
    temp_storage_bytes
        Temporary storage (registers) per ALU.  The default, 256 B per bank, is Samsung HBM-PIM's
        general register file (Lee et al., ISCA 2021: 16 x 256-bit entries per unit shared by two
        banks).
    simd_bytes
        Data width of an ALU; the bank's column (burst) width.  A narrower ALU needs several passes
        per column.
    op_cycles
        ALU issue cycles (DRAM command clock) per ``simd_bytes`` of data, by operation; an
        instruction costs the larger of this and its column spacing.  The operations of section
        6.2.2 (add, mul and their fused forms, shift, scale by an immediate) issue every cycle.
        Divide and square root are not in section 6.2.2; the default assumes an iterative unit
        (8 cycles per SIMD word, e.g. radix-8 digit recurrence over a 24-bit mantissa).
        Operations not listed are not supported; a key that is not an operation of the instruction
        set (:data:`NMC_OPS`) is an error.
    """

    enabled: bool = True
    banks_per_alu: PositiveInt = 1
    temp_storage_bytes: Bytes = 256
    simd_bytes: Bytes = 32
    op_cycles: dict[NmcOp, Float] = {
        "mov": 1.0,
        "add": 1.0,
        "sub": 1.0,
        "mul": 1.0,
        "fma": 1.0,
        "max": 1.0,
        "shift": 1.0,
        "div": 8.0,
        "sqrt": 8.0,
    }

    @model_validator(mode="after")
    def _check_ops(self) -> NmcConfig:
        for op, cycles in self.op_cycles.items():
            if cycles <= 0:
                raise ValueError(f"op_cycles[{op!r}] must be positive, got {cycles}")
        return self


class DmaConfig(Model):
    """DMA (copy) engines of one GPU.

    The defaults (4 engines of 100 GB/s, 256 commands, 64 KiB blocks, 500 ns set-up) are estimates
    with no recorded source.  Every preset sets its engines and rate and takes the command queue
    from here, and all but t3-table8.1 the block size and set-up too.

    Attributes
    ----------
    engines
        Independent engines.
    queue_entries
        Commands an engine can hold.
    bandwidth_bytes_per_s
        Peak rate of one engine.
    block_bytes
        Granularity at which an engine reads and sends data.
    setup_ns
        Time from a command becoming ready to its first read.
    """

    engines: PositiveInt = 4
    queue_entries: PositiveInt = 256
    bandwidth_bytes_per_s: Bandwidth = 100e9
    block_bytes: Bytes = 65536
    setup_ns: Nanoseconds = 500.0


class TrackerConfig(Model):
    """T3's tracker at the memory controllers (dissertation section 8.3.2.1).

    A set-associative table of counters, one entry per producer workgroup tile being tracked; it
    counts the bytes of local, remote and DMA updates to the tile as they enter the memory
    controllers' queues and fires the tile's pre-programmed action at a threshold.

    Attributes
    ----------
    sets
        Sets of the table, indexed by the low bits of the tile (workgroup) index.  Default 256: the
        dissertation's 256 sets indexed by the workgroup id's low 8 bits (section 8.3.2.1).
    ways
        Entries per set.  When a tile needs an entry and its set is full, the least recently
        updated entry is spilled to memory (and refilled when next updated).  Default 8: the
        dissertation tags a set's entries by wavefront (3 bits, eight wavefronts a workgroup); the
        entries here are workgroup tiles, so the default holds 2048 workgroup tiles where the
        dissertation's 19 KB table holds about 2048 wavefront tiles (``ways=1`` is that capacity
        in workgroup tiles; docs/t3.md).
    entry_bytes
        Size of one entry (virtual address, counter, tag): what a spill writes and a refill reads.
        Default 32, an estimate: one 32-byte DRAM access (the dissertation's 19 KB over its
        entries is about 9.5 bytes each).
    """

    sets: PositiveInt = 256
    ways: PositiveInt = 8
    entry_bytes: Bytes = 32


class GemmFallbackConfig(Model):
    """The GEMM kernels a GPU's BLAS falls back to when an operand's rows are not 16-byte aligned.

    The main kernels of some architectures load their operands with copies that need every row to
    start on a 16-byte boundary (Hopper's TMA needs 16-byte global strides; Ampere's multi-stage
    ``cp.async`` copies 16 bytes).  A GEMM with a row length such as 7133 fp16 values runs in
    register-staged kernels instead (CUTLASS's Turing-era ``cutlass_75_..._align1``: ``mma.sync``
    tensor-core instructions, two LDS stages, loads as wide as the rows' alignment allows);
    :mod:`gpusim.kernels.gemm` models them as the ``_V<bytes>`` variants of the library's kernels.

    Attributes
    ----------
    mma_fraction
        Rate of the fallback kernels' matrix instructions as a fraction of the main kernels'
        sustained rate (``gemm_efficiency`` times the peak), for dtypes with matrix units: the
        legacy ``mma.sync`` path on Hopper, which does not reach ``wgmma``'s rate.
    access_cycles
        CU cycles one narrow access costs the workgroup that issues it: a fallback kernel moves
        each K-tile of A and B, and its output tile, in accesses of its vector width (2, 4 or 8
        bytes), each a global load or store, its store to LDS and the address and bounds
        arithmetic of an unaligned row; the same warps issue the matrix instructions, so the
        accesses add to the K-tile's arithmetic time.
    """

    mma_fraction: Fraction
    access_cycles: Float = Field(ge=0)


class GemmTmaConfig(Model):
    """GEMM kernels whose operands arrive by a tensor memory accelerator (Hopper's TMA).

    A TMA copy is one bulk request of a whole tile into shared memory, tracked by a barrier in
    shared memory, not by per-thread load slots: the bytes a workgroup keeps in flight are
    bounded by its kernel's pipeline stages, not by the CU's ``cu.max_inflight_bytes`` (which
    stays the bound of per-thread loads, including the fallback kernels').

    Attributes
    ----------
    cluster_size
        Workgroups of a thread-block cluster (1: no clusters): neighbouring output tiles along M
        or N whose shared operand panel is multicast, so that the L2 serves it once per cluster,
        each workgroup requesting its share (:func:`gpusim.kernels.gemm.multicast`).
    """

    cluster_size: PositiveInt = 1


class VoltageScalingConfig(Model):
    """How the supply voltage of the SMs and the L2 follows the SM clock (a what-if: no preset sets it).

    Dynamic energy per operation scales with the square of the voltage.  With this section the
    voltage at SM clock ``f`` is ``V(f) / V(reference) = max(floor, 1 - slope * (1 - f /
    reference_clock_hz))`` (above the reference clock it rises along the same line), and the
    matrix and vector units' and the L2's prices are multiplied by ``(V(f) / V(reference))^2``;
    idle power, the DRAM, the near-bank ALUs and the links keep theirs.  Without it the voltage is
    held at every clock.

    Attributes
    ----------
    reference_clock_hz
        The SM clock at which the power section's prices hold (where they were fitted), Hz.
    slope
        Relative voltage change per relative clock change, ``(dV / V) / (df / f)``: 0 holds the
        voltage, 1 makes it proportional to the clock.
    floor
        The lowest voltage, as a fraction of the reference clock's.
    """

    reference_clock_hz: Hertz
    slope: Float = Field(ge=0, le=2)
    floor: Fraction

    def factor(self, clock_hz: float) -> float:
        """``(V(clock_hz) / V(reference))^2``: what the dynamic prices are multiplied by at that SM clock."""
        return max(self.floor, 1.0 - self.slope * (1.0 - clock_hz / self.reference_clock_hz)) ** 2


class PowerConfig(Model):
    """What the GPU's activity costs in energy (:mod:`gpusim.energy`).

    The model is activity-based: every quantity the simulation counts (full-rate work of the matrix
    and vector units, L2 traffic, DRAM row activations, bytes moved inside and out of the DRAM dies,
    near-bank ALU work, link bytes) costs a fixed energy, and the GPU draws ``idle_watts`` for as
    long as the run lasts.  The clock does not react to power by itself: a run whose average
    exceeds ``tdp_watts`` is flagged, where real hardware would lower its clock, and
    :func:`gpusim.power_limit.run_within_power_limit` finds the clock that keeps within it.

    Attributes
    ----------
    tdp_watts
        The board's power limit, W.
    idle_watts
        Drawn with the clocks up and no kernel running, W (leakage, clocks, fans' share, the
        memory's refresh and background power).
    matrix_pj_per_cu_cycle
        Energy of one CU's matrix units (and the operand traffic that feeds them: register file,
        shared memory) in a cycle at their peak rate, pJ.  A FLOP costs this divided by the CU's
        peak FLOPs per cycle for the units it runs on, so a type with twice the peak costs half the
        energy per FLOP, and neither the clock (unless ``voltage_scaling`` says the voltage follows
        it) nor the number of CUs changes it.  Times the CUs and
        the clock it is the units' power at peak.
    vector_pj_per_cu_cycle
        The same for one CU's vector (CUDA-core, SIMD) units at their peak rate, pJ.
    l2_pj_per_byte
        Energy of a byte read from or written to the L2, including the on-chip network, pJ.
    dram_activate_nj
        Energy of one activation (and precharge) of a physical row of ``hbm.row_bytes``, nJ.
    dram_array_pj_per_byte
        Energy of a byte read or written in a bank and carried across the DRAM die to its I/O
        (column access and on-die data movement), pJ.  An op-and-store reads and writes the bank:
        it costs this twice.
    dram_io_pj_per_byte
        Energy of a byte crossing between the DRAM stack and the GPU (through-silicon vias, the
        interposer and both ends' PHYs), pJ.
    nmc_bank_pj_per_byte
        Energy of a byte that a near-bank ALU reads or writes in its own bank: the column access
        without the trip across the die, pJ.
    nmc_alu_pj_per_byte
        Energy of a near-bank ALU's arithmetic per byte of operands it reads, pJ.
    link_pj_per_byte
        Energy of a byte this GPU sends over its links or the switch (SerDes at both ends), pJ.
    voltage_scaling
        How the voltage, and with it the matrix, vector and L2 prices, follows the SM clock
        (:class:`VoltageScalingConfig`); ``None``: held at every clock.
    """

    tdp_watts: PositiveFloat
    idle_watts: PositiveFloat
    matrix_pj_per_cu_cycle: Float = Field(ge=0)
    vector_pj_per_cu_cycle: Float = Field(ge=0)
    l2_pj_per_byte: Float = Field(ge=0)
    dram_activate_nj: Float = Field(ge=0)
    dram_array_pj_per_byte: Float = Field(ge=0)
    dram_io_pj_per_byte: Float = Field(ge=0)
    nmc_bank_pj_per_byte: Float = Field(ge=0)
    nmc_alu_pj_per_byte: Float = Field(ge=0)
    link_pj_per_byte: Float = Field(ge=0)
    voltage_scaling: VoltageScalingConfig | None = None

    @model_validator(mode="after")
    def _idle_below_limit(self) -> PowerConfig:
        if self.idle_watts >= self.tdp_watts:
            raise ValueError(f"idle_watts ({self.idle_watts:g}) must be below tdp_watts ({self.tdp_watts:g})")
        return self


class GpuConfig(Model):
    """One GPU.

    Attributes
    ----------
    name, description, vendor
        Identification; ``sources`` lists where the numbers came from.
    num_cus
        Compute units (SMs), at most :data:`MAX_CUS` (each is simulated: a what-if beyond it would
        only exhaust the simulator's memory).
    clock_hz
        Compute clock.
    rated_clock_hz
        The compute clock the GPU is rated at, which its kernel library's heuristic assumes when it
        picks a GEMM kernel (:meth:`as_rated`); ``None``: ``clock_hz``.  A power limit lowers
        ``clock_hz`` below it (:mod:`gpusim.power_limit`) without the library knowing, so a
        throttled GPU runs the kernels it would run unthrottled.
    gemm_efficiency
        Calibrated fraction of the matrix-unit peak that GEMM inner loops sustain, per dtype (the
        one efficiency per GPU and dtype DESIGN.md allows).
    vector_efficiency
        Calibrated fraction of the vector peak that element-wise kernels sustain.
    kernel_launch_ns
        What one launch call costs the host thread that issues the rank's kernels (the framework's
        per-call cost), which is also when the kernel of an idle GPU starts after the call began;
        the host issues its launches one after another without waiting for the GPU
        (:mod:`gpusim.sched.executor`).
    kernel_device_ns
        The GPU's own cost of a kernel beyond its workgroups' work: between its last workgroup's
        end and its completion (the grid's memory flush and completion signal; with the set-up
        before its first workgroup, which the model folds in here), ns.  A profiler's kernel
        durations include it; the next kernel of the same queue waits for it, a concurrent one
        does not.  Measured as the smallest kernels' durations in profiles less the model's span
        of those kernels.
    dependent_launch_ns
        Gap between a kernel's end and the start of the next kernel already queued behind it (by
        the host running ahead, or by the same library call, as a split-K GEMM's reduction): the
        command processor's completion-to-dispatch latency, with no host in the loop.  The default
        is the A100's, measured in a public Kineto trace (``validation/calibration/launch_gaps.py``).
    gemm_pipeline_stages
        Shared-memory stages of the architecture's BLAS GEMM kernels: K-tiles held in LDS, the one
        being computed and those loaded ahead of it.  2 (double buffering) where loads pass
        through registers (Volta, Turing, CDNA); more with asynchronous copies (Ampere's
        ``cp.async``, Hopper's TMA), whose kernels keep several K-tiles in flight.  A
        double-buffered library kernel runs with this many stages, fewer if they would not fit
        in LDS (:func:`gpusim.kernels.gemm.pipelined`).
    gemm_k_tile_bytes
        Bytes of each input row that the architecture's BLAS GEMM kernels stage per K-tile, or
        ``None`` for the library's own depths (:data:`gpusim.kernels.gemm.LIBRARY`).  Hopper's TMA
        kernels load 128-byte swizzled rows (64 fp16 values): their K-tiles are that deep whatever
        the macro tile, which also sets the contiguous runs of a transposed operand in DRAM
        (:func:`gpusim.kernels.gemm.library_for`).
    gemm_tma
        The architecture's BLAS GEMM kernels load their operands with a tensor memory accelerator
        (Hopper's TMA; :class:`GemmTmaConfig`), or ``None`` (per-thread loads).  An override of
        one of its fields on a GPU without it (``gpu.gemm_tma.cluster_size=2``) gives the GPU TMA
        kernels (:mod:`gpusim.config.loader`).
    gemm_fallback
        The kernels for operands whose rows are not 16-byte aligned (:class:`GemmFallbackConfig`),
        or ``None`` where the BLAS runs them in its main kernels at their rate: where those already
        stage loads through registers (Volta, Turing, CDNA), narrower loads are all that changes,
        and DeepBench's unaligned GEMMs on a V100 run at their aligned neighbours' rate.
    gemv_kernels
        The BLAS runs GEMMs with one output row or column per batch entry (``m == 1`` or
        ``n == 1``) as matrix-vector kernels that stream the matrix once
        (:mod:`gpusim.kernels.gemv`), as cuBLAS does on Volta, Turing and Ampere
        (``gemv2T_kernel_val``, ``gemvx``); ``False``: as tile kernels, as PyTorch's cuBLASLt does
        on Hopper (8-row ``nvjet`` tiles, ``validation/measured/h200/gemm_kernels.csv``).
    gemm_selection
        How the BLAS picks the kernel of a GEMM whose op names none
        (:mod:`gpusim.kernels.gemm_selection`): ``heuristic``, by the library heuristic's estimate
        (:func:`gpusim.kernels.gemm.choose_kernel`), as the shipped libraries pick, so that more
        CUs or a faster memory can switch to a kernel that simulates slower (docs/model.md);
        ``tuned``, by simulating the heuristic's pick and the best-estimated other kernels of the
        library alone on this GPU and keeping the fastest, as a library tuned for this hardware
        would ship (for what-if hardware; a few extra simulations per GEMM shape). Every preset
        is calibrated with ``heuristic``.
    hardware_queues
        Hardware queues the runtime spreads streams over (HIP's ``GPU_MAX_HW_QUEUES``, CUDA's
        ``CUDA_DEVICE_MAX_CONNECTIONS``); streams beyond it share queues, whose kernels run one
        after another (:mod:`gpusim.hw.queues`).
    dispatch_policy
        How the workgroup dispatcher shares the CUs between concurrent kernels
        (:class:`gpusim.hw.compute.Dispatcher`): ``round_robin``, the kernels take turns placing one
        workgroup each; ``fifo``, the earliest kernel places all it can first and later kernels
        get what is left (NVIDIA's dispatch, measured on the H100 and H200).  The default,
        ``round_robin``, is the model's original policy, kept where nothing was measured (the
        NVIDIA presets other than Hopper's) and for the MI100, whose concurrent workgroups the
        dissertation describes as interleaved (docs/concurrency.md, stop 20).
    streaming_inflight_bytes_per_thread
        Bytes each thread of an element-wise kernel keeps in flight (load width times the loads it
        issues before using the first): the memory-level parallelism of the framework's streaming
        kernels on this GPU.  With the miss latency it bounds a workgroup's bandwidth (Little's
        law); calibrated per GPU.  (Row reductions load what their kernel's geometry says,
        :mod:`gpusim.kernels.rowreduce`.)  The default, 16 (one 16-byte vector per thread), was the
        core's fixed value before this field existed; the MI210's fit chose it too (stop 19), and
        the other presets take it without a fit of their own.
    power
        Energy per unit of activity and the power limit (:class:`PowerConfig`), or ``None`` where
        the preset has no power model (:func:`gpusim.energy.energy` then says so).
    """

    name: Name
    description: str = ""
    vendor: Literal["nvidia", "amd", "other"] = "other"
    sources: list[str] = []
    num_cus: Annotated[PositiveInt, Field(le=MAX_CUS)]
    clock_hz: Hertz
    rated_clock_hz: Hertz | None = None
    cu: CuConfig
    gemm_efficiency: dict[Dtype, Fraction] = {"fp16": 0.8, "bf16": 0.8, "fp32": 0.8}
    vector_efficiency: Fraction = 0.5
    kernel_launch_ns: Nanoseconds = 5000.0
    kernel_device_ns: Nanoseconds = 0.0
    dependent_launch_ns: Nanoseconds = 1200.0
    gemm_pipeline_stages: Int = Field(2, ge=2)
    gemm_k_tile_bytes: Bytes | None = None
    gemm_tma: GemmTmaConfig | None = None
    gemm_fallback: GemmFallbackConfig | None = None
    gemv_kernels: bool = False
    gemm_selection: Literal["heuristic", "tuned"] = "heuristic"
    hardware_queues: PositiveInt = 4
    dispatch_policy: Literal["round_robin", "fifo"] = "round_robin"
    streaming_inflight_bytes_per_thread: Bytes = 16
    l2: L2Config
    hbm: HbmConfig
    memctrl: MemCtrlConfig = MemCtrlConfig()
    nmc: NmcConfig = NmcConfig()
    dma: DmaConfig = DmaConfig()
    tracker: TrackerConfig = TrackerConfig()
    power: PowerConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _l2_at_the_sm_clock(cls, data: Any) -> Any:
        """An L2 without a clock of its own runs at the SM clock (:attr:`L2Config.clock_hz`)."""
        if isinstance(data, dict) and isinstance(data.get("l2"), dict) and "clock_hz" not in data["l2"] \
                and "clock_hz" in data:
            return {**data, "l2": {**data["l2"], "clock_hz": data["clock_hz"]}}
        return data

    def as_rated(self) -> GpuConfig:
        """This GPU at its rated SM and L2 clocks, as its kernel library sees it (itself when it runs
        at them)."""
        if self.rated_clock_hz is None and self.l2.rated_clock_hz is None:
            return self
        l2 = self.l2.model_copy(update={"clock_hz": self.l2.rated_clock_hz or self.l2.clock_hz, "rated_clock_hz": None})
        return self.model_copy(update={"clock_hz": self.rated_clock_hz or self.clock_hz, "rated_clock_hz": None, "l2": l2})

    @property
    def unloaded_miss_latency_ns(self) -> float:
        """Latency of an L2 miss on an idle memory: L2, network, activate, column, one burst train, ns."""
        hbm = self.hbm
        transfer = hbm.interleave_bytes / hbm.channel_bandwidth_bytes_per_s * 1e9  # one unit of one channel
        dram = (hbm.t_rcd_cycles + hbm.t_cl_cycles) / hbm.clock_hz * 1e9
        return self.l2.hit_latency_ns + self.memctrl.latency_ns + dram + transfer

    def matrix_flops_per_s(self, dtype: str) -> float:
        """Peak matrix FLOP/s of the whole GPU for ``dtype`` (0 when it has no matrix unit for it)."""
        return self.num_cus * self.cu.matrix_flops_per_cycle.get(dtype, 0.0) * self.clock_hz

    def vector_flops_per_s(self, dtype: str) -> float:
        """Peak vector FLOP/s of the whole GPU for ``dtype``."""
        return self.num_cus * self.cu.vector_flops_per_cycle.get(dtype, 0.0) * self.clock_hz

    def gemm_math(self, dtype: str) -> tuple[Literal["matrix", "vector"], float]:
        """The units a GEMM (or attention) of ``dtype`` runs on and their peak FLOPs per cycle of one
        CU (:meth:`CuConfig.gemm_units`, :meth:`CuConfig.gemm_peak`)."""
        units = "matrix" if self.cu.gemm_units(dtype) else "vector"
        return units, self.cu.gemm_peak(dtype)

    def vector_math(self, dtype: str) -> tuple[Literal["vector"], float]:
        """The vector units and their peak FLOPs per cycle of one CU for ``dtype``
        (:meth:`CuConfig.vector_peak`)."""
        return "vector", self.cu.vector_peak(dtype)
