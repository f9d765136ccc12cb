"""Mutation review (lpt.py), second pass. The suite holds the LPT entry points to *each other* (lpt_exact vs
lpt_place, kernel vs numpy, presorted vs sorted); here each is held to a naive O(n·k) reference written from the
module docstring: items heaviest first (index order on ties), each to the group of least load with token room
``tok + s ≤ capacity`` (inclusive), lowest id on ties; None when an item fits nowhere. Integer sizes and works make
exact load ties and exactly-full groups common."""
from __future__ import annotations

import numpy as np

from fcp_data.plan import lpt


def _naive_place(work, sizes, load, tok, cap):
    out = []
    for w, s in zip(work, sizes):
        fits = [g for g in range(len(load)) if tok[g] + s <= cap]
        if not fits:
            return None
        g = min(fits, key=lambda g: (load[g], g))
        load[g] += w
        tok[g] += s
        out.append(g)
    return out


def _naive_rounds(work, sizes, k, cap):
    """lpt_labels with ≥ 16 groups (docstring): rounds of k items, heaviest first, to the groups in ascending load
    (lowest id on ties); a round that would break a group's capacity goes one by one instead."""
    n = len(work)
    order = sorted(range(n), key=lambda i: (-work[i], i))
    load, tok = [0.0] * k, [0.0] * k
    label = [None] * n
    for a in range(0, n, k):
        idx = order[a:a + k]
        g = sorted(range(k), key=lambda j: (load[j], j))[:len(idx)]
        if all(tok[gj] + sizes[i] <= cap for gj, i in zip(g, idx)):
            for gj, i in zip(g, idx):
                label[i] = gj
                load[gj] += work[i]
                tok[gj] += sizes[i]
        else:
            sub = _naive_place([work[i] for i in idx], [sizes[i] for i in idx], load, tok, cap)
            if sub is None:
                return None
            for gj, i in zip(sub, idx):
                label[i] = gj
    return label


def _draw(rng):
    n, k = int(rng.integers(1, 120)), int(rng.choice([1, 2, 3, 7, 15, 16, 17, 33, 40]))
    sizes = rng.integers(1, 12, n).astype(np.float64)
    work = rng.integers(1, 6, n).astype(np.float64)
    total = float(sizes.sum())
    cap = float(rng.choice([total, total + 1, np.ceil(total / k), np.ceil(total / k) + 1, sizes.max(), 1e9]))
    return work, sizes, k, cap


def test_lpt_place_and_heap_equal_the_naive_reference():
    rng = np.random.default_rng(12)
    placed = failed = 0
    for _ in range(400):
        work, sizes, k, cap = _draw(rng)
        order = np.lexsort((np.arange(work.size), -work))
        w, s = work[order], sizes[order]
        want = _naive_place(w.tolist(), s.tolist(), [0.0] * k, [0.0] * k, cap)
        got = lpt.lpt_place(w.tolist(), s.tolist(), [0.0] * k, [0.0] * k, cap)
        assert got == want
        heap = lpt.lpt_heap(w, s, k, cap)
        assert (heap is None) == (want is None) and (heap is None or heap.tolist() == want)
        placed += want is not None
        failed += want is None
    assert placed > 100 and failed > 40


def test_lpt_exact_vector_blocks_equal_the_naive_reference():
    """≥ 32 groups: lpt_exact's numpy blocks (not only its heap fallback), from non-empty, tied starting loads."""
    rng = np.random.default_rng(13)
    for t in range(150):
        k = int(rng.choice([32, 40, 64]))
        n = int(rng.integers(k, 6 * k))
        sizes = rng.integers(1, 9, n).astype(np.float64)
        work = -np.sort(-rng.integers(1, 5, n).astype(np.float64))
        cap = float(rng.choice([np.ceil(sizes.sum() / k) + 2, np.ceil(sizes.sum() / k * 1.3), 1e9]))
        load0 = rng.integers(0, 2, k).astype(np.float64)
        want = _naive_place(work.tolist(), sizes.tolist(), load0.tolist(), [0.0] * k, cap)
        got = lpt.lpt_exact(work, sizes, load0.copy(), np.zeros(k), cap)
        assert (got is None) == (want is None), t
        if want is not None:
            assert got.tolist() == want, t


def test_lpt_labels_equal_the_naive_reference():
    rng = np.random.default_rng(14)
    for t in range(400):
        work, sizes, k, cap = _draw(rng)
        if k == 1:
            want = [0] * work.size if sizes.sum() <= cap else None
        elif k < 16:
            order = sorted(range(work.size), key=lambda i: (-work[i], i))
            sub = _naive_place([work[i] for i in order], [sizes[i] for i in order], [0.0] * k, [0.0] * k, cap)
            want = None
            if sub is not None:
                want = [0] * work.size
                for g, i in zip(sub, order):
                    want[i] = g
        else:
            want = _naive_rounds(work.tolist(), sizes.tolist(), k, cap)
        got = lpt.lpt_labels(work, sizes, k, cap)
        assert (got is None) == (want is None), (t, k, cap)
        if want is not None:
            assert got.tolist() == want, (t, k, cap)


def test_one_group_holds_exactly_its_capacity():
    assert lpt.lpt_labels(np.ones(3), np.array([4.0, 3.0, 3.0]), 1, 10.0).tolist() == [0, 0, 0]
    assert lpt.lpt_labels(np.ones(3), np.array([4.0, 3.0, 3.0]), 1, 9.999) is None


def test_sixteen_groups_run_in_rounds():
    """From 16 groups on, LPT runs in rounds (docstring): after a first round that leaves groups 14 and 15 light
    (5 x 14, 1, 1), the next 16 unit items go one to each group in ascending load (14, 15, 0 … 13); one-by-one LPT
    would give groups 14 and 15 four items each first."""
    work = np.array([5.0] * 14 + [1.0] * 18)
    sizes = np.ones(work.size)
    got = lpt.lpt_labels(work, sizes, 16, 1e9)
    assert got.tolist() == list(range(16)) + [14, 15] + list(range(14))
    assert got.tolist() == _naive_rounds(work.tolist(), sizes.tolist(), 16, 1e9)
