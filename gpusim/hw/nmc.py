"""Near-bank ALUs: their instructions, temporary storage, and the timing of all-bank broadcasts.

The model follows the dissertation's sections 2.5.2 and 6.2.2:

* An ALU sits at every bank (or is shared by ``banks_per_alu`` banks of a channel).  It is as wide
  as a column and works on SIMD words; its temporary storage (``temp_storage_bytes``) holds its
  registers.
* The GPU broadcasts every instruction to all channels and all banks of a channel execute it
  (all-bank mode).  Every ALU runs the same command stream on its share of the data, so the time
  of one ALU is the time of the whole memory.
* Data mapping: every tensor is spread over all banks alike, so element ``i`` of every tensor
  lives in the same bank; different tensors are different rows of that bank.
* A program (the element-wise steps of an optimizer) runs over a *tile* of columns at a time.
  Each register holds one tile, so a tile is as many columns as the temporary storage allows,
  ``(storage - accumulators) / (registers x banks_per_alu)``, aligned to rows.  An instruction
  that needs a tensor whose row is not open switches rows: precharge (no earlier than tRAS after
  the activation and tWR after the last write) then activate (tRP + tRCD).  A switch overlaps the
  register-only instructions before it.  Larger storage means more columns per activation.
* Each instruction processes its columns one column command apart: ``t_ccd_l``, ``t_ccd_wl`` for
  an op-and-store (read, combine and write back the same column), or the ALU's issue time per
  column when that is longer.  A read after a write to the same bank waits ``t_wtr``.
* Accumulators (one column each) gather partial sums across tiles (the L2 norms of LAMB).  The
  epilogue of a broadcast writes them into the bank; the GPU reads them, reduces them and sends
  the result back as an immediate of a later broadcast.
* Refresh derates the whole schedule by ``1 / (1 - refresh_overhead)``.

Not modelled: ALU pipeline latency between dependent instructions (hidden when a tile has more
columns than the pipeline has stages), the four-activation window (tFAW) for all-bank
activations, and reuse of a row across consecutive tiles.

Granularity (DESIGN.md section 6): the schedule of a tile is computed once per program and tile
size (arithmetic, cached); a whole broadcast over a tensor is a few multiplications, and a
sequence of broadcasts costs one simulation event.

Operand syntax of an instruction ``"op dst src..."``: ``r0, r1...`` are tile registers, ``a0,
a1...`` accumulators, ``#name`` an immediate sent with the command, and any other name a tensor
in memory.  Operations and their operands: ``mov d a``, ``add d a b``, ``sub d a b``, ``mul d a
b``, ``max d a b``, ``fma d a b c`` (``a * b + c``), ``div d a b``, ``sqrt d a``, ``shift d a b``
(``a * 2**b``).  An instruction reads at most one tensor; it may write a tensor, and writing the
tensor it reads is an op-and-store.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from gpusim.config.gpu import NMC_OPERANDS, GpuConfig, HbmConfig
from gpusim.engine.simulation import Span
from gpusim.units import cycles_to_ns

if TYPE_CHECKING:
    from gpusim.hw.gpu import Gpu


PARTIALS = "partials"
"""The tensor (a row per bank) into which a broadcast's epilogue writes its accumulators."""

READ = "read"
WRITE = "write"
UPDATE = "update"
ALU = "alu"


@dataclass(frozen=True)
class Operand:
    """One operand: a register (``reg``), an accumulator (``acc``), an immediate (``imm``) or a tensor (``mem``)."""

    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Operand:
        """Read ``r3``, ``a0``, ``#beta1`` or a tensor name."""
        if text.startswith("#") and len(text) > 1:
            return cls("imm", text[1:])
        if len(text) > 1 and text[0] in "ra" and text[1:].isdigit():
            return cls("reg" if text[0] == "r" else "acc", text)
        if text.isidentifier():
            return cls("mem", text)
        raise ValueError(f"bad operand {text!r}: expected r<N>, a<N>, #<immediate> or a tensor name")

    def __str__(self) -> str:
        return f"#{self.name}" if self.kind == "imm" else self.name


