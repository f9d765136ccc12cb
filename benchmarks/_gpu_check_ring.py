"""Helpers of ``benchmarks/gpu_check.py``: the fp64 reference, the in-process ring and the
multi-process worker.

* :func:`reference_attention` — per-document float64 attention with autograd on the *rounded*
  inputs (``out``, ``lse``, ``dq``, ``dk``, ``dv``); unequal query/key lengths, GQA, documents with
  no keys (``out = 0``, ``lse = -inf``). Independent of every kernel in ``fcp_exec.kernels``.
* :class:`ThreadHub` / :class:`ThreadRingComm` — an in-process communicator with the interface
  ``ring_attention`` uses from :class:`fcp_exec.comm.RingComm` (``degree``, ``cp_rank``,
  ``send_recv(tensors, tag=, what=) -> .wait() -> list``), one Python thread per virtual rank.
* :func:`run_ring_threads` — ``degree`` threads run the real schedule of
  ``fcp_exec.ring_attention`` (``_Plan`` and ``_RingAttentionFn.forward/backward``) on zigzag shards.

Why the schedule's forward/backward are called directly and not through autograd: the autograd
engine runs every CUDA node on one worker thread per device, so ``degree`` threads that block on
each other inside ``backward`` would deadlock there; calling the static ``forward``/``backward``
with a context stand-in (:class:`_Ctx`) runs the same schedule code outside the engine, on CPU
and CUDA alike. ``ring_attention`` itself only adds argument checks and builds ``RingComm`` and
``_Plan``; :func:`run_ring_threads` does the same checks (``check_cu_seqlens``) and builds the
same ``_Plan``. If those internals are renamed, the ring check fails with a message saying so.

Run as a script this module is the worker of the multi-process check (``--worker``): one process
per rank with a real process group (NCCL on one shared GPU, or gloo on CPU), ``ring_attention``
through autograd, errors written as JSON.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch

from _args import count, nonempty, output_file, parser, positive_float, positive_int, run

__all__ = ["ThreadHub", "ThreadRingComm", "multiprocess_checks", "reference_attention", "rel_error",
           "ring_inputs", "ring_section", "run_ring_threads"]

_F64 = torch.float64


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| / max |want| (absolute when ``want`` is all zero); NaN/inf give inf."""
    if got.numel() == 0:
        return 0.0
    worst = (got.double() - want.double()).abs().max().item()  # NaN propagates through max
    if not math.isfinite(worst):
        return float("inf")
    scale = want.double().abs().max().item()
    return worst / (scale if scale > 0 else 1.0)


def reference_attention(q, k, v, dout, cu_q, cu_k, causal: bool, scale: float):
    """Float64 attention per document with autograd; returns ``(out, lse, dq, dk, dv)`` in float64.

    ``q``/``dout`` ``[T_q, H_q, D]``, ``k``/``v`` ``[T_k, H_kv, D]``; the inputs are used as given
    (already rounded to the dtype under test) and upcast. ``causal`` needs equal lengths per
    document and masks key ``j > i``. ``lse`` is ``[H_q, T_q]``, ``-inf`` on rows without keys.
    """
    h_q, h_kv = q.shape[1], k.shape[1]
    groups = h_q // h_kv
    out = torch.zeros(q.shape, dtype=_F64, device=q.device)
    lse = torch.full((h_q, q.shape[0]), float("-inf"), dtype=_F64, device=q.device)
    dq = torch.zeros(q.shape, dtype=_F64, device=q.device)
    dk = torch.zeros(k.shape, dtype=_F64, device=q.device)
    dv = torch.zeros(v.shape, dtype=_F64, device=q.device)
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if qe == qs or ke == ks:
            continue
        qd, kd, vd = (x.detach().to(_F64).requires_grad_() for x in (q[qs:qe], k[ks:ke], v[ks:ke]))
        with torch.enable_grad():
            s = torch.einsum("qhd,khd->hqk", qd, kd.repeat_interleave(groups, 1)) * scale
            if causal:
                keep = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=q.device).tril()
                s = s.masked_fill(~keep, float("-inf"))
            lse_d = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - lse_d.unsqueeze(-1))
            o = torch.einsum("hqk,khd->qhd", p, vd.repeat_interleave(groups, 1))
            g = torch.autograd.grad(o, (qd, kd, vd), dout[qs:qe].to(_F64))
        out[qs:qe], lse[:, qs:qe] = o.detach(), lse_d.detach()
        dq[qs:qe], dk[ks:ke], dv[ks:ke] = g
    return out, lse, dq, dk, dv


