"""Ring point-to-point communication inside one *logical* CP group.

A CP group is just the tuple of global ranks in ring order; nothing here creates a process group.
:class:`RingComm` maps the group position (``cp_rank``) to global ranks and exchanges tensors with
the ring neighbours through ``dist.batch_isend_irecv`` on a base process group (the world group by
default). Several groups of different degrees can run at once on one world, and the grouping may
change on every call, because every call only talks to its own two neighbours.

Timeouts: a :class:`PendingExchange` waits on each P2P work with the ``timeout`` given to
:class:`RingComm`; when it passes, the wait raises a ``RuntimeError`` naming the peer rank that
did not answer. Without a ``timeout`` the base group's own timeout applies (``init_process_group
(timeout=...)``; gloo: 30 min by default, NCCL: its watchdog). On NCCL a host-side wait with a
timeout blocks the CPU until the transfer finishes, so leave ``timeout=None`` there and rely on
the watchdog. Also on NCCL, the first P2P on a communicator must not be a partial-group call:
run one collective on the world group (e.g. a barrier) after ``init_process_group``.
"""
from __future__ import annotations

import datetime
import operator
from typing import Sequence

import torch
import torch.distributed as dist

__all__ = ["PendingExchange", "RingComm", "validate_ranks"]


def validate_ranks(ranks: Sequence[int]) -> tuple[int, ...]:
    """Check a CP group given as global ranks in ring order; returns it as a tuple of ints."""
    if isinstance(ranks, torch.Tensor):
        ranks = ranks.tolist()
    if ranks is None:
        raise ValueError("ranks is required: this rank's CP group as global ranks in ring order, this rank included "
                         "(FCPCollator's batch['ranks'])")
    msg = f"ranks must be a sequence of non-negative int global ranks, got {ranks!r}"
    try:
        items = list(ranks)
    except TypeError:
        raise ValueError(msg) from None
    out = []
    for r in items:
        if isinstance(r, bool):
            raise ValueError(msg)
        try:
            out.append(operator.index(r))
        except TypeError:
            raise ValueError(msg) from None
    if not out:
        raise ValueError("ranks is empty; a CP group needs at least this rank")
    if any(r < 0 for r in out):
        raise ValueError(msg)
    if len(set(out)) != len(out):
        raise ValueError(f"ranks has duplicates: {ranks!r}; each rank appears once in a CP group")
    return tuple(out)


class PendingExchange:
    """Posted sends/receives of one ring step; :meth:`wait` returns the received tensors."""

    __slots__ = ("_works", "_recv", "_send", "_comm", "_what", "_peers")

    def __init__(self, works, recv, send, comm: "RingComm", what: str, peers=None):
        self._works, self._recv, self._send, self._comm, self._what = works, recv, send, comm, what
        # (peer rank, is_recv) of each posted op, in posting order; default: [send to next, recv from prev] pairs
        self._peers = peers

    def wait(self) -> list[torch.Tensor]:
        c = self._comm
        # batch_isend_irecv returns one work per op (gloo) or one for the whole batch (NCCL)
        per_op = self._peers is not None and len(self._peers) == len(self._works)
        for i, work in enumerate(self._works):
            if per_op:
                peer, is_recv = self._peers[i]
            else:
                is_recv = len(self._works) > 1 and i % 2 == 1
                peer = c.prev_rank if is_recv else c.next_rank
            try:
                if c.timeout is None:
                    work.wait()
                else:
                    work.wait(c.timeout)
            except RuntimeError as exc:
                action = f"receiving {self._what} from" if is_recv else f"sending {self._what} to"
                raise RuntimeError(
                    f"ring attention: rank {c.rank} (cp_rank {c.cp_rank} of CP group {c.ranks}) "
                    f"timed out or failed {action} peer rank {peer}"
                    f"{'' if c.timeout is None else f' after {c.timeout.total_seconds():g} s'}; "
                    f"is rank {peer} alive and running the same ring_attention call with "
                    f"ranks={list(c.ranks)}? ({exc})") from exc
        self._works = []
        self._send = None
        return self._recv