@dataclass(frozen=True)
class Instruction:
    """One broadcast instruction: ``dst = op(srcs)`` on every column of a tile (or of an accumulator)."""

    op: str
    dst: Operand
    srcs: tuple[Operand, ...]

    @classmethod
    def parse(cls, text: str) -> Instruction:
        """Read ``"fma r1 r0 #beta1 r1"``; raise ``ValueError`` naming what is wrong."""
        words = text.split()
        if not words or words[0] not in NMC_OPERANDS:
            raise ValueError(f"instruction {text!r}: unknown operation; known: {', '.join(NMC_OPERANDS)}")
        op = words[0]
        if len(words) != 2 + NMC_OPERANDS[op]:
            raise ValueError(f"instruction {text!r}: {op} takes a destination and {NMC_OPERANDS[op]} source(s)")
        dst, *srcs = (Operand.parse(word) for word in words[1:])
        instruction = cls(op, dst, tuple(srcs))
        instruction._check(text)
        return instruction

    def _check(self, text: str) -> None:
        if self.dst.kind == "imm":
            raise ValueError(f"instruction {text!r}: the destination cannot be an immediate")
        tensors = {src.name for src in self.srcs if src.kind == "mem"}
        if len(tensors) > 1:
            raise ValueError(f"instruction {text!r}: reads {len(tensors)} tensors; an ALU reads one row at a time")
        if self.dst.kind == "mem" and tensors and tensors != {self.dst.name}:
            raise ValueError(f"instruction {text!r}: may only write back the tensor it reads (op-and-store)")
        if self.dst.kind == "acc":
            addend = self.srcs[-1]
            if self.op not in ("add", "fma") or addend != self.dst or self.dst in self.srcs[:-1]:
                raise ValueError(f"instruction {text!r}: an accumulator is only updated as 'add aK x aK' or 'fma aK x y aK'")

    @property
    def tensor(self) -> str | None:
        """The tensor whose row the instruction needs, if any."""
        for operand in (self.dst, *self.srcs):
            if operand.kind == "mem":
                return operand.name
        return None

    @property
    def access(self) -> str:
        """``read``, ``write``, ``update`` (op-and-store) or ``alu`` (registers only)."""
        reads = any(src.kind == "mem" for src in self.srcs)
        if self.dst.kind == "mem":
            return UPDATE if reads else WRITE
        return READ if reads else ALU

    @property
    def per_tile(self) -> bool:
        """Whether it processes every column of a tile, or one column (setting an accumulator from
        immediates, or storing accumulators)."""
        if self.dst.kind == "acc":
            return any(src.kind not in ("imm", "acc") for src in self.srcs)
        if self.dst.kind == "mem":
            return any(src.kind != "acc" for src in self.srcs)
        return True

    def __str__(self) -> str:
        return " ".join([self.op, str(self.dst), *(str(src) for src in self.srcs)])