def ring_inputs(lengths, heads, dtype, device, seed: int):
    """``(cu, q, k, v, dout)``: random packed documents rounded to ``dtype`` on ``device``."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    gen = torch.Generator().manual_seed(seed)
    hq, hkv, d = heads
    mk = (lambda h: torch.randn(cu[-1], h, d, generator=gen, dtype=_F64).to(device=device, dtype=dtype))
    return cu, mk(hq), mk(hkv), mk(hkv), mk(hq)


# ---------------------------------------------------------------------------- in-process ring
class ThreadHub:
    """Mailboxes of ``degree`` virtual ranks living in one process (one per rank and tag).

    ``abort()`` (called when any rank fails) makes every pending and future wait raise at once.
    """

    def __init__(self, degree: int, timeout: float):
        self.degree, self.timeout = degree, float(timeout)
        self._boxes = {}
        self._lock = threading.Lock()
        self.aborted = threading.Event()

    def box(self, cp_rank: int, tag: int) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault((cp_rank, tag), queue.Queue())

    def abort(self) -> None:
        self.aborted.set()

    def comm(self, cp_rank: int) -> "ThreadRingComm":
        return ThreadRingComm(self, cp_rank)


class _Exchange:
    __slots__ = ("_comm", "_tag", "_what")

    def __init__(self, comm, tag, what):
        self._comm, self._tag, self._what = comm, tag, what

    def wait(self) -> list:
        c = self._comm
        box = c.hub.box(c.cp_rank, self._tag)
        deadline = time.monotonic() + c.hub.timeout
        while True:
            if c.hub.aborted.is_set():
                raise RuntimeError(f"virtual rank {c.cp_rank}: ring aborted (another rank failed) while "
                                   f"receiving {self._what}")
            try:
                return box.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"virtual rank {c.cp_rank}: no {self._what} from virtual rank "
                                       f"{c.prev_rank} within {c.hub.timeout:g} s") from None


class ThreadRingComm:
    """Duck-typed :class:`fcp_exec.comm.RingComm` for one virtual rank of a :class:`ThreadHub`.

    ``send_recv`` copies the tensors (as a network would: the receiver gets its own buffers) into
    the next rank's mailbox for ``tag`` and returns an exchange whose ``wait()`` takes this rank's
    message of the same ``tag`` from the previous rank. On CUDA all threads enqueue on the same
    default stream, so the copy is ordered before anything the receiver does with it.
    """

    def __init__(self, hub: ThreadHub, cp_rank: int):
        self.hub, self.degree, self.cp_rank = hub, hub.degree, cp_rank
        self.ranks = tuple(range(hub.degree))
        self.rank = cp_rank
        self.next_rank = (cp_rank + 1) % hub.degree
        self.prev_rank = (cp_rank - 1) % hub.degree
        self.timeout = hub.timeout

    def __repr__(self) -> str:
        return f"ThreadRingComm(cp_rank={self.cp_rank}, degree={self.degree})"

    def send_recv(self, tensors, *, tag: int = 0, what: str = "a block") -> _Exchange:
        if self.degree == 1:
            raise RuntimeError("send_recv on a CP group of degree 1; there is no neighbour")
        self.hub.box(self.next_rank, tag).put([t.detach().contiguous().clone() for t in tensors])
        return _Exchange(self, tag, what)

    def swap_with_neighbours(self, to_next, to_prev, *, tag: int, what: str) -> "_Swap":
        """``RingComm.swap_with_neighbours``: ``to_next`` into the next rank's mailbox, ``to_prev`` into the previous
        one's (a separate mailbox: at degree 2 both are one rank); ``wait()`` gives ``[*from_prev, *from_next]``."""
        if self.degree == 1:
            raise RuntimeError("swap_with_neighbours on a CP group of degree 1; there is no neighbour")
        self.hub.box(self.next_rank, tag).put([t.detach().contiguous().clone() for t in to_next])
        self.hub.box(self.prev_rank, tag + _BACK).put([t.detach().contiguous().clone() for t in to_prev])
        return _Swap(_Exchange(self, tag, what), _Exchange(self, tag + _BACK, what))