class RingComm:
    """P2P with the ring neighbours of this rank inside the logical CP group ``ranks``.

    ``ranks`` are global ranks (as in ``dist.get_rank()``) in ring order; this rank must be one of
    them. ``group`` is the base process group the P2P runs on (default: the world group); it must
    contain every rank of ``ranks``. ``timeout`` (seconds or ``timedelta``) bounds every wait.
    Validation happens here, before any communication.
    """

    def __init__(self, ranks: Sequence[int], *, group=None, timeout=None):
        self.ranks = validate_ranks(ranks)
        self.degree = len(self.ranks)
        self.group = group
        if timeout is not None and not isinstance(timeout, datetime.timedelta):
            if not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
            timeout = datetime.timedelta(seconds=float(timeout))
        self.timeout = timeout
        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank()
            world = dist.get_world_size()
            bad = [r for r in self.ranks if r >= world]
            if bad:
                raise ValueError(f"ranks {bad} of CP group {self.ranks} are outside the world of size {world}")
            if group is not None:
                members = set(dist.get_process_group_ranks(group))
                missing = [r for r in self.ranks if r not in members]
                if missing:
                    raise ValueError(f"ranks {missing} of CP group {self.ranks} are not in the base group")
        elif self.degree == 1:  # no process group: a world of one, this process rank 0 (as everywhere in fcp)
            self.rank = 0
        else:
            raise ValueError(
                f"CP group {self.ranks} has degree {self.degree} but torch.distributed is not "
                "initialised; call init_process_group first (degree 1 needs no process group)")
        if self.rank not in self.ranks:
            raise ValueError(
                f"this process is rank {self.rank}, which is not in its CP group ranks={list(self.ranks)}; "
                "pass the group that contains this rank")
        self.cp_rank = self.ranks.index(self.rank)
        self.next_rank = self.ranks[(self.cp_rank + 1) % self.degree]
        self.prev_rank = self.ranks[(self.cp_rank - 1) % self.degree]

    def __repr__(self) -> str:
        return f"RingComm(ranks={self.ranks}, rank={self.rank}, cp_rank={self.cp_rank})"

    def send_recv(self, tensors: Sequence[torch.Tensor], *, tag: int = 0, what: str = "a block") -> PendingExchange:
        """Post: send ``tensors`` to the next rank, receive same-shaped tensors from the previous one.

        Returns at once; the transfers overlap with whatever runs before :meth:`PendingExchange.wait`.
        """
        if self.degree == 1:
            raise RuntimeError("send_recv on a CP group of degree 1; there is no neighbour")
        ops, recv, send = [], [], []
        for i, t in enumerate(tensors):
            t = t.contiguous()
            buf = torch.empty_like(t)
            send.append(t)
            recv.append(buf)
            ops.append(dist.P2POp(dist.isend, t, self.next_rank, self.group, tag=tag + i))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev_rank, self.group, tag=tag + i))
        works = dist.batch_isend_irecv(ops)
        return PendingExchange(list(works), recv, send, self, what)

    def exchange_with_neighbours(self, t: torch.Tensor, *, tag: int, what: str) -> dict[int, torch.Tensor]:
        """Send ``t`` to both ring neighbours and receive theirs (same shape and dtype): one batched P2P
        round trip. Returns ``{peer rank: its tensor}`` (one entry when degree is 2: the neighbours coincide).
        Used for the small shape header that :func:`~fcp_exec.ring_attention.ring_attention` checks
        before the first K/V block travels."""
        if self.degree == 1:
            raise RuntimeError("exchange_with_neighbours on a CP group of degree 1; there is no neighbour")
        t = t.contiguous()
        peers = [self.next_rank] if self.degree == 2 else [self.next_rank, self.prev_rank]
        ops, recv, desc = [], {}, []
        for j, peer in enumerate(peers):
            # j = 0: to next / from prev; j = 1: to prev / from next (distinct tags: gloo matches on them)
            src = self.prev_rank if j == 0 else self.next_rank
            recv[src] = torch.empty_like(t)
            ops.append(dist.P2POp(dist.isend, t, peer, self.group, tag=tag + j))
            ops.append(dist.P2POp(dist.irecv, recv[src], src, self.group, tag=tag + j))
            desc += [(peer, False), (src, True)]
        PendingExchange(list(dist.batch_isend_irecv(ops)), list(recv.values()), [t], self, what, desc).wait()
        return recv

    def swap_with_neighbours(self, to_next: Sequence[torch.Tensor], to_prev: Sequence[torch.Tensor], *, tag: int,
                             what: str) -> PendingExchange:
        """Post: send ``to_next`` to the next rank and ``to_prev`` to the previous one, receive same-shaped tensors
        (what the previous rank sends forward, then what the next rank sends back): :meth:`PendingExchange.wait`
        returns ``[*from_prev, *from_next]``. Tags ``tag + i`` forward, ``tag + len(to_next) + i`` back (distinct:
        at degree 2 both neighbours are one rank)."""
        if self.degree == 1:
            raise RuntimeError("swap_with_neighbours on a CP group of degree 1; there is no neighbour")
        ops, recv, send, peers = [], [], [], []
        for i, (t, dst, src) in enumerate([(t, self.next_rank, self.prev_rank) for t in to_next]
                                          + [(t, self.prev_rank, self.next_rank) for t in to_prev]):
            t = t.contiguous()
            buf = torch.empty_like(t)
            send.append(t)
            recv.append(buf)
            ops += [dist.P2POp(dist.isend, t, dst, self.group, tag=tag + i),
                    dist.P2POp(dist.irecv, buf, src, self.group, tag=tag + i)]
            peers += [(dst, False), (src, True)]
        return PendingExchange(list(dist.batch_isend_irecv(ops)), recv, send, self, what, peers)
