"""``fcp presets``: the model and hardware presets and the §4 + §4.1 (cost model v2, the preset default)
coefficients derived from them."""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


def run(args: argparse.Namespace) -> int:
    from fcp_data.presets import HARDWARE, describe_presets
    from fcp_data.strict import did_you_mean

    hf = bool(args.model) and args.model[:3].lower() == "hf:"
    rows = describe_presets((args.model,) if hf else None)
    if hf and not rows:
        raise ValueError(f"{args.model} fits no hardware preset with TP = 1, not even with its weights sharded")
    for key, want in (("model", None if hf else args.model), ("hardware", args.hardware)):
        if want:
            valid = list(dict.fromkeys(r[key] for r in rows))
            if want.lower() not in {v.lower() for v in valid}:
                raise ValueError(f"unknown {key} {want!r}{did_you_mean(want, valid)}; valid: {', '.join(valid)}")
            rows = [r for r in rows if r[key].lower() == want.lower()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("Cost-model presets (DESIGN §4 + §4.1 v2 terms; derivation in fcp_data/presets.py). "
          "Use: --preset MODEL --hardware HW; 'weights sharded': add --shard-weights")
    print(f"hardware: {', '.join(f'{k} ({v.ranks_per_node}/node, {v.memory / 1e9:.0f} GB)' for k, v in HARDWARE.items())}")
    w = max([15, *(len(r["model"]) for r in rows)])  # a long hf: path or preset name widens the column
    print(f"{'model':<{w}} {'hardware':<12} {'params':>8} {'active':>7} {'weights':>10} {'heads':>7} {'tokens/rank':>12} "
          f"{'alpha1':>10} {'alpha2':>10} {'alpha3':>10} {'beta1':>8} {'beta2':>8} {'gamma':>8} {'alpha_blk':>10} "
          f"{'alpha_vis':>10}")
    for r in rows:
        print(f"{r['model']:<{w}} {r['hardware']:<12} {r['params_b']:>7.2f}B {r['active_b']:>6.2f}B {r['weights']:>10} "
              f"{r['heads']:>3}/{r['kv_heads']:<3} "
              f"{r['tokens_per_rank']:>12} {r['alpha1']:>10.3e} {r['alpha2']:>10.3e} {r['alpha3']:>10.3e} "
              f"{r['beta1']:>8.4f} {r['beta2']:>8.4f} {r.get('gamma', 0.0):>8.4f} {r.get('alpha_blk', 0.0):>10.3e} "
              f"{r.get('alpha_vis', 0.0):>10.3e}")
    return 0


EPILOG = """names are case-insensitive (qwen3-8b = Qwen3-8B). examples:
  fcp presets
  fcp presets --model Qwen3-8B --hardware h100 --json
  fcp presets --model hf:path/to/config.json      # any Hugging Face model: MoE, MLA, sliding windows, vision
  fcp plan --lengths lengths.txt --ranks 8 --preset qwen3-8b --hardware h100"""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("presets", help=summary, description=summary + ".", epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="only this model, or hf:PATH (a Hugging Face config.json or its folder)")
    p.add_argument("--hardware", default=None, help="only this hardware")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (each with the §4 keys and the v2 keys)")
    p.set_defaults(func=run)
