"""Gradient synchronisation for :func:`fcp_exec.step.train_step`: the reducers and how to get one.

A reducer has ``sync_context(model, last)`` (entered around each micro-batch's backward; gradients synchronise only
when ``last``) and ``finish(model)`` (after the last micro-batch). All three SUM over ranks (each rank's loss is
already its share of the global-batch mean):

* :class:`AllReduceReducer` — a plain module (rank 0's parameters and buffers broadcast first, once, as DDP does);
  one flat all-reduce after the last micro-batch.
* :class:`DDPReducer` — ``DistributedDataParallel``; a SUM comm hook instead of its average.
* :class:`FSDP2Reducer` — ``fully_shard``; divide factor 1 on every FSDP module.
* :class:`FSDP1Reducer` — ``FullyShardedDataParallel`` (FSDP1, Accelerate's default FSDP); a SUM comm hook on every
  root instead of its average.
* :class:`DeepSpeedReducer` — a DeepSpeed engine (ZeRO 0–3): each micro-batch's backward through the engine, the last
  one at its gradient-accumulation boundary, the loss times the data-parallel size (DeepSpeed averages).

A reducer may also have ``backward(model, loss)`` (the backward goes through it instead of ``loss.backward()``) and
``exact_denominator = True`` (gradients cannot be rescaled after the backward, so ``train_step`` takes failed reads
out of the loss denominator before the first forward).

:func:`make_reducer` wraps a model by name; :func:`reducer_for` picks the reducer for a model already wrapped by
someone else (Accelerate's ``prepare``, a trainer's own wrapping).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from fcp_data.sampler_inputs import dist_rank_and_world
from fcp_exec.compat import (HSDP_RELEASE, MissingDependency, check_fsdp2_device, fsdp2_api,
                             fsdp_divide_factor_setter, torch_release, undo_fsdp_gradient_average)
from fcp_exec.grads import broadcast_module_states, mark_replaced
from fcp_exec.names import REDUCER_NAMES

__all__ = ["REDUCER_NAMES", "AllReduceReducer", "DDPReducer", "DeepSpeedReducer", "FSDP1Reducer", "FSDP2Reducer",
           "fsdp1_roots", "full_view", "grad_scaler_class", "make_reducer", "mixed_precision", "reducer_for"]


class AllReduceReducer:
    """No wrapper: after the last micro-batch, one flat all-reduce SUM of every parameter's gradient (zeros
    where a parameter got none), copied back into ``.grad``. Given the ``model`` (as :func:`make_reducer` and
    :func:`reducer_for` do), rank 0's parameters and buffers are broadcast to every rank first, once per model, as
    DDP does (:func:`fcp_exec.grads.broadcast_module_states`): ranks initialised apart train the same weights."""

    name = "allreduce"
    sets_aside_grads = True  # train_step reduces only its own gradients (accumulation over steps: fcp_exec.grads)

    def __init__(self, model: nn.Module | None = None) -> None:
        if model is not None:
            broadcast_module_states(model)

    def sync_context(self, model: nn.Module, last: bool):
        return contextlib.nullcontext()

    def finish(self, model: nn.Module) -> None:
        rank, world = dist_rank_and_world()
        params = [p for p in model.parameters() if p.requires_grad]
        if world == 1 or not params:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        from fcp_exec.launch import collective_dtype

        wire = collective_dtype(flat.dtype)
        if wire != flat.dtype:
            flat = flat.to(wire)
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype).clone()
            offset += n


def _sum_allreduce_hook(state, bucket):
    """DDP comm hook: all-reduce SUM (DDP's default divides by the world size)."""
    work = dist.all_reduce(bucket.buffer(), group=state, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DDPReducer:
    """``DistributedDataParallel`` with SUM gradients, synchronised in the last micro-batch's backward only."""

    name = "ddp"
    sets_aside_grads = True

    def __init__(self, ddp_model: nn.Module) -> None:
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(f"DDPReducer needs a DistributedDataParallel module, got {type(ddp_model).__name__}; "
                            "use make_reducer('ddp', model)")
        ddp_model.register_comm_hook(None, _sum_allreduce_hook)

    def sync_context(self, model: nn.Module, last: bool):
        return contextlib.nullcontext() if last else model.no_sync()

    def finish(self, model: nn.Module) -> None:
        return None


def _fsdp_modules(model: nn.Module) -> list:
    FSDPModule = fsdp2_api()[1]
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


class FSDP2Reducer:
    """FSDP2 (``fully_shard``): SUM reduce-scatter on every FSDP module (``set_gradient_divide_factor(1.0)`` and
    ``set_force_sum_reduction_for_comms(True)`` are per module, not recursive, so they are set on each), gradient
    sync only in the last micro-batch. Needs torch>=2.5 (2.4 has no divide factor to set)."""

    name = "fsdp2"
    sets_aside_grads = True

    def __init__(self, model: nn.Module) -> None:
        mods = _fsdp_modules(model)
        if not mods:
            raise TypeError("FSDP2Reducer needs a model with fully_shard applied; use make_reducer('fsdp2', model)")
        if torch_release() < HSDP_RELEASE and any(len(getattr(p, "placements", ())) > 1 for p in model.parameters()):
            raise MissingDependency(f"HSDP (FSDP2 over a 2-D mesh) with torch {torch.__version__}: before 2.8 FSDP2 "
                                    "averages the all-reduce across replicas, which fcp's SUM reducer does not undo; "
                                    "HSDP needs torch>=2.8 (tested on 2.13), or shard over a 1-D mesh")
        for m in mods:
            setter = fsdp_divide_factor_setter(m)
            if setter is None:
                raise MissingDependency(f"FSDP2 of torch {torch.__version__} averages gradients and has no divide "
                                        "factor to set; fcp's fsdp2 reducer needs torch>=2.5 (or use the 'ddp' "
                                        "reducer)")
            setter(1.0)
            # a plain SUM reduce-scatter: fp32/bf16 would otherwise use PREMUL_SUM(1/factor), which gloo lacks
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)

    def sync_context(self, model: nn.Module, last: bool):
        @contextlib.contextmanager
        def ctx():
            model.set_requires_gradient_sync(last, recurse=True)
            yield

        return ctx()

    def finish(self, model: nn.Module) -> None:
        """torch 2.5–2.7 averaged float16/float64 reductions despite the divide factor 1: multiply them back."""
        for m in _fsdp_modules(model):
            undo_fsdp_gradient_average(m)


def fsdp1_roots(model: nn.Module) -> list:
    """The outermost ``FullyShardedDataParallel`` (FSDP1) instances of ``model`` (itself when it is one), or []."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.fsdp_modules(model, root_only=True)


_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)  # 2.13 name


def _sum_reduce_hook(group, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    """FSDP1 comm hook: a SUM where FSDP1 divides by the data-parallel size (all-reduce for ``NO_SHARD``, else a
    reduce-scatter of the padded flat gradient into this rank's shard ``output``)."""
    if output is None:
        dist.all_reduce(grad, group=group)
    else:
        _REDUCE_SCATTER(output, grad, group=group)


def full_view(model: nn.Module, grads: bool = False):
    """While inside, an FSDP1-wrapped ``model``'s parameters (and with ``grads`` their gradients: FSDP1 needs
    ``use_orig_params=True`` for that) are whole on every rank (``summon_full_params``, read-only; a collective: every
    rank enters); any other model as it is."""
    if not fsdp1_roots(model):
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.summon_full_params(model, writeback=False, with_grads=grads)


class FSDP1Reducer:
    """FSDP1 (``FullyShardedDataParallel``, e.g. Accelerate's ``fsdp_version`` 1): a SUM comm hook on every root
    instance (FSDP1 divides by the data-parallel size), gradient sync only in the last micro-batch (``no_sync``
    before: full gradients accumulate locally, FSDP1's rule). ``FULL_SHARD``, ``SHARD_GRAD_OP`` and ``NO_SHARD``
    over a group of every rank; hybrid sharding is refused (FSDP1 takes no comm hook there: use FSDP2 HSDP), as is
    a group smaller than the world (FCP's global batch spans every rank). Clip with
    :func:`fcp_exec.optim.clip_grad_norm` (the squares of every rank's flat shards, one all-reduce) or FSDP1's own
    ``clip_grad_norm_`` on the root (float32 and lower only); fp16 with :func:`grad_scaler_class` ``("fsdp1")``."""

    name = "fsdp1"
    exact_when_accumulating = True  # over steps: failed reads leave the denominator first (fcp_exec.grads.holds_grads)

    def __init__(self, model: nn.Module) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        self.roots = fsdp1_roots(model)
        if not self.roots:
            raise TypeError("FSDP1Reducer needs a model wrapped in FullyShardedDataParallel; use "
                            "make_reducer('fsdp1', model)")
        world = dist.get_world_size()
        for m in FullyShardedDataParallel.fsdp_modules(model):
            if "HYBRID" in str(getattr(m, "sharding_strategy", "")):  # HYBRID_SHARD, _HYBRID_SHARD_ZERO2
                raise ValueError(f"FSDP1 with {m.sharding_strategy}: FSDP1 takes no gradient hook with hybrid "
                                 "sharding, so fcp cannot make its reduction the SUM it needs; use FULL_SHARD or "
                                 "SHARD_GRAD_OP, or FSDP2 over a 2-D mesh (HSDP, make_reducer('fsdp2', mesh=...))")
            size = dist.get_world_size(m.process_group)
            if size != world:
                raise ValueError(f"FSDP1 over a process group of {size} of the {world} ranks: FCP's global batch "
                                 "spans every rank, so gradients must be reduced over all of them; shard over the "
                                 "default (world) group")
        for root in self.roots:
            if not getattr(root, "_fcp_sum_hook", False):  # once per wrapped model (FSDP1 refuses a second hook)
                root.register_comm_hook(root.process_group, _sum_reduce_hook)
                root._fcp_sum_hook = True

    def sync_context(self, model: nn.Module, last: bool):
        if last:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for root in self.roots:
            stack.enter_context(root.no_sync())
        return stack

    def finish(self, model: nn.Module) -> None:
        return None

    @staticmethod
    def check_grad_scaler(scaler) -> None:
        """fp16 needs FSDP1's ``ShardedGradScaler``: a plain ``GradScaler`` checks only this rank's gradient shard for
        overflow, so one rank would skip a step the others take."""
        if not isinstance(scaler, grad_scaler_class("fsdp1")):
            raise ValueError(f"FSDP1 with {type(scaler).__name__}: each rank sees only its gradient shard, so ranks "
                             "would skip fp16 overflow steps on their own; use torch.distributed.fsdp."
                             "sharded_grad_scaler.ShardedGradScaler (it all-reduces the overflow check)")


def grad_scaler_class(reducer: str) -> type:
    """fp16's loss scaler for a reducer name: FSDP1's ``ShardedGradScaler`` (its overflow check all-reduced over the
    shards) for ``fsdp1``, else ``torch.amp.GradScaler`` (FSDP2's DTensor gradients are checked across the mesh)."""
    if reducer == "fsdp1":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler
    return torch.amp.GradScaler


def _is_deepspeed_engine(model: nn.Module) -> bool:
    return any(c.__name__ == "DeepSpeedEngine" and c.__module__.startswith("deepspeed.") for c in type(model).__mro__)


class DeepSpeedReducer:
    """A DeepSpeed engine (``deepspeed.initialize``, or the Trainer's through Accelerate), ZeRO stage 0–3: every
    micro-batch's backward runs through ``engine.backward`` (its ZeRO gradient hooks and partitions), the last one
    at the engine's gradient-accumulation boundary (where it reduces), with ``scale_wrt_gas=False`` and the loss
    multiplied by the data-parallel size: DeepSpeed *averages* gradients over it, the loss is already each rank's
    share of the global mean, so the product makes the average a SUM. The caller steps the engine
    (``engine.step()``: clipping, optimizer, its scheduler) after :func:`~fcp_exec.step.train_step`. Gradients live in
    the engine's partitions, not ``.grad``: ``exact_denominator`` makes ``train_step`` count failed reads first."""

    name = "deepspeed"
    exact_denominator = True

    def __init__(self, engine: nn.Module) -> None:
        if not _is_deepspeed_engine(engine):
            raise TypeError(f"DeepSpeedReducer needs a DeepSpeed engine, got {type(engine).__name__}")
        sp = int(getattr(engine, "sequence_parallel_size", 1) or 1)
        if sp != 1:
            raise ValueError(f"DeepSpeed sequence parallelism (sequence_parallel_size={sp}, Ulysses) is not supported "
                             "with FCP, which forms the context-parallel groups itself; set it to 1")
        self.scale = float(engine.dp_world_size)

    def sync_context(self, model: nn.Module, last: bool):
        @contextlib.contextmanager
        def ctx():
            model.set_gradient_accumulation_boundary(last)
            yield

        return ctx()

    def backward(self, model: nn.Module, loss: torch.Tensor) -> None:
        model.backward(loss * self.scale, scale_wrt_gas=False)

    def finish(self, model: nn.Module) -> None:
        return None


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps before the root: HF's ``_no_split_modules`` classes (decoder layers,
    vision blocks) when the model declares them, else every child of an ``nn.ModuleList``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        units = [m for m in model.modules() if type(m).__name__ in names and m is not model]
        if units:
            return units
    return [m for ml in model.modules() if isinstance(ml, nn.ModuleList) for m in ml]


def make_reducer(name: str, model: nn.Module, *, find_unused_parameters: bool | None = None, shard_units=None,
                 mp_policy=None, mesh=None):
    """``(model, reducer)`` for reducer ``name``: the model as ``train_step`` should call it (DDP-wrapped or
    ``fully_shard``-ed in place) and the reducer. ``shard_units``: modules to ``fully_shard`` before the root
    (default :func:`_shard_units`). ``mp_policy`` (fsdp2 only): FSDP2's ``MixedPrecisionPolicy`` for every unit, e.g.
    ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`` — bf16 compute over float32
    sharded parameters, float32 gradient reduction. ``mesh`` (fsdp2 only): FSDP2's device mesh; a 2-D one
    ``(replicate, shard)`` is HSDP (parameters sharded within each group of the shard dimension, replicated across
    them; gradients still SUM over every rank). ``fsdp1``: :func:`_wrap_fsdp1`. ``find_unused_parameters`` (ddp
    only): None — True for a transformers model type whose own forward leaves parameters without a gradient
    (``UNUSED_PARAMETER_MODEL_TYPES``: LLaVA-OneVision's vision post_layernorm), else False. Needs an initialised
    process group for ddp, fsdp2 and fsdp1. ``allreduce`` broadcasts rank 0's parameters and buffers (as DDP does).
    Build the optimizer *after* this call: ``fsdp2`` replaces the parameters with sharded ones."""
    if name not in REDUCER_NAMES:
        raise ValueError(f"unknown reducer {name!r}; choose one of {', '.join(REDUCER_NAMES)}")
    if (mp_policy is not None or mesh is not None) and name != "fsdp2":
        what = "mp_policy is FSDP2's mixed precision" if mp_policy is not None else "mesh is FSDP2's device mesh"
        raise ValueError(f"{what}: it needs reducer 'fsdp2', got {name!r}")
    if name == "allreduce":
        return model, AllReduceReducer(model)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"reducer {name!r} needs an initialised process group (torchrun or fcp_exec.launch)")
    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if find_unused_parameters is None:
            from fcp_exec.integrations.hf_models import leaves_parameters_unused

            find_unused_parameters = leaves_parameters_unused(model)
        dev = next(model.parameters()).device
        ddp = DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None,
                                      find_unused_parameters=find_unused_parameters)
        return ddp, DDPReducer(ddp)
    if name == "fsdp1":
        return _wrap_fsdp1(model, shard_units)
    check_fsdp2_device(next(model.parameters()).device)
    fully_shard = fsdp2_api()[0]
    kw = {k: v for k, v in (("mp_policy", mp_policy), ("mesh", mesh)) if v is not None}
    old = list(model.parameters())
    for unit in (shard_units if shard_units is not None else _shard_units(model)):
        fully_shard(unit, **kw)
    fully_shard(model, **kw)
    mark_replaced(old, model)  # an optimizer built before holds them: its first step() says so
    return model, FSDP2Reducer(model)


