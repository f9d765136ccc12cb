"""``fcp env``: what this machine gives fcp — versions, devices, distributed backends, the attention kernel per
device, the optional packages and what fcp uses each for, the FCP_* and thread settings — with notes on versions
fcp was not tested with. For a bug report (``fcp env --json``) and for a first look at a new cluster image before a
long job.

Nothing here starts a process or touches a device beyond asking torch what it sees. Package versions come from the
installed distributions' metadata (no package is imported for them); ``torch_npu`` and ``flash-attn`` are imported
to say whether they load (an NPU stack without CANN, or a flash-attn built for another torch, fails only then).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from typing import Any

__all__ = ["register", "environment", "PACKAGES"]

# (distribution, what fcp uses it for, versions tested with, the supported range as (lowest, below) or None)
PACKAGES: tuple[tuple[str, str, tuple[str, ...], tuple[str, str] | None], ...] = (
    ("transformers", "hf: models, FCPTrainer, hf_collator", ("5.18", "5.20", "5.23", "5.24", "5.25"), ("5.18", "6")),
    ("accelerate", "FCPTrainer (the Trainer's own requirement)", (), ("1.1", "")),
    ("megatron-core", "fcp_exec.integrations.megatron", ("0.16",), ("0.13", "")),
    ("torchtitan", "fcp_exec.integrations.torchtitan(_trainer): its models, its Trainer (fcp_config)", ("0.3.0",),
     ("0.3", "")),
    ("deepspeed", "FCPTrainer with ZeRO-2/3", (), None),
    ("peft", "LoRA through FCPTrainer", (), None),
    ("trl", "TRL's SFTTrainer with FCP; fcp index --assistant-only-loss (its training chat templates)", (), None),
    ("flash-attn", "the CUDA kernel's varlen backend (else torch's own flash / SDPA)", (), ("2.6", "")),
    ("torch-npu", "the Ascend NPU kernel (npu_fusion_attention) and HCCL", (), None),
    ("decord", "video decoding (index --probe decode, readers)", (), ("0.6", "")),
    ("av", "video headers (fcp index)", (), ("11", "")),
    ("pillow", "images", (), ("9", "")),
    ("webdataset", "tar shards (fcp index)", (), None),
    ("pyarrow", ".parquet / .arrow inputs", (), ("12", "")),
    ("tokenizers", "text token counts (fcp index)", (), ("0.15", "")),
    ("jinja2", "a model's own chat template (fcp index --chat-template)", (), ("3.1", "")),
    ("cvxpy", "the exact ILP (fcp compare --ilp)", (), ("1.4", "")),
    ("highspy", "the ILP's solver", (), ("1.7", "")),
    ("ray", "fcp index --engine ray", (), ("2.9", "")),
    ("numba", "compiled planner kernels (the same plans, faster)", (), ("0.59", "")),
    ("matplotlib", "--plot", (), ("3.5", "")),
)


# besides every FCP_* variable (FCP_CACHE, FCP_JIT, FCP_DEBUG, FCP_SOLVER_PLUGINS, …): CPU threads and devices
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


def _num(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string ('5.25.0.dev0' → (5, 25, 0))."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0].split("-")[0])[:3])


def _installed(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in (dist, dist.replace("-", "_")):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _loads(module: str) -> str | None:
    """None when ``module`` imports, else the first line of why not."""
    try:
        __import__(module)
    except Exception as e:  # ImportError, or a library that fails at load (CANN missing, ABI mismatch)
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:200]
    return None


def _devices() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {"cpu_cores": os.cpu_count(), "cuda": None, "npu": None}
    if torch.cuda.is_available():
        out["cuda"] = {"count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
                       "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                       "cuda_version": torch.version.cuda}
    npu_error = _loads("torch_npu") if _installed("torch-npu") else "not installed"
    if npu_error is None and hasattr(torch, "npu") and torch.npu.is_available():
        out["npu"] = {"count": torch.npu.device_count()}
    out["npu_error"] = npu_error
    out["backends"] = {"gloo": dist.is_available() and dist.is_gloo_available(),
                       "nccl": dist.is_available() and dist.is_nccl_available(),
                       "hccl": npu_error is None}
    return out


def _kernels(devices: dict[str, Any]) -> dict[str, str]:
    from fcp_exec.kernels import default_kernel, flash_attn_available

    out = {"cpu": repr(default_kernel("cpu"))}
    if devices["cuda"]:
        out["cuda"] = repr(default_kernel("cuda")) + ("; flash-attn varlen" if flash_attn_available() else
                                                       "; torch flash / SDPA (flash-attn not loadable)")
    if devices["npu"]:
        out["npu"] = repr(default_kernel("npu"))
    return out


def _torch_notes(pkgs: dict[str, str | None]) -> list[str]:
    """What the installed torch release leaves out (fcp_exec.compat): FSDP2 before 2.5/2.7, transformers 5's models."""
    import torch

    from fcp_exec.compat import CPU_FSDP2_RELEASE, hf_models_problem, torch_release

    notes, release = [], torch_release()
    if release < (2, 5):
        notes.append(f"torch {torch.__version__}: --reducer fsdp2 needs torch>=2.5 (FSDP2 of 2.4 averages gradients)")
    elif release < CPU_FSDP2_RELEASE:
        notes.append(f"torch {torch.__version__}: FSDP2 (--reducer fsdp2) does not run on the CPU before torch "
                     + ".".join(map(str, CPU_FSDP2_RELEASE)))
    problem = hf_models_problem() if pkgs.get("transformers") else None
    return notes + ([problem] if problem else [])


