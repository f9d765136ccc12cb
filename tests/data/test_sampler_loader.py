"""FCPSampler through real DataLoaders and real processes: planning-thread lifecycle and error surfacing,
DataLoader workers 0/2 (persistent, pin_memory), torchdata StatefulDataLoader resume, and N gloo
processes that must all compute the same plans from rank/world read off torch.distributed.

References: the collator applied directly to the sampler's lists in the main process (for loaders), the
uninterrupted loader (for resume), the dataset itself (coverage).
"""

from __future__ import annotations

import gc
import hashlib
import json
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fcp_data.collator import FCPCollator
from fcp_data.cost import CostModel
from fcp_data.sampler import FCPDataset, FCPSampler
from fcp_exec.launch import WorkerPool

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)


# the sampler's bookkeeping does not depend on the plan: the planner's local search is off (conftest.py)
pytestmark = pytest.mark.usefixtures("no_local_search")


def _lengths(n=200, seed=1):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.0, 1.1, size=n), 1, 3000).astype(np.int64)


class TextData:
    """Map-style text dataset whose sample i has lengths[i] tokens (deterministic ids)."""

    def __init__(self, lengths):
        self.lengths = [int(x) for x in lengths]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"input_ids": (torch.arange(self.lengths[i]) * 31 + i) % 5000}


def _planner_threads():
    return [t for t in threading.enumerate() if t.name == "fcp-planner" and t.is_alive()]


def _wait_no_planner_threads(timeout=5.0):
    """The planner threads still alive after a cycle collection and ``timeout`` s (joined, no polling)."""
    end = time.monotonic() + timeout
    gc.collect()
    for t in _planner_threads():
        t.join(max(0.0, end - time.monotonic()))
    return _planner_threads()