def _wrap_fsdp1(model: nn.Module, shard_units) -> tuple:
    """FSDP1 over the world group: one FSDP unit per class of ``shard_units`` (default :func:`_shard_units`, the
    decoder layers), ``FULL_SHARD``, ``use_orig_params=True`` (the optimizer sees the model's own parameters), on the
    parameters' device; every rank builds the model from the same seed, so no broadcast of module states."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    units = shard_units if shard_units is not None else _shard_units(model)
    dev = next(model.parameters()).device
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({type(u) for u in units}),
                                       device_id=dev, use_orig_params=True)
    return wrapped, FSDP1Reducer(wrapped)


def mixed_precision(param_dtype: str | torch.dtype | None):
    """FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype=torch.float32)`` for ``make_reducer(mp_policy=...)``
    (``"bfloat16"`` or a dtype), or None for ``None``/``"none"``."""
    if param_dtype is None or param_dtype == "none":
        return None
    MixedPrecisionPolicy = fsdp2_api()[2]
    dtype = getattr(torch, param_dtype) if isinstance(param_dtype, str) else param_dtype
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def reducer_for(model: nn.Module):
    """The reducer for a model that is already wrapped: ``DistributedDataParallel`` → :class:`DDPReducer` (its comm
    hook becomes a SUM: call once per wrapped model), ``fully_shard``-ed → :class:`FSDP2Reducer`,
    ``FullyShardedDataParallel`` (FSDP1) → :class:`FSDP1Reducer`, a DeepSpeed
    engine → :class:`DeepSpeedReducer` (step the engine after ``train_step``), else :class:`AllReduceReducer` (rank 0's
    parameters and buffers broadcast to every rank, once per model). For a loop whose model Accelerate (or another
    trainer) prepared::

        model, opt = accelerator.prepare(apply_fcp(model), opt)
        reducer = reducer_for(model)
        res = train_step(model, batches, fcp_loss, reducer)   # not accelerator.backward / accumulate

    A ``torch.compile``-d model is looked through (``_orig_mod``)."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(model, "_orig_mod", model)
    if _is_deepspeed_engine(inner):
        return DeepSpeedReducer(inner)
    if isinstance(inner, DistributedDataParallel):
        return DDPReducer(inner)
    if _fsdp_modules(inner):
        return FSDP2Reducer(inner)
    if fsdp1_roots(inner):
        return FSDP1Reducer(inner)
    return AllReduceReducer(inner)