_BACK = 1000  # mailbox tag offset of what travels to the previous rank


class _Swap:
    __slots__ = ("_parts",)

    def __init__(self, *parts):
        self._parts = parts

    def wait(self) -> list:
        return [t for part in self._parts for t in part.wait()]


class _Ctx:
    """Stand-in for the autograd context: what ``_RingAttentionFn`` stores and reads back."""

    needs_input_grad = (True, True, True, False, False, False, False)

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def run_ring_threads(q, k, v, dout, cu, degree: int, causal: bool, scale: float, kernel,
                     timeout: float = 120.0, window: int | None = None):
    """Zigzag-shard the global ``q, k, v, dout`` over ``degree`` virtual ranks, run the ring
    schedule of ``fcp_exec.ring_attention`` forward and backward in ``degree`` threads, unshard.

    ``window``: a sliding window (``ring_attention``'s). Returns ``(out, dq, dk, dv)`` in global token order. Raises ``RuntimeError`` naming the
    failing virtual rank(s) with their exception text.
    """
    from fcp_data.layout import check_cu_seqlens, zigzag_shard, zigzag_unshard

    try:
        from fcp_exec.ring_attention import _Plan, _RingAttentionFn
    except ImportError as exc:
        raise RuntimeError("fcp_exec.ring_attention no longer has _Plan/_RingAttentionFn; update "
                           f"benchmarks/_gpu_check_ring.py to the new schedule internals ({exc})") from exc
    hub = ThreadHub(degree, timeout)
    results: dict[int, tuple] = {}
    errors: dict[int, str] = {}

    def rank_main(r: int) -> None:
        try:
            ql, cu_local = zigzag_shard(q, cu, degree, r)
            kl, vl, dl = (zigzag_shard(x, cu, degree, r)[0] for x in (k, v, dout))
            cu_l = check_cu_seqlens(cu_local, num_tokens=ql.shape[0], multiple=2 if degree > 1 else 1)
            plan = _Plan(cu_l, degree, r, causal, q.device)
            ctx = _Ctx()
            with torch.no_grad():
                out = _RingAttentionFn.forward(ctx, ql, kl, vl, plan, hub.comm(r), scale, kernel, window)
                grads = _RingAttentionFn.backward(ctx, dl)
            results[r] = (out, *grads[:3])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller with the rank
            errors[r] = f"{type(exc).__name__}: {exc}"
            hub.abort()

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"virtual-rank-{r}", daemon=True)
               for r in range(degree)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30.0)
    if any(t.is_alive() for t in threads):
        hub.abort()
        raise RuntimeError(f"ring of degree {degree}: threads still running after {timeout + 30:g} s")
    if errors:
        first = {r: errors[r] for r in sorted(errors) if "ring aborted" not in errors[r]} or errors
        raise RuntimeError(f"ring of degree {degree}: " + "; ".join(f"virtual rank {r}: {e}" for r, e in first.items()))
    return tuple(zigzag_unshard([results[r][i] for r in range(degree)], cu, degree) for i in range(4))


# ---------------------------------------------------------------------------- sections 2 and 4
def _short(dtype_name: str) -> str:
    return {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype_name]


def check_ring(kernel, inputs, ref, degree, causal, scale, tol, timeout):
    """One ring run against the reference: ``add`` keyword arguments for ``Results``."""
    cu, q, k, v, dout = inputs
    got = run_ring_threads(q, k, v, dout, cu, degree, causal, scale, kernel, timeout=timeout)
    t_out, t_grad = tol[0], tol[1]
    errors = {n: rel_error(g, w) for n, g, w in zip(("out", "dq", "dk", "dv"), got, (ref[0], *ref[2:]))}
    return {"errors": errors, "tolerances": {"out": t_out, "dq": t_grad, "dk": t_grad, "dv": t_grad}}