def _notes(pkgs: dict[str, str | None], devices: dict[str, Any]) -> list[str]:
    """What a user should know about this environment (untested or unsupported versions, missing pieces)."""
    notes = []
    for dist_name, _, tested, supported in PACKAGES:
        have = pkgs.get(dist_name)
        if have is None:
            continue
        if supported and (_num(have) < _num(supported[0]) or (supported[1] and _num(have) >= _num(supported[1]))):
            notes.append(f"{dist_name} {have} is outside the supported range >={supported[0]}"
                         + (f",<{supported[1]}" if supported[1] else "") + ": expect errors")
        elif tested and not any(_num(have)[:len(_num(t))] == _num(t) for t in tested):
            notes.append(f"{dist_name} {have} was not tested with fcp (tested: {', '.join(tested)})")
    if devices["cuda"] and pkgs.get("flash-attn") is None:
        notes.append("CUDA without flash-attn: the CUDA kernel runs torch's own flash attention (or SDPA); "
                     "pip install flash-attn>=2.6 for its varlen kernels")
    if pkgs.get("torch-npu") and devices["npu_error"]:
        notes.append(f"torch_npu is installed but does not load ({devices['npu_error']}): source CANN's set_env.sh")
    if pkgs.get("numba") is None:
        notes.append("numba not installed: the planner runs uncompiled (the same plans, ~2x the time; "
                     "pip install 'fcp[fast]')")
    return notes


def environment() -> dict[str, Any]:
    """Everything ``fcp env`` reports, as JSON types."""
    import torch

    import fcp_data

    pkgs = {d: _installed(d) for d, *_ in PACKAGES}
    devices = _devices()
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith("FCP_") or k in _THREAD_VARS}
    settings["torch_threads"] = str(torch.get_num_threads())
    return {"fcp": fcp_data.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "devices": devices, "kernels": _kernels(devices), "packages": pkgs,
            "settings": settings, "notes": _torch_notes(pkgs) + _notes(pkgs, devices)}


def _print(env: dict[str, Any]) -> None:
    d = env["devices"]
    print(f"fcp {env['fcp']}  Python {env['python']}  {env['platform']}  {d['cpu_cores']} CPU cores")
    cuda = "none" if not d["cuda"] else (f"{d['cuda']['count']} x {d['cuda']['name']} (sm {d['cuda']['capability']}, "
                                          f"CUDA {d['cuda']['cuda_version']})")
    npu = f"{d['npu']['count']} NPU(s)" if d["npu"] else f"none ({d['npu_error'] or 'no device visible'})"
    print(f"torch {env['torch']}  GPUs: {cuda}  Ascend: {npu}")
    print("distributed backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in d["backends"].items()))
    print("attention kernels: " + "; ".join(f"{k}: {v}" for k, v in env["kernels"].items()))
    print("settings: " + ", ".join(f"{k}={v}" for k, v in env["settings"].items()))
    print("packages:")
    for dist_name, use, _, _ in PACKAGES:
        print(f"  {dist_name:<14} {env['packages'][dist_name] or '-':<12} {use}")
    print("notes:" if env["notes"] else "notes: none")
    for n in env["notes"]:
        print(f"  - {n}")


def run(args: argparse.Namespace) -> int:
    env = environment()
    if args.json:
        print(json.dumps(env, indent=1))
    else:
        _print(env)
    sys.stdout.flush()
    return 0


EPILOG = """examples:
  fcp env                  # read it before a long job on a new image
  fcp env --json > env.json   # attach to a bug report"""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("env", help=summary, description=summary + ".", epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object (versions, devices, kernels, packages, notes)")
    p.set_defaults(func=run)
