"""The schedule model prices libtpu's async collective fusions (a collective fused with
a matmul) as what they are: the collective's own bytes on the links, overlapped with
the fused matmul, whose compute counts. A hand-made scheduled module stands in for
libtpu's output (its instruction kinds as libtpu writes them)."""
import json

import pytest

from overlap_hlo.plan import cost
from overlap_hlo.targets import schedule
from overlap_hlo.targets.hlo_proto import Computation, Instruction, ModuleProto, Shape

BF16 = 16   # PrimitiveType BF16
GATHERED = Shape(BF16, (4096, 8192))   # 64 MiB, gathered over 8 devices
SHARD = Shape(BF16, (512, 8192))
WEIGHT = Shape(BF16, (8192, 3584))


def instr(name, opcode, id_, shape, operands=(), called=(), cycles=None, group=()):
    config = json.dumps({"window_config": {"estimated_cycles": str(cycles)}}).encode() \
        if cycles is not None else b""
    return Instruction(name, opcode, id_, shape, tuple(operands), tuple(called), "", None,
                       config, (), -1, "", (), tuple(group))


def module(fused_dot: bool, cycles: int) -> tuple[ModuleProto, list[Instruction]]:
    """An entry computation: param -> fusion(all-gather[, dot]) over 8 devices."""
    group = tuple(range(8))
    inner = [instr("p0", "parameter", 10, SHARD),
             instr("ag", "all-gather", 11, GATHERED, [10], group=group)]
    if fused_dot:
        inner += [instr("p1", "parameter", 12, WEIGHT),
                  instr("dot", "dot", 13, Shape(BF16, (4096, 3584)), [11, 12])]
    fused = Computation("fused", 2, inner[-1].id, tuple(inner))
    operands = [1, 3] if fused_dot else [1]
    entry_ops = [instr("x", "parameter", 1, SHARD), instr("w", "parameter", 3, WEIGHT),
                 instr("fusion", "fusion", 4, inner[-1].shape, operands, [2], cycles)]
    entry = Computation("main", 1, 4, tuple(entry_ops))
    return ModuleProto({1: entry, 2: fused}, 1), entry_ops


def walk_sequence(monkeypatch, proto: ModuleProto, sequence: list[Instruction]):
    """The model's walk of `sequence` as the entry's schedule: (Analysis, Timing)."""
    monkeypatch.setattr(schedule, "scheduled_sequences", lambda hlo, p: {"main": sequence})
    timing = schedule.Timing(cost.hardware("tpu-v5e"), 1.5, 8)
    walker = schedule._Walker(None, proto, timing, schedule.trip_count, False)
    walker.result.total_us = walker.run("main", 0.0)
    return walker.result, timing


def walk(monkeypatch, fused_dot: bool, cycles: int) -> schedule.Analysis:
    return walk_sequence(monkeypatch, *module(fused_dot, cycles))


@pytest.mark.parametrize("cycles", [100_000, 10_000_000])
def test_a_collective_fused_with_a_matmul_overlaps_it(monkeypatch, cycles):
    result, timing = walk(monkeypatch, True, cycles)
    compute = cycles / 1.5e3
    transfer = timing.collective_us("all-gather", SHARD.nbytes, GATHERED.nbytes, 8, ())
    assert result.compute_us == pytest.approx(compute)       # the fused matmul counts
    assert result.exposed_us == pytest.approx(max(0.0, transfer - compute))
    assert result.total_us == pytest.approx(max(compute, transfer))
    (collective,) = result.collectives
    assert collective.bytes == GATHERED.nbytes   # the gather's bytes, not the weight's too


def test_a_fused_collective_without_a_matmul_stays_a_collective(monkeypatch):
    result, timing = walk(monkeypatch, False, 1_000)
    transfer = timing.collective_us("all-gather", SHARD.nbytes, GATHERED.nbytes, 8, ())
    assert result.compute_us == 0 and result.exposed_us == pytest.approx(transfer)


