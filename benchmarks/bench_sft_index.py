"""SFT data cost: indexing and reading chat conversations under the three template paths, and video conversations
(LLaVA lines) against the same videos as plain folder samples.

Text chat: N synthetic conversations (1-4 rounds, the tiny BPE with ChatML's special tokens) indexed and read
back with ``--chat-template chatml`` (built in), a model template with ``{% generation %}`` blocks (one Jinja render),
and the same template without blocks (fcp finds the turns: two renders plus one per assistant turn). Video: the
bundled clips as LLaVA lines ``{"video": ..., "conversations": [...]}`` (``--chat-field``) and as a folder of
mp4 + txt samples. Parquet: the text conversations as jsonl and as Parquet (row groups of 200 rows: more row
groups than the reader's fallback keeps decoded, as in any real dataset), read in shuffled order (as FCPSampler
reads), with the index's Arrow copy of the rows and without it. Every configuration runs ``--repeats`` times,
alternating, one worker; medians reported, and ratios against the first of each group.

Run: ``python benchmarks/bench_sft_index.py [--conversations 2000] [--repeats 5]``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from test_chat_templates import QWEN, _model_dir, _plain  # noqa: E402  (the test's template and model folder)

from _args import parser, positive_int, run  # noqa: E402
from fcp_data import IndexedDataset  # noqa: E402
from fcp_data._resources import data_path  # noqa: E402
from fcp_data.index import build_index  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while ring attention passes keys around 東京".split()


def _conversations(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    say = lambda k: " ".join(rng.choice(WORDS, k))  # noqa: E731
    rows = []
    for i in range(n):
        turns = [{"role": "system", "content": say(8)}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 5))):
            turns += [{"role": "user", "content": say(int(rng.integers(5, 60)))},
                      {"role": "assistant", "content": say(int(rng.integers(5, 120)))}]
        rows.append({"id": f"c{i}", "messages": turns})
    return rows


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _index_and_read(src: Path, spec: str, out: Path, n: int, shuffle: bool = False, drop_records: bool = False,
                    **kw) -> tuple[float, float]:
    if out.exists():
        shutil.rmtree(out)
    t_index = _timed(lambda: build_index([str(src)], spec, out, progress=False, **kw))
    if drop_records:
        shutil.rmtree(out / "records")
    data = IndexedDataset(out, tokenizer=kw.get("tokenizer"))
    assert len(data) == n, (len(data), n)
    order = np.random.default_rng(0).permutation(n) if shuffle else range(n)
    t_read = _timed(lambda: [data[int(i)] for i in order])
    return n / t_index, n / t_read


def bench_parquet(root: Path, n: int, repeats: int) -> dict:
    """The text conversations as jsonl and as Parquet (row groups of 200 rows), read in shuffled order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _conversations(n, seed=1)
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), root / "chat.parquet", row_group_size=200)
    configs = {"jsonl": ("chat.jsonl", False), "Parquet (index's Arrow copy)": ("chat.parquet", False),
               "Parquet (no copy: row groups decoded)": ("chat.parquet", True)}
    res = {k: ([], []) for k in configs}
    for _ in range(repeats):
        for name, (src, drop) in configs.items():
            ix, rd = _index_and_read(root / src, "text", root / "pidx", n, shuffle=True, drop_records=drop,
                                     chat_field="messages")
            res[name][0].append(ix)
            res[name][1].append(rd)
    return res


def bench_text(root: Path, n: int, repeats: int) -> dict:
    rows = _conversations(n)
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    blocks, plain = _model_dir(root, QWEN, "blocks"), _model_dir(root, _plain(QWEN), "plain")
    tok = str(blocks / "tokenizer.json")
    configs = {"chatml (built in)": "chatml", "model template, generation blocks": str(blocks),
               "model template, no blocks": str(plain)}
    res = {k: ([], []) for k in configs}
    for _ in range(repeats):
        for name, tpl in configs.items():
            ix, rd = _index_and_read(root / "chat.jsonl", "text", root / "idx", n, tokenizer=tok,
                                     chat_field="messages", chat_template=tpl)
            res[name][0].append(ix)
            res[name][1].append(rd)
    return res


def bench_video(root: Path, repeats: int) -> dict:
    media = root / "media"
    media.mkdir()
    for shard in sorted((data_path("samples") / "wds").glob("*.tar")):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                (media / m.name).write_bytes(t.extractfile(m).read())
    clips = sorted(p.stem for p in media.glob("*.mp4"))
    lines = [{"id": c, "video": f"media/{c}.mp4", "conversations": [
        {"from": "human", "value": "<video>\nDescribe the clip."},
        {"from": "gpt", "value": (media / f"{c}.txt").read_text(encoding="utf-8").strip()}]} for c in clips]
    (root / "llava.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    folder = root / "folder"
    folder.mkdir()
    for c in clips:
        for ext in ("mp4", "txt"):
            shutil.copy(media / f"{c}.{ext}", folder / f"{c}.{ext}")
    res = {"folder of mp4 + txt samples": ([], []), "LLaVA chat lines (--chat-field)": ([], [])}
    for _ in range(repeats):
        ix, rd = _index_and_read(folder, "qwen2.5-vl", root / "vidx", len(clips))
        res["folder of mp4 + txt samples"][0].append(ix)
        res["folder of mp4 + txt samples"][1].append(rd)
        ix, rd = _index_and_read(root / "llava.jsonl", "qwen2.5-vl", root / "vidx", len(clips),
                                 chat_field="conversations")
        res["LLaVA chat lines (--chat-field)"][0].append(ix)
        res["LLaVA chat lines (--chat-field)"][1].append(rd)
    return res


def _table(title: str, res: dict) -> str:
    base = None
    lines = [f"\n{title}\n", "| configuration | index samples/s (median) | read samples/s (median) | index / first | "
             "read / first |", "|---|---:|---:|---:|---:|"]
    for name, (ix, rd) in res.items():
        mi, mr = statistics.median(ix), statistics.median(rd)
        base = base or (mi, mr)
        lines.append(f"| {name} | {mi:,.0f} | {mr:,.0f} | {mi / base[0]:.2f}× | {mr / base[1]:.2f}× |")
    return "\n".join(lines)


def build_parser():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--conversations", type=positive_int, default=2000, help="text conversations (default 2000)")
    p.add_argument("--repeats", type=positive_int, default=5, help="alternating repetitions (default 5)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "text").mkdir()
        text = bench_text(root / "text", args.conversations, args.repeats)
        (root / "video").mkdir()
        video = bench_video(root / "video", args.repeats)
        (root / "parquet").mkdir()
        parquet = bench_parquet(root / "parquet", args.conversations, args.repeats)
    print(_table(f"Text chat, {args.conversations} conversations, 1 worker", text))
    print(_table("Video chat, the bundled clips (qwen2.5-vl spec), 1 worker", video))
    print(_table(f"Chat as jsonl and Parquet, {args.conversations} conversations, shuffled reads, 1 worker", parquet))
    return 0


if __name__ == "__main__":
    run(main)