@dataclass(frozen=True)
class NmcProgram:
    """The instructions one broadcast runs over every tile of a tensor's share of each bank.

    Parameters
    ----------
    name
        Label in results and timelines.
    body
        Instructions (text, see the module docstring) executed once per tile.

    A prologue that clears the accumulators and an epilogue that writes them into the
    :data:`PARTIALS` row are added automatically.
    """

    name: str
    body: tuple[Instruction, ...]

    @classmethod
    def from_text(cls, name: str, lines: Iterable[str]) -> NmcProgram:
        """Parse a program; errors name the program and the instruction."""
        body = []
        for line in lines:
            try:
                body.append(Instruction.parse(line))
            except ValueError as exc:
                raise ValueError(f"NMC program {name!r}: {exc}") from None
        if not body:
            raise ValueError(f"NMC program {name!r} has no instructions")
        return cls(name, tuple(body))

    @cached_property
    def registers(self) -> int:
        """Tile registers the body uses (highest index + 1)."""
        return 1 + max((int(op.name[1:]) for ins in self.body for op in (ins.dst, *ins.srcs) if op.kind == "reg"), default=-1)

    @cached_property
    def accumulators(self) -> tuple[str, ...]:
        """Accumulators the body updates, in index order."""
        names = {op.name for ins in self.body for op in (ins.dst, *ins.srcs) if op.kind == "acc"}
        return tuple(sorted(names, key=lambda name: int(name[1:])))

    @cached_property
    def prologue(self) -> tuple[Instruction, ...]:
        """Clear the accumulators."""
        return tuple(Instruction("mov", Operand("acc", acc), (Operand("imm", "0"),)) for acc in self.accumulators)

    @cached_property
    def epilogue(self) -> tuple[Instruction, ...]:
        """Write the accumulators into the partial-sum row."""
        return tuple(Instruction("mov", Operand("mem", PARTIALS), (Operand("acc", acc),)) for acc in self.accumulators)

    @cached_property
    def ops(self) -> frozenset[str]:
        """Operations the program needs."""
        return frozenset(ins.op for ins in self.body)

    @cached_property
    def tensors_read(self) -> tuple[str, ...]:
        """Tensors some instruction reads, in first-use order."""
        return tuple(dict.fromkeys(ins.tensor for ins in self.body if ins.access in (READ, UPDATE)))

    @cached_property
    def tensors_written(self) -> tuple[str, ...]:
        """Tensors some instruction writes, in first-use order."""
        return tuple(dict.fromkeys(ins.tensor for ins in self.body if ins.access in (WRITE, UPDATE)))

    @cached_property
    def immediates(self) -> tuple[str, ...]:
        """Names of the immediates the GPU sends with the program."""
        names = (op.name for ins in self.body for op in ins.srcs if op.kind == "imm")
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class BankTiming:
    """DRAM timings that near-bank instructions obey, ns (not yet derated for refresh).

    Attributes
    ----------
    t_ck
        Command clock period.
    t_rp, t_rcd, t_ras, t_wr, t_wtr
        Precharge, activate-to-column, activate-to-precharge, write recovery, write-to-read.
    t_ccd_l, t_ccd_wl
        Column-command spacing of ordinary and op-and-store instructions.
    refresh_derate
        ``1 / (1 - refresh_overhead)``.
    """

    t_ck: float
    t_rp: float
    t_rcd: float
    t_ras: float
    t_wr: float
    t_wtr: float
    t_ccd_l: float
    t_ccd_wl: float
    refresh_derate: float

    @classmethod
    def from_hbm(cls, hbm: HbmConfig) -> BankTiming:
        """Timings of ``hbm``."""
        clock = hbm.clock_hz

        def ns(cycles: float) -> float:
            return cycles_to_ns(cycles, clock)

        return cls(
            t_ck=ns(1),
            t_rp=ns(hbm.t_rp_cycles),
            t_rcd=ns(hbm.t_rcd_cycles),
            t_ras=ns(hbm.t_ras_cycles),
            t_wr=ns(hbm.t_wr_cycles),
            t_wtr=ns(hbm.t_wtr_cycles),
            t_ccd_l=ns(hbm.t_ccd_l_cycles),
            t_ccd_wl=ns(hbm.t_ccd_wl_cycles),
            refresh_derate=1.0 / (1.0 - hbm.refresh_overhead),
        )


@dataclass
class _Bank:
    row: tuple[str, int] | None = None
    activated_at: float = 0.0
    last_column_end: float = 0.0
    last_write_end: float = -math.inf
    last_was_write: bool = False


@dataclass
class ScheduleCounts:
    """What one ALU did, by kind of column command.

    Attributes
    ----------
    end_ns
        When its last command finished (not derated for refresh).
    busy_ns
        Time its column commands took, without waiting for rows (not derated for refresh).
    activations
        Row activations in all its banks.
    columns
        Column commands by access kind: ``read``, ``write``, ``update``, ``alu``.
    """

    end_ns: float = 0.0
    busy_ns: float = 0.0
    activations: int = 0
    columns: dict[str, int] = field(default_factory=lambda: {READ: 0, WRITE: 0, UPDATE: 0, ALU: 0})

    def minus(self, other: ScheduleCounts) -> ScheduleCounts:
        """The difference ``self - other`` (what happened in between)."""
        return ScheduleCounts(
            self.end_ns - other.end_ns,
            self.busy_ns - other.busy_ns,
            self.activations - other.activations,
            {kind: self.columns[kind] - other.columns[kind] for kind in self.columns},
        )

    def plus(self, other: ScheduleCounts, times: int = 1) -> ScheduleCounts:
        """``self + times * other``."""
        return ScheduleCounts(
            self.end_ns + times * other.end_ns,
            self.busy_ns + times * other.busy_ns,
            self.activations + times * other.activations,
            {kind: self.columns[kind] + times * other.columns[kind] for kind in self.columns},
        )

    def copy(self) -> ScheduleCounts:
        """An independent copy."""
        return ScheduleCounts(self.end_ns, self.busy_ns, self.activations, dict(self.columns))


