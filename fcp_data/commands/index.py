"""``fcp index INPUT... --spec NAME --out DIR``: build a length index (token counts per sample)."""

from __future__ import annotations

import sys

__all__ = ["register"]

EPILOG = """inputs: jsonl text files, webdataset .tar shards (paths, globs, brace ranges like
'shard-{000000..000099}.tar' — quote them), and folders of video/image files (+ .txt captions).
exit codes: 0 ok, 1 error rate above --max-error-rate, 2 bad usage or a crashed worker (rerun with --resume).
examples:
  fcp index samples/text.jsonl --spec text --out /tmp/idx-text
  fcp index 'samples/wds/shard-{000000..000003}.tar' --spec qwen2-vl --out /tmp/idx-vid --workers 2
  fcp index 'data/shard-*.tar' --spec qwen3-vl --out idx --engine ray --address auto --resume"""


def register(subparsers, summary: str) -> None:
    import argparse

    p = subparsers.add_parser("index", help=summary, description=summary, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="jsonl files, tar shards (globs/brace ranges), folders")
    p.add_argument("--spec", required=True, help="bundled spec name (qwen2-vl, qwen2.5-vl, qwen3-vl, internvl3, "
                                                 "llava-video, text, text-bidirectional) or a spec .json path")
    p.add_argument("--out", required=True, help="output folder of the index")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json overriding the spec's (e.g. the real model's)")
    p.add_argument("--workers", type=int, default=1, help="local worker processes, one shard at a time each (default 1)")
    p.add_argument("--engine", choices=("local", "ray"), default="local", help="local process pool or Ray tasks")
    p.add_argument("--address", default=None, help="Ray cluster address (e.g. 'auto'); default: start a local Ray")
    p.add_argument("--resume", action="store_true", help="keep finished shards of an earlier (killed) run")
    p.add_argument("--probe", choices=("av", "decord"), default="av", help="video header probe (default av: no decode)")
    p.add_argument("--text-field", default="text", help="jsonl field holding the text (default: text)")
    p.add_argument("--key-field", default="id", help="jsonl field holding the sample key (default: id, else file:line)")
    p.add_argument("--max-error-rate", type=float, default=0.01, help="exit 1 above this error fraction (default 0.01)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _first_errors(out: str) -> list[str]:
    """``reason: key (detail)`` for the first recorded error of each reason."""
    import json
    from pathlib import Path

    first: dict[str, str] = {}
    with open(Path(out) / "errors.jsonl", encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if e["reason"] not in first:
                detail = f" ({e['detail'][:120]})" if e.get("detail") else ""
                first[e["reason"]] = f"{e['reason']}: {e['key']}{detail}"
    return [first[r] for r in sorted(first)]


def run(args) -> int:
    from concurrent.futures.process import BrokenProcessPool

    from fcp_data.index import build_index, summarize

    try:
        manifest, rc = build_index(args.inputs, args.spec, args.out, tokenizer=args.tokenizer, workers=args.workers,
                                   engine=args.engine, address=args.address, resume=args.resume, probe=args.probe,
                                   text_field=args.text_field, key_field=args.key_field,
                                   max_error_rate=args.max_error_rate, progress=not args.no_progress)
    except BrokenProcessPool:
        print(f"fcp index: error: a worker process died (killed, or out of memory); the finished shards are kept in "
              f"{args.out}/parts — rerun the same command with --resume", file=sys.stderr)
        return 2
    print(summarize(manifest))
    if manifest["num_errors"]:
        print(f"first error of each reason (all in {args.out}/errors.jsonl): " + "; ".join(_first_errors(args.out)))
    print(f"index written to {args.out}")
    if rc:
        print(f"fcp index: error rate {manifest['error_rate']:.2%} exceeds --max-error-rate {args.max_error_rate:.2%}",
              file=sys.stderr)
    return rc
