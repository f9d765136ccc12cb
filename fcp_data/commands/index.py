"""``fcp index INPUT... --spec NAME --out DIR``: build a length index (token counts per sample)."""

from __future__ import annotations

import sys

__all__ = ["register"]

EPILOG = """inputs: jsonl text files, .parquet and .arrow files (Hugging Face datasets; a row is read like a jsonl
line, image/video cells {bytes, path} from their bytes), webdataset .tar shards (paths, globs, brace ranges like
'shard-{000000..000099}.tar' — quote them; at most 1,000,000 paths), and folders of video/image files
(+ .txt captions; symlinks followed, loops and dangling links recorded as errors).
exit codes: 0 ok, 1 error rate above --max-error-rate (an index already in OUT is then kept, not replaced; the
run's errors go to OUT/errors-rejected.jsonl), 2 bad usage or a crashed worker (rerun with --resume).
bad samples: every per-sample failure (decode, probe, parse, tokenise, a --max-* limit) is recorded in
OUT/errors.jsonl with its key and reason and counted (indexed + errors = seen); the run goes on.
limits: each --max-* flag bounds one sample; a sample past a limit is an error record, never a crash.
the index in OUT is replaced all-or-nothing: a run killed at any point leaves the old index or the new one,
never a mix; worker processes die with the run (docs/ROBUSTNESS.md).
examples:
  fcp index samples/text.jsonl --spec text --out /tmp/idx-text
  fcp index 'samples/wds/shard-{000000..000003}.tar' --spec qwen2-vl --out /tmp/idx-vid --workers 2
  fcp index 'data/shard-*.tar' --spec qwen3-vl --out idx --engine ray --address auto --resume
SFT (docs/SFT.md; train with FCPCollator(sample_labels=True), fcp train --data turns it on):
  fcp index sft.jsonl --spec text --prompt-field prompt --text-field response --out idx-sft
  fcp index 'chat/*.parquet' --spec text --chat-field messages --chat-template ~/models/Qwen3-8B --out idx-chat
  fcp index llava.jsonl --spec qwen2.5-vl --chat-field conversations --media-root videos/ --out idx-video-sft"""


def _sft_arguments(p) -> None:
    """The options of SFT lines (docs/SFT.md)."""
    p.add_argument("--prompt-field", default=None, metavar="FIELD",
                   help="jsonl/Parquet field holding an SFT prompt: a sample is the prompt's tokens then --text-field's (the "
                        "response), and its labels mask the prompt (FCPCollator(sample_labels=True); fcp train "
                        "turns it on for such an index). With --chat-field: the field of the prompt's messages in "
                        "TRL's conversational prompt-completion lines, --chat-field the completion's; labels train "
                        "the completion as TRL does")
    p.add_argument("--chat-field", default=None, metavar="FIELD",
                   help="jsonl/Parquet field holding a conversation [{role, content}, ...] (or ShareGPT's [{from, value}, "
                        "...]): rendered by --chat-template, labels train the assistant turns only "
                        "(see fcp_data/chat.py)")
    p.add_argument("--chat-template", default=None, metavar="NAME|PATH",  # None: refused alone, chatml with --chat-field
                   help="template of --chat-field: chatml (generic ChatML, the default) or llama3 — both write role "
                        "and text only: tool calls, reasoning and tools are refused — or the model's own Jinja template (its folder, "
                        "tokenizer_config.json or chat_template.jinja; {%% generation %%} blocks say what to train, "
                        "else each assistant turn up to its end-of-turn marker; prompt-completion lines train their "
                        "completion whatever the blocks say, as TRL does). Index with the model's own "
                        "--tokenizer so its special tokens are single tokens")
    p.add_argument("--tools-field", default=None, metavar="FIELD",
                   help="jsonl/Parquet field of a --chat-field line holding its tool definitions (a list of JSON "
                        "schemas, or a JSON string of one), given to the template as apply_chat_template(tools=...) "
                        "and TRL's SFTTrainer give them (default: tools; lines without it have none; the built-in "
                        "templates refuse lines with tools)")
    p.add_argument("--template-kwargs-field", default=None, metavar="FIELD",
                   help="jsonl/Parquet field of a --chat-field line holding its own chat-template variables (an "
                        "object such as {\"enable_thinking\": false}, or a JSON string of one), passed to the template "
                        "as TRL's SFTTrainer passes them, apply_chat_template(**kwargs) (default: chat_template_kwargs; "
                        "lines without it have none; the built-in templates read none)")
    p.add_argument("--assistant-only-loss", action="store_true",
                   help="as TRL's SFTTrainer(assistant_only_loss=True): train what the template's {%% generation %%} "
                        "blocks hold; a model template without them is replaced by TRL's training variant of it "
                        "(Qwen2.5/3, Qwen-VL, Llama 3.0, Gemma 1-3, gpt-oss ...; needs trl), and prompt-completion "
                        "lines train only "
                        "the assistant turns of their completion; a line with nothing to train is recorded "
                        "(no_trained_tokens)")
    p.add_argument("--media-root", default=None, metavar="DIR",
                   help="folder that the relative image/video paths of --chat-field lines are under (LLaVA's "
                        "'video': 'a.mp4' or a {'type': 'video', 'video': ...} part; default: the jsonl's folder)")