def ring_section(res, cfg, backends, tight, deadline, tol) -> None:
    """Degrees ``cfg.degrees`` × causal/full: an fp64 run with ``tight`` and every backend in
    every low-precision dtype (the reference kernel in the first dtype only)."""
    variants = [(*tight, "float64")]
    variants += [(label, kernel, impl, dt) for dt in cfg.dtypes for label, kernel, impl in backends
                 if not (impl == "reference" and dt != cfg.dtypes[0])]
    for degree in cfg.degrees:
        c = 2 * degree  # every document length is a multiple of 2·degree (zigzag)
        lengths = [c * 3, 0, c, c * 5, c * -(-cfg.ring_long_doc // c)]
        for causal in (True, False):
            for dtype_name in dict.fromkeys(x[3] for x in variants):
                todo = [x for x in variants if x[3] == dtype_name]
                tag = f"d={degree} {'causal' if causal else 'full'} {_short(dtype_name)} docs={lengths}"
                names = [f"ring[{label}] {tag}" for label, *_ in todo]
                if time.monotonic() > deadline:
                    res.add_all(names, "ring", skipped=True, reason=res.late_reason)
                    continue
                scale = cfg.ring_heads[2] ** -0.5
                try:
                    inputs = ring_inputs(lengths, cfg.ring_heads, getattr(torch, dtype_name), cfg.device,
                                         seed=100 + degree)
                    cu, q, k, v, dout = inputs
                    ref = reference_attention(q, k, v, dout, cu, cu, causal, scale)
                except Exception as exc:  # noqa: BLE001 - e.g. out of memory: every entry fails
                    res.add_all(names, "ring", passed=False, reason=f"inputs/reference: {type(exc).__name__}: {exc}")
                    continue
                for label, kernel, impl, _ in todo:
                    res.run(f"ring[{label}] {tag}", "ring", check_ring, kernel, inputs, ref, degree, causal,
                            scale, tol[dtype_name], cfg.ring_timeout, implementation=impl)


def _mp_attempt(backend: str, device: str, world: int, timeout: float, tol) -> dict:
    """Start ``world`` worker processes, wait at most ``timeout`` s, classify the outcome."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    if backend == "nccl":
        env.setdefault("NCCL_DEBUG", "WARN")
    with tempfile.TemporaryDirectory(prefix="fcp_gpu_check_") as tmp:
        procs = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.log"), "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r), "--world", str(world),
                     "--init", f"file://{tmp}/store", "--backend", backend, "--device", device,
                     "--result", os.path.join(tmp, f"rank{r}.json"), "--pg-timeout", str(max(10.0, timeout - 15))],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        end, timed_out = time.monotonic() + timeout, False
        try:
            for p in procs:
                try:
                    p.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)  # the worker's own session, started above
                    p.wait()
        reports, logs = [], []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    reports.append(json.load(f))
            else:
                reports.append(None)
            with open(os.path.join(tmp, f"rank{r}.log")) as f:
                logs.append(f.read()[-1500:])
    info = {"world": world, "backend": backend, "timed_out": timed_out,
            "exit_codes": [p.returncode for p in procs], "log_tails": logs,
            "worker_reports": [{k: v for k, v in (rp or {}).items() if k != "errors"} for rp in reports]}
    why = "; ".join(f"rank {r}: {rp['stage']}: {rp['error']}" for r, rp in enumerate(reports)
                    if rp and rp.get("ok") is False)
    why += "".join(f"; rank {r} stopped in {rp['stage']}" for r, rp in enumerate(reports) if rp and rp["ok"] is None)
    stuck = [rp for rp in reports if not (rp and rp.get("initialised"))]
    if stuck and backend == "nccl" and all(rp and rp["stage"] in ("init_process_group", "first collective")
                                           for rp in stuck):
        tail = why or next((lg.strip().splitlines()[-1] for lg in logs if lg.strip()), "no output")
        return {"skipped": True, **info, "reason": f"the platform did not start {world} {backend} processes on "
                f"{_where(device, world)}{' (timed out after ' + format(timeout, 'g') + ' s)' if timed_out else ''}: "
                f"{tail}"[:1500]}
    if stuck or timed_out or not all(rp.get("ok") for rp in reports):
        tail = next((lg.strip().splitlines()[-1] for lg in logs if lg.strip()), "no output")
        return {"passed": False, **info, "reason": (why or f"timed out after {timeout:g} s" if timed_out
                                                     else why or tail)[:1500]}
    errors = {f"{n}{w}": max(rp[f"errors{w}"][n] for rp in reports) for w in ("", "_window")
              for n in ("out", "dq", "dk", "dv")}
    t = tol[reports[0]["dtype"]]
    return {"errors": errors, "tolerances": {n: t[0] if n.startswith("out") else t[1] for n in errors}, **info}


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _where(device: str, world: int) -> str:
    """Where the workers run: one device each when there are enough GPUs, else all on one device."""
    return f"{world} cuda devices" if device == "cuda" and _gpus() >= world else f"one {device} device"


def multiprocess_checks(res, cfg, deadline, tol) -> None:
    """Section 4: real process groups with ``ring_attention`` (causal, then with a sliding window); NCCL on the
    GPUs (one per rank when there are enough, else all on GPU 0, which NCCL may refuse), else gloo on CPU."""
    if cfg.device.type == "cuda":
        worlds = list(cfg.mp_worlds) + ([min(_gpus(), 8)] if cfg.mp_worlds and _gpus() > max(cfg.mp_worlds) else [])
        attempts = [("nccl", "cuda", w) for w in worlds]
    else:
        res.add("multiprocess[nccl] processes sharing one GPU", "multiprocess", skipped=True,
                reason="no CUDA device (--device cpu); the gloo run below tests the same worker on CPU")
        attempts = [("gloo", "cpu", w) for w in cfg.mp_worlds]
    if not attempts:
        res.add("multiprocess", "multiprocess", skipped=True, reason="--quick runs no processes")
    refused = None
    for backend, device, world in attempts:
        name = (f"multiprocess[{backend}] {world} processes on {_where(device, world)}, ring_attention causal and "
                "with window 37")
        left = deadline - time.monotonic()
        if refused or left < 30:
            res.add(name, "multiprocess", skipped=True,
                    reason=f"{backend} already refused {refused} processes" if refused else res.late_reason)
            continue
        res.run(name, "multiprocess", _mp_attempt, backend, device, world, min(cfg.mp_timeout, left), tol)
        if res.checks[-1]["skipped"]:
            refused = world


# ---------------------------------------------------------------------------- multi-process worker
def build_parser():
    """The worker's command line (``multiprocess_checks`` starts it; not for a user to run)."""
    ap = parser("One rank of gpu_check.py's multi-process check (started by gpu_check.py).")
    ap.add_argument("--worker", action="store_true", help="run as one rank of the multi-process check")
    ap.add_argument("--rank", type=count, required=True, help="this process's rank, below --world")
    ap.add_argument("--world", type=positive_int, required=True, help="processes in the group")
    ap.add_argument("--init", type=nonempty, required=True, help="init_method URL, e.g. file:///tmp/x")
    ap.add_argument("--backend", choices=("nccl", "gloo"), required=True, help="process-group backend")
    ap.add_argument("--device", choices=("cuda", "cpu"), required=True, help="where the ring runs")
    ap.add_argument("--result", type=output_file, required=True, help="JSON file this rank writes its report to")
    ap.add_argument("--pg-timeout", type=positive_float, default=60.0, help="process-group timeout [s]")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rank >= args.world:
        ap.error(f"--rank {args.rank} must be below --world {args.world}")
    args.result = str(args.result)
    return args


def _worker(argv=None) -> int:
    """One rank of the multi-process check: ``ring_attention`` through autograd on a real group."""
    args = parse_args(argv)
    import torch.distributed as dist

    from fcp_exec import ring_attention
    from fcp_exec.kernels import default_kernel
    from fcp_data.layout import zigzag_shard

    report = {"rank": args.rank, "world": args.world, "backend": args.backend, "ok": None}

    def enter(stage: str) -> None:  # the parent reads how far a killed or failed worker got
        report["stage"] = stage
        _write_json(report, args.result)

    try:
        enter("init_process_group")
        gpu = args.rank if args.device == "cuda" and torch.cuda.device_count() >= args.world else 0
        if args.device == "cuda":
            torch.cuda.set_device(gpu)  # one GPU per rank when there are enough (NCCL refuses two on one GPU)
        dev = torch.device("cuda", gpu) if args.device == "cuda" else torch.device("cpu")
        dist.init_process_group(args.backend, init_method=args.init, rank=args.rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=args.pg_timeout))
        enter("first collective")
        x = torch.ones(1, device=dev)
        dist.all_reduce(x)  # NCCL: one world collective before any partial P2P (see fcp_exec.comm)
        if int(x.item()) != args.world:
            raise RuntimeError(f"all_reduce gave {x.item()}, expected {args.world}")
        report["initialised"] = True
        enter("ring_attention")
        d = args.world
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        report["dtype"] = str(dtype).replace("torch.", "")
        report["kernel"] = repr(default_kernel(dev))
        lengths = [2 * d * 3, 0, 2 * d, 2 * d * 37]
        cu, q, k, v, dout = ring_inputs(lengths, (4, 2, 64), dtype, dev, seed=5)
        ref = reference_attention(q, k, v, dout, cu, cu, True, 64 ** -0.5)
        ql, cul = zigzag_shard(q, torch.tensor(cu, dtype=torch.int32), d, args.rank)
        kl, vl, dl = (zigzag_shard(t, cu, d, args.rank)[0] for t in (k, v, dout))
        ql, kl, vl = (t.detach().clone().requires_grad_() for t in (ql, kl, vl))
        out = ring_attention(ql, kl, vl, cul, ranks=list(range(d)), causal=True, softmax_scale=64 ** -0.5)
        out.backward(dl)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        want = [zigzag_shard(t, cu, d, args.rank)[0] for t in (ref[0], ref[2], ref[3], ref[4])]
        got = [out.detach(), ql.grad, kl.grad, vl.grad]
        report["errors"] = {n: rel_error(g, w) for n, g, w in zip(("out", "dq", "dk", "dv"), got, want)}
        enter("ring_attention window")  # a sliding window: on a GPU the fused band per chunk pair
        report["errors_window"] = _window_errors(q, k, v, dout, cu, d, args.rank)
        enter("destroy_process_group")
        dist.destroy_process_group()
        report["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - the parent reads the stage and message
        report.update(ok=False, error=f"{type(exc).__name__}: {exc}"[-2000:])
    _write_json(report, args.result)
    return 0 if report.get("ok") else 1


def _window_errors(q, k, v, dout, cu, d: int, rank: int, window: int = 37) -> dict:
    """This rank's errors of ``ring_attention(..., window=)`` against dense float64 windowed attention."""
    from fcp_data.layout import zigzag_shard
    from fcp_exec import ring_attention
    from fcp_exec.testing import dense_attention

    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    ref = dense_attention(*leaves, cu, window=window, softmax_scale=64 ** -0.5)
    ref.backward(dout.detach().cpu().double())
    shard = (lambda t: zigzag_shard(t, cu, d, rank)[0])
    ql, kl, vl = (shard(t).detach().clone().requires_grad_() for t in (q, k, v))
    out = ring_attention(ql, kl, vl, zigzag_shard(q, torch.tensor(cu, dtype=torch.int32), d, rank)[1],
                         ranks=list(range(d)), causal=True, softmax_scale=64 ** -0.5, window=window)
    out.backward(shard(dout))
    want = [shard(t.detach()) for t in (ref, leaves[0].grad, leaves[1].grad, leaves[2].grad)]
    got = [out.detach(), ql.grad, kl.grad, vl.grad]
    return {n: rel_error(g.cpu(), w) for n, g, w in zip(("out", "dq", "dk", "dv"), got, want)}


def _write_json(doc, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    run(_worker)