class AluSchedule:
    """Command-level schedule of one ALU and its banks, instruction by instruction.

    Parameters
    ----------
    timing
        The DRAM timings.
    column_ns
        Issue time of one column per operation (ALU cycles x passes per column), ns.
    banks
        Banks the ALU serves; an instruction runs on each of them in turn.
    """

    def __init__(self, timing: BankTiming, column_ns: Mapping[str, float], banks: int):
        self.timing = timing
        self.column_ns = column_ns
        self.banks = [_Bank() for _ in range(banks)]
        self.alu_free = 0.0
        self.counts = ScheduleCounts()

    def run(self, instructions: Sequence[Instruction], tile_columns: int, tile: int) -> None:
        """Execute ``instructions`` on tile number ``tile`` of ``tile_columns`` columns."""
        timing = self.timing
        counts = self.counts
        for ins in instructions:
            columns = tile_columns if ins.per_tile else 1
            access = ins.access
            spacing = timing.t_ccd_wl if access == UPDATE else timing.t_ccd_l
            per_column = max(spacing, self.column_ns[ins.op])
            tensor = ins.tensor
            for bank in self.banks:
                start = self.alu_free
                if tensor is not None:
                    row = (tensor, tile)
                    if bank.row != row:
                        start = max(start, self._open(bank, row))
                        counts.activations += 1
                    if access in (READ, UPDATE) and bank.last_was_write:
                        start = max(start, bank.last_write_end + timing.t_wtr)
                end = start + columns * per_column
                if tensor is not None:
                    bank.last_column_end = end
                    writes = access in (WRITE, UPDATE)
                    if writes:
                        bank.last_write_end = end
                    bank.last_was_write = writes
                self.alu_free = end
                counts.busy_ns += columns * per_column
                counts.columns[access] += columns
        counts.end_ns = self.alu_free

    def _open(self, bank: _Bank, row: tuple[str, int]) -> float:
        """Precharge the bank's open row as early as allowed, activate ``row``; return when columns may start."""
        timing = self.timing
        if bank.row is None:
            activate = bank.last_column_end
        else:
            precharge = max(bank.activated_at + timing.t_ras, bank.last_column_end, bank.last_write_end + timing.t_wr)
            activate = precharge + timing.t_rp
        bank.row = row
        bank.activated_at = activate
        return activate + timing.t_rcd


@dataclass(frozen=True)
class BroadcastTiming:
    """A program broadcast over one tensor's share of every bank.

    Attributes
    ----------
    program
        The program's name.
    columns_per_bank
        Columns of each tensor in each bank.
    tile_columns
        Columns per tile (per register, per bank).
    tiles
        Tiles per bank.
    duration_ns
        Time of the whole broadcast (all ALUs in lockstep), refresh included, ns.
    column_ns
        Part of ``duration_ns`` the ALUs spend issuing column commands; the rest they wait for
        row switches, ns.
    activations_per_bank
        Row activations in each bank.
    column_commands
        Column commands per bank by access kind (``read``, ``write``, ``update``, ``alu``).
    banks
        Banks in the whole memory.
    column_bytes
        Bytes of one column.
    """

    program: str
    columns_per_bank: int
    tile_columns: int
    tiles: int
    duration_ns: float
    column_ns: float
    activations_per_bank: int
    column_commands: Mapping[str, int]
    banks: int
    column_bytes: int

    def bytes_moved(self, access: str) -> int:
        """Bytes that cross the banks' sense amplifiers for ``access`` (read/write/update), all banks."""
        return self.column_commands[access] * self.column_bytes * self.banks

    @property
    def activations(self) -> int:
        """Row activations in the whole memory."""
        return self.activations_per_bank * self.banks