def test_a_collective_fused_with_other_compute_overlaps_it(monkeypatch):
    """libtpu fuses an FSDP weight's all-gather with an attention softmax (exp over a
    large f32 tensor): the gather's own bytes travel while the fusion computes; the
    softmax's tensor is no part of the transfer."""
    group = tuple(range(8))
    scores = Shape(11, (16, 4096, 4096))   # f32, 1 GiB
    inner = (instr("p0", "parameter", 10, SHARD),
             instr("ag", "all-gather", 11, GATHERED, [10], group=group),
             instr("p1", "parameter", 12, scores),
             instr("exp", "exponential", 13, scores, [12]),
             instr("t", "tuple", 14, GATHERED, [11, 13]))
    fused = Computation("async_collective_fusion", 2, 14, inner)
    cycles = 3_000_000
    sequence = [instr("x", "parameter", 1, SHARD), instr("s", "parameter", 3, scores),
                instr("fusion", "fusion", 4, GATHERED, [1, 3], [2], cycles)]
    proto = ModuleProto({1: Computation("main", 1, 4, tuple(sequence)), 2: fused}, 1)
    result, timing = walk_sequence(monkeypatch, proto, sequence)
    transfer = timing.collective_us("all-gather", SHARD.nbytes, GATHERED.nbytes, 8, ())
    assert result.compute_us == pytest.approx(cycles / 1.5e3)   # the softmax counts
    assert result.exposed_us == pytest.approx(max(0.0, transfer - cycles / 1.5e3))
    (collective,) = result.collectives
    assert collective.bytes == GATHERED.nbytes


def test_the_matmuls_are_counted_apart_from_the_walk(monkeypatch):
    """The walk's compute is checked against the matmuls' estimates summed apart; a
    report whose module computes less than its matmuls says so."""
    from overlap_hlo.targets.report import Report

    proto, sequence = module(True, 3_000_000)
    monkeypatch.setattr(schedule, "scheduled_sequences", lambda hlo, p: {"main": sequence})
    timing = schedule.Timing(cost.hardware("tpu-v5e"), 1.5, 8)
    walker = schedule._Walker(None, proto, timing, schedule.trip_count, False)
    walker.run("main", 0.0)
    assert walker.matmuls("main") == pytest.approx(walker.result.compute_us) == 2000.0
    good = schedule.Analysis(total_us=5.0, compute_us=4.0, matmul_us=4.0)
    lost = schedule.Analysis(total_us=5.0, compute_us=1.0, matmul_us=4.0)
    report = Report("v5e:2x4", "tpu-v5e", 1.5, {}, [], good, lost, 0, 0)
    (problem,) = report.model_problems()
    assert problem.startswith("the rewritten module's modelled compute (1.0 us) is below")
    assert "warning: " + problem in report.format()


@pytest.mark.parametrize("cycles", [100_000, 10_000_000])
def test_an_async_collective_started_and_waited_for_in_fusions_is_one_transfer(
        monkeypatch, cycles):
    """libtpu splits an all-gather into a start fusion, a continuation fused with a
    weight gradient's dot and a done fusion, each wrapping the all-gather: one transfer,
    overlapped with the continuation's compute, noted once at the done."""
    import dataclasses
    group = tuple(range(8))
    state = Shape(BF16, (), ((SHARD, GATHERED)))
    grad = Shape(BF16, (3584, 8192))

    def wrapping(cid, ag_id, root):
        return Computation(f"c{cid}", cid, root.id, (
            instr(f"p{cid}", "parameter", ag_id - 1, SHARD),
            instr(f"ag{cid}", "all-gather", ag_id, GATHERED, [ag_id - 1], group=group),
            root))

    start_root = dataclasses.replace(instr("cs", "custom-call", 21, state, [20]),
                                     custom_call_target="AsyncCollectiveStart")
    done_root = dataclasses.replace(instr("cd", "custom-call", 41, GATHERED, [40]),
                                    custom_call_target="AsyncCollectiveDone")
    continuation = wrapping(3, 30, instr("dot", "convolution", 31, grad, [30, 30]))
    entry = [instr("x", "parameter", 1, SHARD),
             instr("start", "fusion", 2, state, [1], [2]),
             instr("gte", "get-tuple-element", 4, SHARD, [2]),
             instr("cont", "fusion", 5, grad, [4], [3], cycles),
             instr("done", "fusion", 6, GATHERED, [5], [4]),
             instr("use", "fusion", 7, grad, [6], [], 1_500)]
    proto = ModuleProto({1: Computation("main", 1, 7, tuple(entry)),
                         2: wrapping(2, 20, start_root), 3: continuation,
                         4: wrapping(4, 40, done_root)}, 1)
    result, timing = walk_sequence(monkeypatch, proto, entry)
    transfer = timing.collective_us("all-gather", SHARD.nbytes, GATHERED.nbytes, 8, ())
    compute = cycles / 1.5e3
    assert result.compute_us == pytest.approx(compute + 1.0)   # the dot and the reader
    assert result.exposed_us == pytest.approx(max(0.0, transfer - compute))
    (collective,) = result.collectives
    assert collective.name == "done" and collective.bytes == GATHERED.nbytes
    assert collective.executions == 1 and collective.time_us == pytest.approx(transfer)
