"""Tied embeddings split apart (`caramel.runtime.tied`): the swap, the profile it gives, and the
row exchange on stand-in groups (the real gloo path is in tests/distributed: the tied GPT's
parity with DDP on 2-4 ranks, every overlap mode)."""
import copy
import threading

import pytest
import torch
import torch.nn as nn

from caramel.models import get_model
from caramel.profile.profiler import profile_model, unique_params
from caramel.profile.tied import TiedEmbedding, find_tied_embeddings
from caramel.runtime.tied import RowExchange


def _tiny():
    return get_model("tiny_gpt")(batch_size=4, seed=0)


def test_finds_only_embeddings_whose_weight_another_module_holds():
    w = _tiny()
    names, params = unique_params(w.model)
    found = find_tied_embeddings(w.model, params)
    assert [(n, i) for n, _, i in found] == [("tok", names.index("tok.weight"))]

    class Untied(nn.Module):
        def __init__(self, **kw):
            super().__init__()
            self.emb = nn.Embedding(10, 4, **kw)
            self.head = nn.Linear(4, 10)

    for kw in ({}, {"max_norm": 1.0}, {"sparse": True}):
        m = Untied(**kw)
        if kw:
            m.head.weight = m.emb.weight  # tied, but rows rewritten in forward / a sparse gradient
        assert find_tied_embeddings(m, list(m.parameters())) == []


def test_split_and_fold_give_the_same_gradient_and_leave_the_model_as_it_was():
    w = _tiny()
    whole, split = copy.deepcopy(w.model), copy.deepcopy(w.model)
    _, params = unique_params(split)
    tied = TiedEmbedding(*find_tied_embeddings(split, params)[0], active=lambda: True)
    w.loss_fn(whole(w.inputs), w.targets).backward()
    w.loss_fn(split(w.inputs), w.targets).backward()
    assert split.tok.weight is split.head.weight and isinstance(split.tok.weight, nn.Parameter)
    # the weight's own gradient is the output layer's part only: rows of unseen tokens differ
    seen = torch.unique(w.inputs)
    unseen = torch.ones(split.tok.num_embeddings, dtype=torch.bool)
    unseen[seen] = False
    assert torch.equal(split.tok.weight.grad[unseen], whole.tok.weight.grad[unseen])
    assert not torch.equal(split.tok.weight.grad[seen], whole.tok.weight.grad[seen])
    tied.fold_into_weight()
    for a, b in zip(whole.parameters(), split.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-6)
    # a forward that raises still swaps the weight back
    with pytest.raises(IndexError):
        split(torch.full_like(w.inputs, 10_000))
    assert split.tok._parameters["weight"] is params[find_tied_embeddings(split, params)[0][2]]
    tied.remove()
    # inactive (no_sync, DDP's turn, eval): no alias, nothing to fold
    off = TiedEmbedding(*find_tied_embeddings(split, params)[0], active=lambda: False)
    split(w.inputs)
    assert off.alias is None and off.take_rows() is None


def test_profile_sees_the_tied_gradient_early():
    w = get_model("gpt2")(batch_size=2, d=64, layers=2, vocab=512, seq=16)
    whole = profile_model(copy.deepcopy(w.model), w.inputs, w.targets, w.loss_fn, steps=1, split_tied=False)
    split = profile_model(copy.deepcopy(w.model), w.inputs, w.targets, w.loss_fn, steps=1)
    last = max(p.ready_order for p in whole.params)
    tok = next(i for i, p in enumerate(whole.params) if p.name == "tok.weight")
    assert whole.params[tok].ready_order == last  # summed by autograd: ready when backward ends
    assert split.params[tok].ready_order == 0  # the output layer's part: the first gradient of backward
    # still first used by the embedding (the alias is a use of the weight), and by the head
    for prof in (whole, split):
        assert prof.modules[prof.params[tok].first_use_order].name == "tok"
        assert prof.params[tok].use_modules == ["tok", "head"]
    assert split.fingerprint() == whole.fingerprint()
    # the rows' time is kept: a run without the split (torch DDP) is planned and simulated from it
    rows = split.params[tok].rows_ready_time_s
    assert rows is not None and rows >= max(p.ready_time_s for p in split.params if p.ready_time_s is not None)
    assert all(p.rows_ready_time_s is None for i, p in enumerate(split.params) if i != tok)
    assert whole.params[tok].rows_ready_time_s is None and whole.unsplit() is whole
    unsplit = split.unsplit()
    assert unsplit.params[tok].ready_time_s == rows and unsplit.params[tok].ready_order == last
    assert [p.ready_order for i, p in enumerate(unsplit.params) if i != tok] == \
        [p.ready_order - 1 for i, p in enumerate(split.params) if i != tok]
    assert split.params[tok].ready_order == 0  # the profile itself is unchanged
    from caramel.profile.model_profile import ModelProfile
    assert ModelProfile.from_dict(split.to_dict()).params[tok].rows_ready_time_s == rows
    from experiments.validation.worker import profile_for
    assert profile_for({"planner": "ddp"}, split).params[tok].ready_order == last
    assert profile_for({"planner": "caramel"}, split) is split