def register(subparsers, summary: str) -> None:
    import argparse

    from fcp_data.index.limits import Limits

    p = subparsers.add_parser("index", help=summary, description=summary, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="jsonl, parquet or arrow files, tar shards (globs/brace ranges), folders")
    from fcp_data.specs import list_specs

    p.add_argument("--spec", required=True, help=f"bundled spec name ({', '.join(list_specs())}) or a spec .json path")
    p.add_argument("--out", required=True, help="output folder of the index")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json overriding the spec's (e.g. the real model's)")
    p.add_argument("--workers", type=int, default=1, help="local worker processes, one shard at a time each (default 1)")
    p.add_argument("--engine", choices=("local", "ray"), default="local", help="local process pool or Ray tasks")
    p.add_argument("--address", default=None, help="Ray cluster address (e.g. 'auto'); default: start a local Ray")
    p.add_argument("--resume", action="store_true", help="keep finished shards of an earlier (killed) run")
    p.add_argument("--probe", choices=("av", "decord", "decode"), default="av",
                   help="how videos are checked: av reads the header only (default, fastest); decord opens the video and "
                        "decodes its first frame; decode reads the header, then decodes every frame the reader will "
                        "sample, so a video damaged behind a readable header is an error record now instead of a "
                        "sample skipped in training (BENCHMARKS.md 'Length index': its cost)")
    p.add_argument("--text-field", default="text", help="jsonl/Parquet field holding the text (default: text)")
    _sft_arguments(p)
    p.add_argument("--key-field", default="id", help="jsonl/Parquet field holding the sample key (default: id, else file:line)")
    p.add_argument("--max-error-rate", type=float, default=0.01, help="exit 1 above this error fraction (default 0.01)")
    lim = Limits()
    g = p.add_argument_group("per-sample limits (a sample past one is an error record with the reason in brackets)")
    g.add_argument("--max-image-pixels", type=int, default=lim.max_image_pixels, metavar="N",
                   help="width x height of an image or video frame [image_too_large, frame_too_large] "
                        "(default %(default)s, pillow's own bomb threshold)")
    g.add_argument("--max-frames", type=int, default=lim.max_frames, metavar="N",
                   help="frames of a video, from its header or counted packets [too_many_frames] (default %(default)s)")
    g.add_argument("--max-duration", type=float, default=lim.max_duration, metavar="SECONDS",
                   help="length of a video [video_too_long] (default %(default)g s = 24 h)")
    g.add_argument("--max-text-bytes", type=int, default=lim.max_text_bytes, metavar="N",
                   help="bytes of a jsonl line or a .txt/.json member [text_too_large] (default %(default)s = 64 MiB)")
    g.add_argument("--max-json-depth", type=int, default=lim.max_json_depth, metavar="N",
                   help="nesting of a jsonl line or .json member [json_too_deep] (default %(default)s)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="write a chart of the indexed lengths: a histogram by kind with p50/p90/p99, and the share of "
                        "all tokens the samples up to each length hold (the long tail)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _first_errors(errors_path) -> list[str]:
    """``reason: key (detail)`` for the first recorded error of each reason."""
    import json

    from fcp_data.index.limits import safe_key

    first: dict[str, str] = {}
    with open(errors_path, encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if e["reason"] not in first:
                detail = f" ({e['detail'][:120]})" if e.get("detail") else ""
                first[e["reason"]] = safe_key(f"{e['reason']}: {e['key']}{detail}")
    return [first[r] for r in sorted(first)]


def _warn_unused_key_field(out: str, key_field: str) -> None:
    """A ``--key-field`` that no record has (a typo) leaves every record keyed ``file:line``, which is valid: say so
    on stderr rather than let it pass unseen. The default ``id`` falls back without a word (documented)."""
    import re

    from fcp_data.index import LengthIndex
    from fcp_data.index.format import KIND_TEXT

    if key_field == "id":
        return
    ix = LengthIndex.load(out)
    text = [i for i in range(min(len(ix), 10_000)) if int(ix.kind[i]) == KIND_TEXT]
    if text and all(re.fullmatch(r".+:\d+", ix.keys[i]) for i in text):
        print(f"fcp index: warning: no record seems to have the field --key-field {key_field!r}: every text sample "
              "is keyed file:line", file=sys.stderr)


def _plot(out: str, path: str) -> None:
    from fcp_data.commands.plots import plot_lengths
    from fcp_data.index import LengthIndex
    from fcp_data.index.limits import safe_key

    ix = LengthIndex.load(out)
    st = plot_lengths(path, ix.num_tokens, ix.kind, f"{len(ix):,} samples of {safe_key(str(out))}")
    print(f"plot written to {safe_key(path)}: the longest 1% of the samples hold {st['top1_share']:.1%} of the tokens")


def run(args) -> int:
    from concurrent.futures.process import BrokenProcessPool
    from pathlib import Path

    from fcp_data.index import build_index, summarize
    from fcp_data.index.limits import Limits, safe_key
    from fcp_data.index.merge import REJECTED_ERRORS

    out = safe_key(args.out)  # printable even when the path is not UTF-8
    if args.plot:
        from fcp_data.commands.plots import check_plot_path

        check_plot_path(args.plot)  # before indexing: a bad path fails at once (one line from fcp_cli, exit 2)
    limits = Limits(max_image_pixels=args.max_image_pixels, max_frames=args.max_frames, max_duration=args.max_duration,
                    max_text_bytes=args.max_text_bytes, max_json_depth=args.max_json_depth)
    try:
        manifest, rc = build_index(args.inputs, args.spec, args.out, tokenizer=args.tokenizer, workers=args.workers,
                                   engine=args.engine, address=args.address, resume=args.resume, probe=args.probe,
                                   text_field=args.text_field, key_field=args.key_field, prompt_field=args.prompt_field,
                                   chat_field=args.chat_field, chat_template=args.chat_template, media_root=args.media_root,
                                   tools_field=args.tools_field, template_kwargs_field=args.template_kwargs_field,
                                   assistant_only_loss=args.assistant_only_loss,
                                   max_error_rate=args.max_error_rate, progress=not args.no_progress, limits=limits)
    except BrokenProcessPool:
        print(f"fcp index: error: a worker process died (killed, or out of memory); the finished shards are kept in "
              f"{out}/parts — rerun the same command with --resume", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"fcp index: error: {safe_key(str(e))}", file=sys.stderr)
        return 2
    print(summarize(manifest))
    kept = manifest.get("kept_previous", False)  # over --max-error-rate with an index there: that one is kept
    if manifest["num_errors"]:
        errors_path = Path(args.out) / (REJECTED_ERRORS if kept else f"{manifest['data']}/errors.jsonl")
        print(f"first error of each reason (all in {safe_key(str(errors_path))}): "
              + "; ".join(_first_errors(errors_path)))
    if kept:
        print(f"fcp index: error: error rate {manifest['error_rate']:.2%} exceeds --max-error-rate "
              f"{args.max_error_rate:.2%}: the index already in {out} is kept, not replaced (raise --max-error-rate "
              "to write this one)", file=sys.stderr)
        return rc
    print(f"index written to {out}")
    if args.plot and manifest["num_samples"]:
        _plot(args.out, args.plot)
    elif args.plot:  # a chart of no lengths says nothing; say so instead of leaving the user to find no file
        print(f"fcp index: note: no plot written to {safe_key(args.plot)}: the index has no samples "
              f"({manifest['num_errors']} errors of {manifest['num_seen']} seen)", file=sys.stderr)
    _warn_unused_key_field(args.out, args.key_field)
    if rc:
        print(f"fcp index: error rate {manifest['error_rate']:.2%} exceeds --max-error-rate {args.max_error_rate:.2%}",
              file=sys.stderr)
    return rc
