"""FCPSampler's resume position (issue 15): exact after a ``break`` at any list, after the end of an epoch,
through DataLoaders with workers (which call ``iter()`` on the batch sampler twice) and across ``iter()``
calls; states and ``set_epoch`` are validated by type.

Semantics under test (fcp_data/sampler.py, "Position and resume"): once a consumer has received lists
``0 … k`` of an epoch, ``state_dict()`` resumes at list ``k + 1``; when every list of epoch ``e`` was
yielded the state says "epoch ``e`` finished" (global batch = number of global batches, micro-batch 0) and
the next ``iter()`` yields epoch ``e + 1`` — never a replay.

Reference: the uninterrupted sequence of lists of a fresh sampler with the same config and ``prefetch=0``
(no thread involved), compared exactly (indices, groups, token counts). A failure means a restarted job
would repeat or skip samples, or that a bad state is accepted.
"""

from __future__ import annotations

import functools
import gc
import json
import threading
import time

import numpy as np
import pytest
from torch.utils.data import DataLoader

from fcp_data.cost import CostModel
from fcp_data.sampler import FCPDataset, FCPSampler

# the sampler's bookkeeping does not depend on the plan: the planner's local search is off (conftest.py)
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_local_search")]

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)
# "fixed": 10 global batches x 3 micro-batches = 30 lists; "auto": 1-3 micro-batches per global batch (planner's
# choice), so global-batch boundaries fall at irregular list positions
CONFIGS = {"fixed": dict(n=120, global_batch_size=12, micro_batches=3),
           "auto": dict(n=72, global_batch_size=12, micro_batches="auto")}
NUM_RANKS = 4
EPOCH = 3




def _lengths(n):
    rng = np.random.default_rng(1)
    return np.clip(rng.lognormal(5.0, 1.1, size=n), 1, 2000).astype(np.int64)


def _make(cfg="fixed", rank=1, prefetch=2):
    c = dict(CONFIGS[cfg])
    return FCPSampler(_lengths(c.pop("n")), num_ranks=NUM_RANKS, rank=rank, cost_model=CM, prefetch=prefetch, **c)


def _key(lst):
    return (lst.epoch, lst.global_batch, lst.micro_batch, lst.num_micro_batches, lst.ranks, lst.cp_rank,
            tuple(s.index for s in lst), tuple(s.num_tokens for s in lst), lst.num_tokens_global)


def _keys(lists):
    return [_key(x) for x in lists]


@functools.lru_cache(maxsize=None)
def _reference(cfg, epoch, rank=1):
    s = _make(cfg, rank, prefetch=0)
    s.set_epoch(epoch)
    return tuple(_keys(s))


def _position(key):
    return key[:3]


def _pos_of(state):
    return state["epoch"], state["global_batch"], state["micro_batch"]


