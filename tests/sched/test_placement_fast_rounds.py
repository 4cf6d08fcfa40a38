"""The fast round decoder (vectorized tables, cached wish rows, direct gathers) against the
reference path it replaces: the same tables, observations, settled memory and placements, bit
for bit, on several seeds, instance sizes (ragged tasks included), sample and group counts."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from caramel.sched.placement import InstanceOptions, random_instance  # noqa: E402
from caramel.sched.placement.batch import wish_table  # noqa: E402
from caramel.sched.placement.decode import Decoding  # noqa: E402
from caramel.sched.placement.fast_rounds import FastRoundBatch  # noqa: E402
from caramel.sched.placement.local_search import SearchOptions  # noqa: E402
from caramel.sched.placement.rounds import RoundBatch, decode_rounds  # noqa: E402
from caramel.sched.placement.tables import StepTables  # noqa: E402

TABLE_FIELDS = ("step", "h", "weights_mb", "current", "weights_from_mb_table", "num_layers", "source")


def ragged(opts: InstanceOptions, seed: int):
    """A random instance whose tasks are cut to random lengths (1..num_layers): padding matters."""
    inst = random_instance(opts, seed)
    rng = np.random.default_rng(seed + 99)
    tasks = []
    for t in inst.tasks:
        m = int(rng.integers(1, len(t.gflop) + 1))
        tasks.append(dataclasses.replace(t, gflop=t.gflop[:m], weights_mb=t.weights_mb[:m], out_mb=t.out_mb[:m],
                                         current=t.current[:m]))
    return dataclasses.replace(inst, tasks=tuple(tasks))


def twin_nodes(opts: InstanceOptions, seed: int):
    """A random instance whose edge node 2 copies node 1 (speed, memory, links; every task's
    source and current on node 0): from any other node, moving to 1 or to 2 costs exactly the
    same, so argmins tie and which of the tied nodes a path takes shows (random floats never tie)."""
    inst = random_instance(opts, seed)
    lat, bw = inst.latency_s.copy(), inst.bandwidth_MBps.copy()
    for m in (lat, bw):
        m[2, :], m[:, 2] = m[1, :], m[:, 1]
        m[2, 2], m[1, 2], m[2, 1] = m[1, 1], m[1, 0], m[0, 1]  # 1 <-> 2 as far apart as 1 <-> 0
    gflops, memory_mb = list(inst.node_gflops), list(inst.memory_mb)
    gflops[2], memory_mb[2] = gflops[1], memory_mb[1]
    tasks = tuple(dataclasses.replace(t, source=0, current=(0,) * len(t.current)) for t in inst.tasks)
    return dataclasses.replace(inst, tasks=tasks, node_gflops=tuple(gflops), memory_mb=tuple(memory_mb),
                               latency_s=lat, bandwidth_MBps=bw)


TWINS = [twin_nodes(InstanceOptions(num_tasks=6, num_layers=6), 2),  # 11 and 52 tied argmins
         twin_nodes(InstanceOptions(num_tasks=30, num_layers=8), 0)]


def instances():
    return ([random_instance(InstanceOptions(num_tasks=30, num_layers=8), s) for s in range(2)]
            + [ragged(InstanceOptions(num_tasks=10, num_layers=6, memory_fraction=0.2), s) for s in range(3)]
            + [random_instance(InstanceOptions(num_tasks=6, num_layers=5, num_edge=5, memory_fraction=0.15), s)
               for s in range(2)] + [random_instance(InstanceOptions(num_tasks=1, num_layers=1), 0)] + TWINS)


def test_twin_node_instances_have_tied_argmins():
    """The tie instances really tie (else they could not tell a first from a last minimum)."""
    for inst in TWINS:
        v = (lambda tb: tb.step + tb.h[:, :, None, :])(StepTables(inst))
        assert ((v == v.min(axis=-1, keepdims=True)).sum(axis=-1) > 1).sum() >= 10


def test_vectorized_tables_and_wish_table_equal_the_reference_builds():
    for inst in instances():
        fast, ref = StepTables(inst), StepTables(inst, reference=True)
        for field in TABLE_FIELDS:
            a, b = getattr(fast, field), getattr(ref, field)
            assert a.dtype == b.dtype and np.array_equal(a, b), field
        assert fast.weights_from_mb == ref.weights_from_mb
        assert np.array_equal(wish_table(fast, inst.num_nodes), wish_table(ref, inst.num_nodes, reference=True))


@pytest.mark.parametrize("samples,groups", [(1, 1), (5, 1), (3, 3)])
def test_fast_round_batch_observes_and_settles_as_the_reference(samples, groups):
    """Random actions (rows without room included): every observation, settling order, settled
    node, the memory left and the final costs equal the reference `RoundBatch`'s exactly."""
    for seed, inst in enumerate(instances()):
        ref, fast = RoundBatch(inst, samples, groups=groups), FastRoundBatch(inst, samples, groups=groups)
        rng = np.random.default_rng(seed)
        while not ref.done:
            a, b = ref.observe(), fast.observe()
            assert a.dtype == b.dtype and np.array_equal(a, b)
            assert np.array_equal(ref.tasks, fast.tasks) and np.array_equal(ref.regret, fast.regret)
            actions = rng.integers(inst.num_nodes, size=a.shape[:2])
            assert np.array_equal(ref.step(actions), fast.step(actions))
            assert np.array_equal(ref._free_ext, fast._free_ext)
        assert fast.done and np.array_equal(ref.nodes, fast.nodes) and np.array_equal(ref.costs_s(), fast.costs_s())