class _Group:
    """In-process stand-in for a process group of `world` ranks, one thread each: a rank's k-th
    collective meets the other ranks' k-th; `wait()` blocks until all of them have called it."""

    def __init__(self, world: int):
        self.world = world
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(world)
        self.rounds: dict[int, dict[int, torch.Tensor]] = {}
        self.count = [0] * world
        self.gathers = self.reduces = 0

    def _post(self, rank: int, tensor: torch.Tensor, kind: str) -> int:
        with self.lock:
            k = self.count[rank]
            self.count[rank] += 1
            self.rounds.setdefault(k, {})[rank] = tensor.clone()
            if rank == 0:
                self.gathers += kind == "gather"
                self.reduces += kind == "reduce"
        return k

    def work(self, fill):
        group = self

        class Work:
            def wait(self):
                group.barrier.wait()  # every rank's input of this round is posted
                fill()
                group.barrier.wait()
                return True
        return Work()


class _RankView:
    def __init__(self, group: _Group, rank: int):
        self.group, self.rank = group, rank

    def allgather(self, outputs, inputs):
        k = self.group._post(self.rank, inputs[0], "gather")

        def fill():
            for r, t in sorted(self.group.rounds[k].items()):
                outputs[0][r].copy_(t)
        return self.group.work(fill)

    def allreduce(self, tensors):
        k = self.group._post(self.rank, tensors[0], "reduce")

        def fill():
            tensors[0].copy_(sum(self.group.rounds[k].values()))
        return self.group.work(fill)


def _exchange_round(exchanges, rows_per_rank, num_rows, dim):
    """Each rank's (ids, rows) through its exchange; returns each rank's result and the expected sum."""
    world = len(exchanges)
    expected = torch.zeros(num_rows, dim)
    for ids, rows in rows_per_rank:
        if ids is not None:
            expected.index_add_(0, ids, rows / world)
    results = [torch.zeros(num_rows, dim) for _ in range(world)]

    def run(r):
        ex = exchanges[r]
        ids, rows = rows_per_rank[r]
        if ids is not None:
            ex.tied.alias = torch.zeros(num_rows, dim, requires_grad=True)
            ex.tied.alias.grad = torch.zeros(num_rows, dim).index_add_(0, ids, rows)
            ex.tied.ids = [ids.repeat(2)]  # looked up twice: each row still goes once
        ex.start()
        results[r] = (ex.finish(results[r]), results[r])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(isinstance(r, tuple) for r in results), "a rank's exchange raised (see the thread's traceback)"
    return results, expected


def test_row_exchange_sums_every_ranks_rows_growing_its_capacity_then_going_dense():
    world, num_rows, dim = 3, 40, 5
    group = _Group(world)
    emb = nn.Embedding(num_rows, dim)
    exchanges = [RowExchange(TiedEmbedding("emb", emb, 0, lambda: True), _RankView(group, r), world)
                 for r in range(world)]
    g = torch.Generator().manual_seed(0)

    def rows(k):
        ids = torch.randperm(num_rows, generator=g)[:k].sort().values
        return ids, torch.randn(k, dim, generator=g)

    # step 1: capacity 0 everywhere, so every rank gathers again at the largest count (4)
    results, expected = _exchange_round(exchanges, [rows(2), rows(4), (None, None)], num_rows, dim)
    assert group.gathers == 2 and {ex.capacity for ex in exchanges} == {4}
    for had, got in results:
        assert had and torch.allclose(got, expected, atol=1e-6)
    # step 2: fits, one gather each
    results, expected = _exchange_round(exchanges, [rows(3), rows(1), rows(4)], num_rows, dim)
    assert group.gathers == 3
    for had, got in results:
        assert had and torch.allclose(got, expected, atol=1e-6)
    # step 3: one rank with 20 rows: 3 x 20 rows gathered would exceed an all-reduce of the 40
    results, expected = _exchange_round(exchanges, [rows(20), rows(1), (None, None)], num_rows, dim)
    assert {ex.capacity for ex in exchanges} == {20} and all(ex.dense for ex in exchanges)
    for had, got in results:
        assert torch.allclose(got, expected, atol=1e-6)
    # step 4: dense from now on, on every rank: an all-reduce of the whole weight's shape
    results, expected = _exchange_round(exchanges, [rows(2), (None, None), rows(5)], num_rows, dim)
    assert group.reduces == 1
    for had, got in results:
        assert had and torch.allclose(got, expected, atol=1e-6)
    # dense, and no rank looked anything up: nothing added, and the caller is told so
    results, _ = _exchange_round(exchanges, [(None, None)] * world, num_rows, dim)
    assert group.reduces == 2 and all(not had and not got.any() for had, got in results)
    # no rank looked anything up: nothing added, and the caller is told so
    pair = _Group(2)
    results, _ = _exchange_round([RowExchange(TiedEmbedding("emb", emb, 0, lambda: True), _RankView(pair, r), 2)
                                  for r in range(2)], [(None, None), (None, None)], num_rows, dim)
    assert all(not had and not got.any() for had, got in results)


def test_profile_command_splits_unless_told_not_to(tmp_path, capsys):
    from caramel.cli import main
    from caramel.profile.model_profile import ModelProfile

    orders = {}
    for flags in ([], ["--no-split-tied"]):
        out = tmp_path / f"p{len(flags)}.json"
        assert main(["profile", "--model", "tiny_gpt", "--steps", "1", "--json", str(out), *flags]) in (0, None)
        prof = ModelProfile.load(out)
        tok = next(p for p in prof.params if p.name == "tok.weight")
        orders[bool(flags)] = (tok.ready_order, max(p.ready_order for p in prof.params))
    assert orders[False][0] == 0 and orders[True][0] == orders[True][1]
