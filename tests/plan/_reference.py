"""The §4.1 group time written out term by term (DESIGN.md), the reference the planning tests compare against."""

from __future__ import annotations

from fcp_data.cost import CostModel


def reference_time(cm: CostModel, s, e, v, ranks) -> float:
    """Time of one group holding sequences of lengths ``s``, mask factors ``e`` and visual tokens ``v`` on its global
    ``ranks`` (intra-node bandwidth when they share a node, else inter-node)."""
    d = len(ranks)
    bw = cm.bandwidth_intra if len({r // cm.ranks_per_node for r in ranks}) == 1 else cm.bandwidth_inter
    A = sum(cm.alpha1 * (1 + ek) * sk * sk for sk, ek in zip(s, e)) / d
    C = (A + cm.alpha2 * sum(s) / d + cm.alpha_blk * sum((1 + ek) * sk for sk, ek in zip(s, e))
         + cm.alpha_vis * sum(v) / d + cm.beta1)
    X = 0.0 if d == 1 else cm.alpha3 * sum(s) * (d - 1) / d / bw
    M = 0.0 if d == 1 else X + cm.beta2 + cm.gamma * (d - 1)
    return C + M - min(A, X)