def _same_batch(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_planner_thread_stops_on_exhaustion_abandon_and_close():
    """The planning thread ends with the epoch, when an iterator is abandoned mid-epoch (GC) and on
    close(); a failure means leaked threads planning forever in the training process."""
    assert not _wait_no_planner_threads()
    s = FCPSampler(_lengths(), num_ranks=8, rank=1, cost_model=CM, global_batch_size=32, prefetch=2)
    list(s)
    assert not _wait_no_planner_threads()
    it = iter(s)
    next(it)
    assert it.planner_thread is not None and it.planner_thread.is_alive()
    del it
    assert not _wait_no_planner_threads()
    it = iter(s)
    next(it)
    it.close()
    assert not _planner_threads()


def _keys(lists):
    return [(x.epoch, x.global_batch, x.micro_batch, x.ranks, x.cp_rank, tuple(s.index for s in x),
             x.num_tokens_global) for x in lists]


@pytest.mark.parametrize("batch", [200, 64])  # one global batch per epoch (every step waited before); four
def test_next_epoch_is_planned_speculatively_with_identical_plans(batch):
    """Epochs 0..3 iterated with set_epoch(e+1) after each: the first `prefetch` global batches of every
    later epoch come from the speculative plans made while the previous epoch ended
    (num_speculative_hits), the lists equal those of a sampler that plans synchronously (prefetch=0, the
    reference), len() counts what iter() yields, and no planning or speculation thread outlives the run. A failure
    means the speculation changes plans, is never used, or leaks threads."""
    lengths = _lengths()
    ref = FCPSampler(lengths, num_ranks=8, rank=2, cost_model=CM, global_batch_size=batch, prefetch=0)
    s = FCPSampler(lengths, num_ranks=8, rank=2, cost_model=CM, global_batch_size=batch, prefetch=2)
    expected_hits = 0
    for e in range(4):
        s.set_epoch(e)
        ref.set_epoch(e)
        got = list(s)
        assert _keys(got) == _keys(list(ref))
        nxt = FCPSampler(lengths, num_ranks=8, rank=2, cost_model=CM, global_batch_size=batch, prefetch=0)
        nxt.set_epoch(e + 1)
        assert len(s) == len(ref) == len(list(nxt))  # at an epoch's end: the next epoch's, what iter() yields
        expected_hits += min(2, s.num_global_batches(e)) if e else 0
        assert s.num_speculative_hits == expected_hits, e
    assert s.planner_waits and ref.num_speculative_hits == 0
    # the plans of epoch 4's first global batches were scheduled as epoch 3 ended; the thread plans them and
    # ends by itself; nothing else is left running
    assert s._window is not None and s._window.head == (4, 0)
    assert s._window.scheduled() == min(2, s.num_global_batches(4))
    assert not _wait_no_planner_threads(30)


def test_speculation_is_discarded_by_another_epoch_and_by_load_state_dict():
    """set_epoch(x) with another start than the window's and load_state_dict cancel the speculative plans of
    epoch e+1 (the thread is joined before they return) and the next epoch is planned afresh, with the same
    lists as a fresh sampler (the reference). A failure means stale plans could be served or threads leak."""
    lengths = _lengths()
    s = FCPSampler(lengths, num_ranks=8, rank=0, cost_model=CM, global_batch_size=200, prefetch=2)
    list(s)
    window = s._window
    assert window is not None and window.head == (1, 0)
    s.set_epoch(5)
    assert s._window is None and window.closed and window.thread is None
    fresh = FCPSampler(lengths, num_ranks=8, rank=0, cost_model=CM, global_batch_size=200, prefetch=0)
    fresh.set_epoch(5)
    assert _keys(list(s)) == _keys(list(fresh)) and s.num_speculative_hits == 0
    state = s.state_dict()
    window = s._window
    assert window is not None and window.head == (6, 0)
    s.load_state_dict(state)
    assert s._window is None and window.closed and window.thread is None
    assert not _wait_no_planner_threads()


# torch's multiprocessing DataLoader iterator prefetches indices in its constructor, so the sampler's error aborts that
# constructor after the workers started; its __del__ then closes the index queues while their feeder threads may still
# write ("Bad file descriptor" in a QueueFeederThread). That teardown is torch's; it is finished inside this test
# (:func:`_join_queue_feeders`) so that it is not reported under the next one; the same close can also surface from a
# connection's __del__ ("Exception ignored in ... _ConnectionBase.__del__").
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_planner_errors_surface_in_the_consumer():
    """An exception raised while planning on the background thread is re-raised by next() in the
    training process (with the planner's traceback), and the thread is gone afterwards."""
    # one micro-batch of 32 sequences (~8k tokens) cannot fit 8 ranks × 512 tokens: plan_batch raises on the thread
    s = FCPSampler(_lengths(), num_ranks=8, rank=0, cost_model=CM, global_batch_size=32, micro_batches=1)
    with pytest.raises(ValueError, match="does not fit") as err:
        next(iter(s))
    assert any(f.name == "_plan_ahead" for f in __import__("traceback").extract_tb(err.value.__traceback__))
    assert not _wait_no_planner_threads()
    loader = DataLoader(FCPDataset(TextData(_lengths())), batch_sampler=s, collate_fn=FCPCollator(), num_workers=2)
    with pytest.raises(ValueError, match="does not fit"):
        next(iter(loader))
    assert not _wait_no_planner_threads()
    _join_queue_feeders()


def _join_queue_feeders(timeout: float = 5.0) -> None:
    """Collect the aborted DataLoader iterator and join the queue feeder threads its teardown leaves running."""
    gc.collect()
    end = time.monotonic() + timeout
    for t in [t for t in threading.enumerate() if t.name == "QueueFeederThread"]:
        t.join(max(0.0, end - time.monotonic()))


class _PlaceholderData:
    """Sample i: text, 4 visual placeholders (grid [[1, 4, 4]], merge 2), text — lengths[i] tokens in all."""

    VIS = 99

    def __init__(self, lengths):
        self.lengths = [int(x) for x in lengths]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        n = self.lengths[i]
        ids = torch.cat([torch.tensor([1]), torch.full((4,), self.VIS), (torch.arange(n - 5) * 7 + i) % 90 + 1])
        return {"input_ids": ids, "grid_thw": torch.tensor([[1, 4, 4]]), "pixel_values": torch.zeros(16, 3), "_index": i}


class _ExhaustedAt:
    """A position_fn that calls next() on an exhausted iterator for one sample (transformers 5.3's Qwen2.5-VL
    ``get_rope_index`` did, on an image before a video), 1-D positions for the others."""

    def __init__(self, bad: int):
        self.bad = bad

    def __call__(self, sample, ids):
        if sample["_index"] == self.bad:
            next(iter(()))
        return torch.arange(ids.numel()).expand(3, -1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stop_iteration_inside_the_collator_is_an_error_not_the_end_of_the_epoch(num_workers):
    """A StopIteration escaping the collator (here from its position_fn) would end a DataLoader's epoch early and
    silently — in its main process and from its workers alike; FCPCollator raises a RuntimeError naming the samples
    of the micro-batch instead, and the micro-batches before it arrive as usual."""
    lengths = np.clip(_lengths(60, seed=3), 8, 300)
    def sampler():
        return FCPSampler(lengths, num_ranks=2, rank=0, cost_model=CM, global_batch_size=8, prefetch=0)

    mbs = [tuple(slot.index for slot in mb) for mb in sampler()]
    k = next(k for k in range(len(mbs) // 2, len(mbs)) if mbs[k])  # a micro-batch in the middle of the epoch
    bad = mbs[k][-1]
    collate = FCPCollator(pad_token_id=0, visual_token_id=_PlaceholderData.VIS, mrope=True,
                          mask_visual_labels=False, position_fn=_ExhaustedAt(bad))
    loader = DataLoader(FCPDataset(_PlaceholderData(lengths)), batch_sampler=sampler(), collate_fn=collate,
                        num_workers=num_workers)
    got = []
    with pytest.raises(RuntimeError, match=r"StopIteration raised while collating samples \[[\d, ]*\b%d\]" % bad) \
            as err:
        for b in loader:
            got.append(b["sample_indices"])
    assert got == mbs[:k]  # everything before the failing micro-batch, nothing after it
    if num_workers == 0:
        assert isinstance(err.value.__cause__, StopIteration)


@pytest.mark.filterwarnings("ignore:.*pin_memory.*")
@pytest.mark.parametrize("num_workers,persistent,pin", [(0, False, False), (2, False, True), (2, True, False)])
def test_dataloader_batches_equal_direct_collation(num_workers, persistent, pin):
    """DataLoader(FCPDataset, batch_sampler=FCPSampler, collate_fn=FCPCollator) with workers gives, for
    two epochs, exactly the batches of collating the sampler's lists in-process (idle ranks included);
    abandoning a worker loader mid-epoch leaves no planning thread."""
    lengths = _lengths()
    data = TextData(lengths)
    collate = FCPCollator(pad_token_id=0)
    s = FCPSampler(lengths, num_ranks=8, rank=5, cost_model=CM, global_batch_size=48, prefetch=2)
    ref_s = FCPSampler(lengths, num_ranks=8, rank=5, cost_model=CM, global_batch_size=48, prefetch=0)
    ds = FCPDataset(data)
    loader = DataLoader(ds, batch_sampler=s, collate_fn=collate, num_workers=num_workers,
                        persistent_workers=persistent, pin_memory=pin)
    idle = 0
    for epoch in (0, 1):
        s.set_epoch(epoch)
        ref_s.set_epoch(epoch)
        ref = [collate(ds.__getitems__(lst)) for lst in ref_s]
        got = list(loader)
        assert len(got) == len(ref) == len(s)
        for a, b in zip(got, ref):
            _same_batch(a, b)
        idle += sum(b["cp_rank"] == -1 for b in got)
    assert idle > 0  # the idle-rank path (empty SlotList through workers) was exercised
    it = iter(loader)
    next(it)
    del it, loader  # a persistent-workers loader keeps its iterator (and so the planner) until then
    assert not _wait_no_planner_threads()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_mid_epoch(num_workers):
    """torchdata StatefulDataLoader: state after k batches, loaded into a fresh loader, continues with
    exactly the batches the uninterrupted loader yields (no repeats, no gaps)."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    lengths = _lengths()
    ds, collate = FCPDataset(TextData(lengths)), FCPCollator()

    def make():
        s = FCPSampler(lengths, num_ranks=8, rank=2, cost_model=CM, global_batch_size=48)
        s.set_epoch(1)
        return tdl.StatefulDataLoader(ds, batch_sampler=s, collate_fn=collate, num_workers=num_workers)

    full = list(make())
    loader = make()
    it = iter(loader)
    k = 5
    head = [next(it) for _ in range(k)]
    state = loader.state_dict()
    del it, loader  # StatefulDataLoader keeps its iterator (and so the planner thread) until deleted
    fresh = make()
    fresh.load_state_dict(state)
    tail = list(fresh)
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full):
        _same_batch(a, b)
    assert not _wait_no_planner_threads()


def _plan_hash(plan):
    d = plan.to_dict()
    d.pop("solve_ms")
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _gloo_worker(rank, lengths):
    import torch.distributed as dist

    s = FCPSampler(lengths, cost_model=CM, global_batch_size=40, seed=7, on_overlong="truncate")  # rank, world: dist
    assert (s.rank, s.num_ranks) == (rank, dist.get_world_size())
    s.set_epoch(3)
    hashes = [_plan_hash(s.plan_global_batch(g)) for g in range(s.num_global_batches())]
    lists = [[lst.global_batch, lst.micro_batch, list(lst.ranks), [x.index for x in lst]] for lst in s]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, hashes)
    assert all(h == hashes for h in gathered), "ranks computed different plans"
    return {"hashes": hashes, "len": len(s), "lists": lists}


def test_all_processes_compute_the_same_plan():
    """4 gloo processes, rank/world from torch.distributed: every global batch's plan hash is equal on all
    ranks, len() is equal, and the union of the ranks' slots covers each sample exactly once in the
    epoch. A failure means ranks disagree on the plan (deadlock or wrong data in a real job)."""
    world = 4
    lengths = _lengths(120, seed=5)
    with WorkerPool(world, backend="gloo") as pool:
        res = pool.run(_gloo_worker, lengths, timeout=120)
    assert all(r["hashes"] == res[0]["hashes"] for r in res) and len(res[0]["hashes"]) == 3
    assert len({r["len"] for r in res}) == 1 and all(len(r["lists"]) == r["len"] for r in res)
    seen = []
    for pos in range(res[0]["len"]):
        groups = {}
        for rank, r in enumerate(res):
            g, m, ranks, idx = r["lists"][pos]
            if ranks:
                assert rank in ranks
                groups.setdefault(tuple(ranks), set()).add(tuple(idx))
        for idx_sets in groups.values():
            assert len(idx_sets) == 1
            seen.extend(next(iter(idx_sets)))
    assert sorted(seen) == list(range(lengths.size))