def test_fast_decoder_places_as_the_reference_decoder():
    """The whole fast decoder (numpy forward, fast batch, vectorized tables) against the whole
    reference (torch forward, `RoundBatch`, tables built task by task): the same placements and
    costs, greedy and sampled, with and without the search after it, and the guided search.
    What this adds to the tests above is the glue (the batch class chosen, numpy against torch
    probabilities, the sampling generator, the search on the fast tables), which does not depend
    on the instance's size: small instances (two ragged, one with twin nodes) keep it cheap."""
    from caramel.sched.placement.fast_decode import NumpyPolicy
    from caramel.sched.placement.round_env import RoundPlacementEnv
    from caramel.sched.rl import PpoOptions, make_ppo
    model = make_ppo(RoundPlacementEnv(InstanceOptions(), [0]), PpoOptions(width=64))
    fast = NumpyPolicy.from_policy(model.policy)
    first, second = instances()[2:4]  # ragged; the policy's 3 edge nodes
    cases = [(first, Decoding(4), SearchOptions(), None), (second, Decoding(4), SearchOptions(), None),
             (second, Decoding(1), None, None), (first, Decoding(1), SearchOptions(), 0.03),
             (TWINS[0], Decoding(1), None, None)]
    for seed, (inst, decoding, search, focus) in enumerate(cases):
        want = decode_rounds(inst, model.policy, decoding, seed=seed, search=search, focus=focus)
        got = decode_rounds(inst, fast, decoding, seed=seed, search=search, focus=focus)
        assert got == want


def test_misuse_raises_the_reference_errors():
    """`step()` before `observe()` or twice in a row, a non-bool `reference`, and NaN weights
    (on which the fast and reference memory checks would part): one clear error each."""
    from caramel.errors import CaramelError
    from caramel.sched.placement.problem import Task
    inst = instances()[2]
    for batch_class in (RoundBatch, FastRoundBatch):
        batch = batch_class(inst, 2)
        actions = np.zeros((2, len(batch.tables.num_layers)), dtype=int)
        with pytest.raises(CaramelError, match="call observe"):
            batch.step(actions)
        batch.observe()
        batch.step(actions)
        with pytest.raises(CaramelError, match="call observe"):
            batch.step(actions)
    with pytest.raises(CaramelError, match="reference must be True or False"):
        StepTables(inst, reference="yes")
    with pytest.raises(CaramelError, match="reference must be True or False"):
        wish_table(StepTables(inst), inst.num_nodes, reference=1)
    nan = Task(source=0, gflop=(1.0,), weights_mb=(float("nan"),), out_mb=(1.0,), in_mb=1.0, current=(0,))
    with pytest.raises(CaramelError, match="task 0: weights_mb must be numbers >= 0"):
        dataclasses.replace(inst, tasks=(nan,))