def _threads(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


@pytest.fixture(autouse=True)
def _no_thread_leaks():
    """Every planning thread ends once its iterator is done, dropped or closed (after at most ``prefetch``
    plans scheduled ahead). A failure means a leaked background thread."""
    yield
    end = time.monotonic() + 10
    gc.collect()
    for t in _threads("fcp-planner"):
        t.join(max(0.0, end - time.monotonic()))
    assert not _threads("fcp-planner")


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_break_after_every_list_resumes_at_the_next_one(cfg):
    """For every k (first list, mid global batch, last list of a global batch, last list of the epoch): a
    consumer breaks after receiving list k; the state (through JSON) loaded into a new sampler yields exactly
    full[k+1:], and plans only the global batches it still needs (O(1) resume). After the last list the
    state says "finished" and the new sampler yields the next epoch, not a replay."""
    full = list(_reference(cfg, EPOCH))
    num_g = _make(cfg).num_global_batches(EPOCH)
    kinds = set()
    for k in range(len(full)):
        src = _make(cfg)
        src.set_epoch(EPOCH)
        head = []
        for i, lst in enumerate(src):
            head.append(_key(lst))
            if i == k:
                break
        state = json.loads(json.dumps(src.state_dict()))
        assert head == full[:k + 1]
        if k + 1 < len(full):
            assert _pos_of(state) == _position(full[k + 1]), k
            kinds.add("boundary" if full[k + 1][2] == 0 else "mid")
        else:
            assert _pos_of(state) == (EPOCH, num_g, 0)  # the epoch is finished
            kinds.add("end")
        dst = _make(cfg)
        dst.load_state_dict(state)
        assert dst.state_dict() == state
        tail = _keys(dst)
        if k + 1 < len(full):
            assert head + tail == full, k
            assert len(dst.planner_waits) == num_g - state["global_batch"]  # no replay of planned batches
        else:
            assert tail == list(_reference(cfg, EPOCH + 1))
    assert kinds == {"boundary", "mid", "end"}  # the three kinds of break points were all exercised


def test_end_of_epoch_is_never_replayed():
    """After an epoch ends (loop finished, or break after its last list), state_dict() says "finished" and
    iter() yields the next epoch; set_epoch(same epoch) keeps the position, set_epoch(e+1) starts e+1,
    set_epoch(other) starts that epoch from its first list; a fresh sampler loaded with the finished state
    continues with the next epoch too."""
    s = _make()
    s.set_epoch(EPOCH)
    assert _keys(s) == list(_reference("fixed", EPOCH))
    finished = s.state_dict()
    assert _pos_of(finished) == (EPOCH, s.num_global_batches(EPOCH), 0)
    assert _keys(s) == list(_reference("fixed", EPOCH + 1))  # no set_epoch: the next epoch, not a replay
    assert _pos_of(s.state_dict()) == (EPOCH + 1, s.num_global_batches(EPOCH + 1), 0)
    s.set_epoch(EPOCH + 1)  # the epoch of the position, which is finished: still no replay
    assert _keys(s) == list(_reference("fixed", EPOCH + 2))
    s.set_epoch(EPOCH + 3)
    assert _keys(s) == list(_reference("fixed", EPOCH + 3))
    s.set_epoch(EPOCH)  # another epoch than the position's: explicitly asked for, from its start
    assert _keys(s) == list(_reference("fixed", EPOCH))
    fresh = _make()
    fresh.load_state_dict(finished)
    fresh.set_epoch(EPOCH + 1)  # the usual loop after resuming at the end of an epoch
    assert _keys(fresh) == list(_reference("fixed", EPOCH + 1))
    fresh2 = _make()
    fresh2.load_state_dict(finished)
    assert _keys(fresh2) == list(_reference("fixed", EPOCH + 1))


def test_repeated_iter_calls_continue_and_retire_the_previous_iterator():
    """A DataLoader calls iter() on its batch sampler twice (once in _BaseDataLoaderIter.__init__, again in
    _MultiProcessingDataLoaderIter._reset) and once per epoch with persistent workers: every iter() starts at
    the position, so nothing is replayed; only the newest iterator moves the position, the previous one's
    planning thread is stopped (it still works, as an independent cursor)."""
    full = list(_reference("fixed", EPOCH))
    s = _make()
    s.set_epoch(EPOCH)
    iter(s)  # never advanced, like the DataLoader's first sampler iterator
    it2 = iter(s)
    assert [_key(next(it2)) for _ in range(5)] == full[:5]
    assert it2.planner_thread is not None and it2.planner_thread.is_alive()
    thread = it2.planner_thread
    it3 = iter(s)
    assert it2.planner_thread is None  # retired: it let go of the sampler's window, whose thread ends by itself
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [_key(next(it3)) for _ in range(2)] == full[5:7]
    assert _pos_of(s.state_dict()) == _position(full[7])
    assert _key(next(it2)) == full[5]  # the retired iterator goes on from its own position ...
    assert _pos_of(s.state_dict()) == _position(full[7])  # ... without moving the sampler's
    it2.close()
    for i, lst in enumerate(s):  # a for loop with break, then another one: continues
        assert _key(lst) == full[7 + i]
        if i == 3:
            break
    assert _keys(s) == full[11:]


class _Identity:
    """Base dataset whose sample i is i (the keys come from the slots)."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return i


def _collate_key(batch):
    """Runs in the worker: the key of the SlotList behind ``batch`` (FCPDataset keeps its metadata)."""
    slots = [slot for _, slot in batch]
    return (batch.epoch, batch.global_batch, batch.micro_batch, batch.num_micro_batches, batch.ranks, batch.cp_rank,
            tuple(s.index for s in slots), tuple(s.num_tokens for s in slots), batch.num_tokens_global)


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_plain_dataloader_after_load_state_dict_yields_exactly_the_rest(num_workers, persistent):
    """A plain DataLoader (workers 0/2, persistent or not) over a sampler loaded with the state at global
    batch 7 yields exactly the remaining lists (before the fix, with workers, all of them: the second iter()
    started from scratch); its next epochs follow, without set_epoch (the next epoch) and with it."""
    full = list(_reference("fixed", EPOCH))
    src = _make()
    src.set_epoch(EPOCH)
    state = src.state_dict()
    state["global_batch"] = 7
    rest = [k for k in full if k[1] >= 7]
    assert 0 < len(rest) < len(full)
    s = _make()
    s.load_state_dict(state)
    s.set_epoch(EPOCH)  # the usual training loop: keeps the loaded position
    loader = DataLoader(FCPDataset(_Identity()), batch_sampler=s, collate_fn=_collate_key, num_workers=num_workers,
                        persistent_workers=persistent)
    assert list(loader) == rest
    assert list(loader) == list(_reference("fixed", EPOCH + 1))
    s.set_epoch(EPOCH + 5)
    assert list(loader) == list(_reference("fixed", EPOCH + 5))
    del loader  # a persistent-workers loader keeps its iterator (and its workers) until deleted


def test_single_process_dataloader_break_keeps_the_exact_position():
    """DataLoader(num_workers=0) fetches no list ahead, so after a break at batch k the sampler's state resumes
    at list k+1 exactly (with workers it runs prefetch_factor·num_workers ahead: use state_after, or StatefulDataLoader)."""
    full = list(_reference("fixed", EPOCH))
    s = _make()
    s.set_epoch(EPOCH)
    loader = DataLoader(FCPDataset(_Identity()), batch_sampler=s, collate_fn=_collate_key)
    for k, batch in enumerate(loader):
        assert batch == full[k]
        if k == 10:
            break
    dst = _make()
    dst.load_state_dict(s.state_dict())
    assert list(DataLoader(FCPDataset(_Identity()), batch_sampler=dst, collate_fn=_collate_key)) == full[11:]


def test_resume_is_identical_on_every_rank_with_speculation():
    """Every rank runs epoch EPOCH (which speculatively plans EPOCH+1), breaks inside EPOCH+1 at the same list
    and resumes in a new sampler: each rank's lists equal its own reference, the speculative plans were used,
    and all ranks agree on the position and the global-batch/micro-batch sequence. A failure means ranks
    disagree after a restart (deadlock or wrong data)."""
    states, k = [], 7
    for rank in range(NUM_RANKS):
        s = _make(rank=rank)
        s.set_epoch(EPOCH)
        assert _keys(s) == list(_reference("fixed", EPOCH, rank))
        it = iter(s)  # no set_epoch: the next epoch, served from the speculative plans
        head = [_key(next(it)) for _ in range(k)]
        assert s.num_speculative_hits > 0
        states.append(s.state_dict())
        it.close()
        dst = _make(rank=rank)
        dst.load_state_dict(states[-1])
        assert head + _keys(dst) == list(_reference("fixed", EPOCH + 1, rank))
    assert len({_pos_of(st) for st in states}) == 1
    assert len({tuple(x[:4] + x[8:] for x in _reference("fixed", EPOCH + 1, r)) for r in range(NUM_RANKS)}) == 1


def test_load_then_state_dict_round_trips_before_iterating():
    """load_state_dict(x) then state_dict() returns x (JSON types) — at the epoch start, mid global batch,
    at a boundary and at the end; also after an iter() that was never advanced (mid-epoch states)."""
    full = list(_reference("fixed", EPOCH))
    src = _make()
    src.set_epoch(EPOCH)
    base = src.state_dict()
    num_g = src.num_global_batches(EPOCH)
    for g, m in ((0, 0), (2, 1), (5, 0), (num_g - 1, 2), (num_g, 0)):
        state = {**base, "global_batch": g, "micro_batch": m}
        s = _make()
        s.load_state_dict(state)
        assert s.state_dict() == state and json.loads(json.dumps(s.state_dict())) == state
        assert s.epoch == EPOCH
        if g < num_g:
            iter(s)
            assert s.state_dict() == state
            assert _keys(s) == full[full.index(next(k for k in full if k[1:3] == (g, m))):]


@pytest.mark.parametrize("field,value,error,match", [
    ("epoch", "1", TypeError, "epoch must be an int, got str"),
    ("epoch", 1.7, TypeError, "epoch must be an int, got float"),
    ("epoch", 1.0, TypeError, "epoch must be an int, got float"),
    ("epoch", True, TypeError, "epoch must be an int, got bool"),
    ("epoch", None, TypeError, "epoch must be an int"),
    ("global_batch", "7", TypeError, "global_batch must be an int"),
    ("micro_batch", 0.0, TypeError, "micro_batch must be an int"),
    ("micro_batch", False, TypeError, "micro_batch must be an int, got bool"),
    ("version", True, TypeError, "version must be an int, got bool"),
    ("epoch", -1, ValueError, "out of range"),
    ("global_batch", 99, ValueError, "out of range"),
    ("micro_batch", -1, ValueError, "out of range"),
    # found by a review: accepted, then failed at the first next() (past the 3 micro-batches) or as an OverflowError
    ("micro_batch", 3, ValueError, "out of range"),
    ("epoch", 2**62, ValueError, "out of range"),
    ("version", 4, ValueError, "version 4"),
])
def test_state_is_validated_by_type(field, value, error, match):
    """Position fields and the version must be ints (numpy ints are fine, bool is not): a str, float or bool
    is a TypeError naming the field (it was accepted and rounded or parsed); out of range is a ValueError.
    A refused state leaves the sampler (and an iterator) where it was."""
    s = _make()
    s.set_epoch(EPOCH)
    before = s.state_dict()
    bad = {**before, field: value}
    with pytest.raises(error, match=match):
        s.load_state_dict(bad)
    assert s.state_dict() == before
    it = iter(s)
    with pytest.raises(error, match=match):
        it.load_state_dict(bad)
    it.close()


def test_state_config_and_container_types():
    """The config fingerprint compares bools as bools (drop_last 0 is not False); a non-dict state is a
    TypeError; numpy integers are accepted as positions."""
    s = _make()
    s.set_epoch(EPOCH)
    state = s.state_dict()
    bad = {**state, "micro_batch": 1, "config": {**state["config"], "drop_last": 0}}  # mid-batch: the config must match
    with pytest.raises(ValueError, match="drop_last"):
        s.load_state_dict(bad)
    with pytest.raises(TypeError, match="must be a dict"):
        s.load_state_dict([("epoch", 1)])
    ok = {**state, "epoch": np.int64(EPOCH), "global_batch": np.int32(2), "micro_batch": np.int64(1)}
    s.load_state_dict(ok)
    assert s.state_dict() == {**state, "epoch": EPOCH, "global_batch": 2, "micro_batch": 1}
    assert all(type(s.state_dict()[k]) is int for k in ("epoch", "global_batch", "micro_batch"))


@pytest.mark.parametrize("value,error,match", [
    (1.9, TypeError, "epoch must be an int, got float"),
    (2.0, TypeError, "epoch must be an int, got float"),
    ("1", TypeError, "epoch must be an int, got str"),
    (True, TypeError, "epoch must be an int, got bool"),
    (None, TypeError, "epoch must be an int"),
    (-1, ValueError, r"epoch must be in \[0, 2\*\*62\)"),
    (2**70, ValueError, r"epoch must be in \[0, 2\*\*62\)"),  # was an OverflowError at the first plan's digest
])
def test_set_epoch_is_validated_by_type(value, error, match):
    """set_epoch(1.9) silently became epoch 1; now a float, str, bool or None is a TypeError (the position is
    unchanged), a negative epoch a ValueError; numpy ints are accepted."""
    s = _make()
    s.set_epoch(EPOCH)
    with pytest.raises(error, match=match):
        s.set_epoch(value)
    assert s.epoch == EPOCH and _pos_of(s.state_dict()) == (EPOCH, 0, 0)
    s.set_epoch(np.int64(EPOCH + 1))
    assert s.epoch == EPOCH + 1 and type(s.state_dict()["epoch"]) is int


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_at_any_point_and_at_the_end_of_an_epoch(num_workers):
    """torchdata StatefulDataLoader: a state taken after batch k (first, mid, a global-batch boundary) resumes
    with exactly full[k+1:]; a state taken after the epoch ended resumes with the next epoch — also when the
    training loop calls set_epoch(EPOCH + 1) before the loader applies its deferred state (it re-loads the
    sampler's "epoch EPOCH finished" state, which must not become a replay of EPOCH)."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    full = list(_reference("fixed", EPOCH))
    nxt = list(_reference("fixed", EPOCH + 1))

    def make():
        s = _make()
        s.set_epoch(EPOCH)
        return s, tdl.StatefulDataLoader(FCPDataset(_Identity()), batch_sampler=s, collate_fn=_collate_key,
                                         num_workers=num_workers)

    boundary = next(i for i in range(1, len(full)) if full[i][2] == 0) - 1  # last list of global batch 0
    for k in (0, 4, boundary):
        _, loader = make()
        it = iter(loader)
        head = [next(it) for _ in range(k + 1)]
        state = loader.state_dict()
        del it, loader
        _, fresh = make()
        fresh.load_state_dict(state)
        assert head + list(fresh) == full, k
        del fresh
    _, loader = make()
    assert list(loader) == full
    state = loader.state_dict()
    del loader
    for call_set_epoch in (True, False):
        s, fresh = make()
        fresh.load_state_dict(state)
        if call_set_epoch:
            s.set_epoch(EPOCH + 1)
        assert list(fresh) == nxt, call_set_epoch
        del fresh


def _collate_meta(batch):
    """Runs in the worker: a batch dict with the position keys FCPCollator's batches carry, and the list's key."""
    return {"epoch": batch.epoch, "global_batch": batch.global_batch, "micro_batch": batch.micro_batch,
            "num_micro_batches": batch.num_micro_batches, "key": _collate_key(batch)}


def test_state_after_the_consumed_batch_resumes_exactly_behind_a_dataloader_with_workers():
    """A plain DataLoader with 2 workers takes lists ahead of the loop, so state_dict() after batch k points past
    lists the loop never trained on (the trap); state_after(batch k) — or after a whole global batch,
    train_step's result — resumes with exactly full[k+1:], and after the epoch's last batch with the next epoch."""
    from types import SimpleNamespace

    full = list(_reference("fixed", EPOCH))
    nxt = list(_reference("fixed", EPOCH + 1))

    def loader_of(s):
        return DataLoader(FCPDataset(_Identity()), batch_sampler=s, collate_fn=_collate_meta, num_workers=2)

    boundary = next(i for i in range(1, len(full)) if full[i][2] == 0) - 1  # last list of global batch 0
    for k in (0, 4, boundary, len(full) - 1):
        src = _make()
        src.set_epoch(EPOCH)
        it = iter(loader_of(src))
        head = [next(it) for _ in range(k + 1)]
        last = head[-1]
        state = src.state_after(last)
        if k < len(full) - 1:
            assert _pos_of(src.state_dict()) > _pos_of(state), k  # the workers hold lists the loop has not seen
        if last["micro_batch"] == last["num_micro_batches"] - 1:  # a whole global batch: train_step's result
            assert src.state_after(SimpleNamespace(epoch=last["epoch"], global_batch=last["global_batch"])) == state
        del it
        dst = _make()
        dst.load_state_dict(json.loads(json.dumps(state)))  # a checkpoint is plain JSON
        dst.set_epoch(EPOCH)
        rest = [b["key"] for b in loader_of(dst)]
        if k < len(full) - 1:
            assert [b["key"] for b in head] + rest == full, k
        else:  # the epoch is finished: the resumed loader goes on with the next one, no replay
            assert [b["key"] for b in head] == full and rest == nxt
    s = _make()
    with pytest.raises(ValueError, match="lacks"):
        s.state_after({"epoch": EPOCH, "global_batch": 1})
    with pytest.raises(TypeError, match="train_step's result"):
        s.state_after(3)
    with pytest.raises(ValueError, match="out of range"):
        s.state_after({"epoch": EPOCH, "global_batch": 99, "micro_batch": 0, "num_micro_batches": 3})


def _global_batches(samplers, epoch):
    """Every global batch of ``epoch`` as the sorted sample indices all ranks' lists hold (what a world trains)."""
    out = {}
    for s in samplers:
        s.set_epoch(epoch)
        for lst in s:
            out.setdefault((lst.epoch, lst.global_batch), set()).update(slot.index for slot in lst)
    return {k: sorted(v) for k, v in sorted(out.items())}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_state_at_a_global_batch_boundary_resumes_on_another_world_size(world):
    """A state saved on 4 ranks after global batch 3 (micro-batch 0) loads into the samplers of 1, 2 or 3 ranks (with
    another tokens_per_rank too): the world then trains exactly the saved run's global batches 4, 5, … (the same
    samples in each), planned for its own size. Refused with the reason: a mid-global-batch state, another
    global_batch_size or seed (other batches), other data; a version-1 state (no batch digest) unless the config is
    the same."""
    lengths = _lengths(120)
    old = [FCPSampler(lengths, num_ranks=4, rank=r, cost_model=CM, global_batch_size=12, prefetch=0) for r in range(4)]
    ref = _global_batches(old, EPOCH)
    state = old[0].state_after({"epoch": EPOCH, "global_batch": 3, "micro_batch": 0, "num_micro_batches": 1})
    cm = CM.replace(tokens_per_rank=2048)  # another memory budget (lengths are at most 2,000: one rank holds any)

    def new(r, **kw):
        return FCPSampler(lengths, num_ranks=world, rank=r, cost_model=cm, prefetch=0,
                          **{"global_batch_size": 12, **kw})

    samplers = [new(r) for r in range(world)]
    for s in samplers:
        s.load_state_dict(json.loads(json.dumps(state)))
    got = {}
    for s in samplers:
        for lst in s:  # no set_epoch: the loaded position
            got.setdefault((lst.epoch, lst.global_batch), set()).update(slot.index for slot in lst)
    assert {k: sorted(v) for k, v in got.items()} == {k: v for k, v in ref.items() if k[1] >= 4}
    with pytest.raises(ValueError, match="num_ranks: saved 4"):
        new(0).load_state_dict({**state, "global_batch": 2, "micro_batch": 1})
    with pytest.raises(ValueError, match="global_batch_size: saved 12"):
        new(0, global_batch_size=10).load_state_dict(state)
    with pytest.raises(ValueError, match="seed: saved 0"):
        new(0, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="had other global batches"):  # same config, another epoch's batches
        old[0].load_state_dict({**state, "epoch": EPOCH + 1})
    other = FCPSampler(lengths + 1, num_ranks=world, rank=0, cost_model=cm, global_batch_size=12, prefetch=0)
    with pytest.raises(ValueError, match="data_digest"):
        other.load_state_dict(state)
    v1 = {k: v for k, v in state.items() if k not in ("batches", "excluded_later")} | {"version": 1}
    old[0].load_state_dict(v1)  # the saving config itself: fine
    with pytest.raises(ValueError, match="num_ranks: saved 4"):
        new(0).load_state_dict(v1)