class NearMemoryUnits:
    """The near-bank ALUs of one GPU's memory: geometry, tiling and broadcast timing.

    Geometry is that of the physical channels (``lockstep_channels`` only groups channels for the
    simulation of ordinary traffic).  Planning is arithmetic and cached; :func:`execute` puts the
    broadcasts on the simulated channels.

    Parameters
    ----------
    config
        The GPU (its ``hbm`` and ``nmc``).
    """

    def __init__(self, config: GpuConfig):
        hbm, nmc = config.hbm, config.nmc
        if not nmc.enabled:
            raise ValueError(f"{config.name}: near-memory commands need gpu.nmc.enabled = true")
        if hbm.banks_per_channel % nmc.banks_per_alu:
            raise ValueError(
                f"{config.name}: gpu.nmc.banks_per_alu ({nmc.banks_per_alu}) must divide the banks of a channel "
                f"({hbm.banks_per_channel})"
            )
        self.config = config
        self.timing = BankTiming.from_hbm(hbm)
        self.column_bytes = int(hbm.burst_bytes)
        self.row_columns = int(hbm.row_bytes) // self.column_bytes
        if self.row_columns < 1:
            raise ValueError(f"{config.name}: gpu.hbm.row_bytes must hold at least one column (burst_bytes)")
        self.banks = hbm.channels * hbm.banks_per_channel
        self.banks_per_alu = nmc.banks_per_alu
        self.alus = self.banks // nmc.banks_per_alu
        self.storage_columns = int(nmc.temp_storage_bytes) // self.column_bytes
        passes = math.ceil(self.column_bytes / nmc.simd_bytes)
        self.column_ns = {op: cycles * passes * self.timing.t_ck for op, cycles in nmc.op_cycles.items()}
        self._cache: dict[tuple[NmcProgram, int], BroadcastTiming] = {}

    def check(self, program: NmcProgram) -> None:
        """Raise ``ValueError`` if the ALUs cannot run ``program`` (operations, temporary storage)."""
        missing = sorted(program.ops - set(self.column_ns))
        if missing:
            raise ValueError(
                f"NMC program {program.name!r} needs operation(s) {', '.join(missing)} that gpu.nmc.op_cycles of "
                f"{self.config.name} does not list"
            )
        self.tile_columns(program)

    def tile_columns(self, program: NmcProgram) -> int:
        """Columns per tile: what the temporary storage holds for every register, aligned to rows."""
        free = self.storage_columns - len(program.accumulators)
        fit = free // (program.registers * self.banks_per_alu) if program.registers else (self.row_columns if free >= 0 else 0)
        if fit < 1:
            need = (program.registers * self.banks_per_alu + len(program.accumulators)) * self.column_bytes
            raise ValueError(
                f"NMC program {program.name!r} needs {program.registers} register(s) and "
                f"{len(program.accumulators)} accumulator(s): gpu.nmc.temp_storage_bytes must be at least {need} B, "
                f"got {self.config.nmc.temp_storage_bytes:.0f} B"
            )
        fit = min(fit, self.row_columns)
        while self.row_columns % fit:
            fit -= 1
        return fit

    def columns_per_bank(self, nbytes: int) -> int:
        """Columns of a tensor of ``nbytes`` in each bank (the last column of a bank may be partly empty)."""
        return max(1, math.ceil(nbytes / (self.column_bytes * self.banks)))

    def broadcast(self, program: NmcProgram, nbytes: int) -> BroadcastTiming:
        """Timing of ``program`` over tensors of ``nbytes`` each."""
        columns = self.columns_per_bank(nbytes)
        key = (program, columns)
        timing = self._cache.get(key)
        if timing is None:
            self.check(program)
            timing = self._cache[key] = self._plan(program, columns)
        return timing

    def _plan(self, program: NmcProgram, columns: int) -> BroadcastTiming:
        tile = self.tile_columns(program)
        tiles = math.ceil(columns / tile)
        last = columns - (tiles - 1) * tile
        schedule = AluSchedule(self.timing, self.column_ns, self.banks_per_alu)
        schedule.run(program.prologue, tile, -1)
        if tiles <= 3:
            for index in range(tiles):
                schedule.run(program.body, tile if index < tiles - 1 else last, index)
            schedule.run(program.epilogue, tile, tiles)
            counts = schedule.counts
        else:
            # Tiles repeat: run two to reach the steady state, then scale the second.
            schedule.run(program.body, tile, 0)
            after_first = schedule.counts.copy()
            schedule.run(program.body, tile, 1)
            steady = schedule.counts.minus(after_first)
            before_last = schedule.counts.copy()
            schedule.run(program.body, last, 2)
            schedule.run(program.epilogue, tile, 3)
            tail = schedule.counts.minus(before_last)
            counts = after_first.plus(steady, tiles - 2).plus(tail)
        per_bank = {kind: count // self.banks_per_alu for kind, count in counts.columns.items()}
        return BroadcastTiming(
            program=program.name,
            columns_per_bank=columns,
            tile_columns=tile,
            tiles=tiles,
            duration_ns=counts.end_ns * self.timing.refresh_derate,
            column_ns=counts.busy_ns * self.timing.refresh_derate,
            activations_per_bank=counts.activations // self.banks_per_alu,
            column_commands=per_bank,
            banks=self.banks,
            column_bytes=self.column_bytes,
        )

    def partial_bytes(self, program: NmcProgram) -> int:
        """Bytes of partial sums one broadcast of ``program`` leaves for the GPU (all ALUs)."""
        return len(program.accumulators) * self.alus * self.column_bytes


def execute(gpu: Gpu, broadcasts: Sequence[tuple[str, BroadcastTiming]], lane: str, issue_ns: float = 0.0) -> Generator:
    """Run broadcasts back to back on ``gpu``'s memory (a simpy generator; one event in all).

    The broadcasts start ``issue_ns`` after the call (the commands' way through the memory
    controllers), and not before every channel has finished the ordinary requests scheduled so
    far; meanwhile ordinary requests wait.  Each broadcast becomes a span (category ``nmc``) on
    ``lane``.  The bytes read, written and updated inside the banks never cross the channels' data
    bus, so they are counters (``gpuN.nmc_bytes_read`` ...), not DRAM traffic of the result.

    Parameters
    ----------
    gpu
        The :class:`gpusim.hw.gpu.Gpu`.
    broadcasts
        ``(label, timing)`` in issue order.
    lane
        Timeline lane (the issuing stream).
    issue_ns
        Latency from the call to the first command at the banks, ns.
    """
    env = gpu.env
    recorder = gpu.sim.recorder
    channels = gpu.channels
    now = env.now
    start = max([now + issue_ns] + [channel.free_at for channel in channels])
    time = start
    activations = 0
    moved = dict.fromkeys((READ, WRITE, UPDATE), 0)
    for label, timing in broadcasts:
        end = time + timing.duration_ns
        recorder.span(
            Span(
                label,
                "nmc",
                gpu.index,
                lane,
                time,
                end,
                {
                    "program": timing.program,
                    "tiles": timing.tiles,
                    "tile_columns": timing.tile_columns,
                    "activations": timing.activations,
                },
            )
        )
        for access in moved:
            moved[access] += timing.bytes_moved(access)
        activations += timing.activations
        time = end
    share = activations // len(channels)
    for channel in channels:
        channel.occupy_all_banks(start, time, share)
    prefix = f"gpu{gpu.index}.nmc_"
    recorder.count(prefix + "activations", activations)
    recorder.count(prefix + "busy_ns", time - start)
    for access, nbytes in moved.items():
        recorder.count(f"{prefix}bytes_{access}", nbytes)
    yield env.timeout(time - now)


def interpret(program: NmcProgram, arrays: dict[str, np.ndarray], immediates: Mapping[str, float]) -> dict[str, float]:
    """Execute ``program`` functionally on whole tensors (the ALU's arithmetic, without timing).

    Tensors in ``arrays`` are updated in place (their dtype is kept); returns the accumulators'
    totals (what the GPU obtains by reducing the partial sums of all banks).
    """
    registers: dict[str, np.ndarray] = {}
    totals = {name: 0.0 for name in program.accumulators}
    values = {**immediates, "0": 0.0}

    def value(operand: Operand):
        if operand.kind == "imm":
            if operand.name not in values:
                raise KeyError(f"NMC program {program.name!r}: no value for immediate #{operand.name}")
            return values[operand.name]
        if operand.kind == "mem":
            return arrays[operand.name]
        if operand.kind == "acc":
            return 0.0
        return registers[operand.name]

    for ins in program.body:
        a = [value(src) for src in ins.srcs]
        op = ins.op
        if op == "mov":
            result = a[0]
        elif op == "add":
            result = a[0] + a[1]
        elif op == "sub":
            result = a[0] - a[1]
        elif op == "mul":
            result = a[0] * a[1]
        elif op == "max":
            result = np.maximum(a[0], a[1])
        elif op == "fma":
            result = a[0] * a[1] + a[2]
        elif op == "div":
            result = a[0] / a[1]
        elif op == "sqrt":
            result = np.sqrt(a[0])
        else:  # shift
            result = a[0] * np.exp2(a[1])
        dst = ins.dst
        if dst.kind == "acc":
            totals[dst.name] += float(np.sum(result, dtype=np.float64))
        elif dst.kind == "mem":
            target = arrays[dst.name]
            target[...] = result
        else:
            registers[dst.name] = np.array(result, dtype=np.float32, copy=True)
    return totals
