"""Build, convert and inspect datasets.

  memrl data build --source hotpot_dev_distractor_v1.json --out data/hqa [--docs 50,100,...,6400]
                   [--num-questions 128] [--seed 42]                      -> eval_{N}.json + manifest.json
  memrl data build --kind multiobjective --source hotpot.json 2wiki.json --out data/mo.parquet
                   [--num-questions 128] [--seed 42] [--sub-questions 2,3]  -> MemAct multi-question tasks
  memrl data build --kind ruler --tasks niah_single_1,...,qa_1 --lengths 8k,16k --tokenizer MODEL_DIR --out DIR
                   [--seed 42] [--samples 100] [--haystack ESSAY.txt] [--qa-source squad.json]
                   -> RULER's <len>/data/<task>/validation.jsonl, built locally (memrl.data.ruler_build)
  memrl data corpus --source hotpotqa|2wiki FILE... --out corpus.jsonl   -> retrieval corpus (paragraphs)
  memrl data train --source hotpot_train_v1.1.json --out data/train.parquet [--docs 200]
  memrl data convert SRC DST [--kind auto] [--to hf|original|eval|memagent]
  memrl data stats --tokenizer MODEL_DIR eval_50.json eval_100.json ...  -> average context tokens per N
  memrl data show FILE [--rows 1] [--docs-from hotpot_dev_distractor_v1.json]   -> detected kind + tasks
  memrl data fetch NAME [--out DIR] [--file LOCAL]   -> a public data set, pinned by URL and sha256, cached

Every reader takes --skip-bad (malformed rows are skipped and counted instead of failing the command;
malformed includes a task without a usable gold answer and a task id an earlier row used) and
--docs-from (the dev file whose documents index-only eval files point into).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from memrl.commands.options import refuse_unused, track_given
from memrl.config import MAX_CHARS, MAX_COUNT, MAX_SEED, bounded
from memrl.data import hotpotqa, memagent_files, twowiki
from memrl.data.corpus import CorpusStats, build_corpus, write_corpus
from memrl.data.fetch import DATASETS, fetch_dataset, next_command
from memrl.data.io import (
    KIND_NAMES,
    KINDS,
    DataError,
    ReadStats,
    detect_kind,
    file_format,
    load_tasks,
    write_records,
)
from memrl.data.longctx import DEFAULT_DOC_COUNTS, TRAIN_NUM_DOCS, build_eval_sets, build_train_set
from memrl.data.multiobjective import build_multiobjective, write_multiobjective
from memrl.data.ruler_build import BUILD_TASKS, PAPER_TASKS, BuildOptions, build_ruler, parse_length
from memrl.data.slime import to_slime_record
from memrl.errors import UsageError, UserError, writable_dir, writable_file
from memrl.model_files import ModelFilesError, check_tokenizer_files


def _counts(text: str | list[int], opt: str) -> list[int]:
    """A comma-separated list of positive integers (option `opt`); UsageError naming the option otherwise."""
    if isinstance(text, list):  # the default
        return text
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(f"{opt} must be comma-separated integers, got {text!r}") from e
    if not out or any(n < 1 for n in out):
        raise UsageError(f"{opt} needs positive counts, got {text!r}")
    return out


_RULER = ("tasks", "lengths", "tokenizer", "samples", "haystack", "noise", "qa_source", "qa_fill")
BUILD_OPTIONS: dict[str, tuple[str, ...]] = {
    "source": ("eval", "multiobjective"), **dict.fromkeys(_RULER, ("ruler",)), "docs": ("eval",),
    "num_questions": ("eval", "multiobjective"), "sub_questions": ("multiobjective",), "docs_from": ("eval",),
    "skip_bad": ("eval", "multiobjective"),
}
"""`memrl data build` options -> the kinds that read them (eval = the eval_{N}.json sets of any other --kind)."""
BUILD_INSTEAD: dict[tuple[str, str], str] = {
    ("num_questions", "ruler"): "--samples (rows per task and length)",
    ("samples", "eval"): "--num-questions", ("samples", "multiobjective"): "--num-questions",
    ("docs", "ruler"): "--lengths (target lengths in tokens)", ("lengths", "eval"): "--docs (document counts)",
    ("source", "ruler"): "--qa-source (qa tasks) and --haystack (essay haystacks)",
    ("qa_source", "eval"): "--source", ("qa_source", "multiobjective"): "--source",
}


def check_args(args: argparse.Namespace) -> None:
    """Option values and input files, before anything is read or written: one-line UsageError (exit 2)
    for a value out of range, DataError (exit 1) for an input file that is not there."""
    cmd = args.data_command
    if cmd == "build":
        group = args.kind if args.kind in ("ruler", "multiobjective") else "eval"
        shown = {"eval": f"{args.kind} (eval sets)" if group == "eval" else "auto|hotpotqa|2wiki|... (eval sets)"}
        refuse_unused(args, group, "--kind", BUILD_OPTIONS, BUILD_INSTEAD, shown)
    for opt in ("docs", "sub_questions"):
        if isinstance(getattr(args, opt, None), str):
            setattr(args, opt, _counts(getattr(args, opt), "--" + opt.replace("_", "-")))
    low = {"num_questions": 0, "rows": 1, "chars": 0}
    if cmd == "train":
        low["docs"] = 1
    for name, least in low.items():
        val = getattr(args, name, None)
        if isinstance(val, int) and val < least:
            opt = "--" + name.replace("_", "-")
            zero = " (0 = all)" if name == "num_questions" else ""
            raise UsageError(f"{opt} must be at least {least}{zero}, got {val}")
    sources = getattr(args, "source", None) if cmd in ("build", "train") else getattr(args, "files", None)
    if cmd == "convert":
        sources = [args.src]
    elif cmd == "show":
        sources = [args.file]
    for f in sources or []:
        if not Path(f).exists():
            raise DataError(f"data file {f} does not exist")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--kind", choices=("auto", *KINDS), default="auto", help="input dataset kind")
        p.add_argument("--skip-bad", action="store_true", help="skip (and count) malformed rows instead of failing")
        p.add_argument("--docs-from", default=None, metavar="DEV_FILE",
                       help="index-only eval files: the HotpotQA / 2Wiki / SQuAD dev file their indices point into")
        p.add_argument("--debug", action="store_true", help="show tracebacks")

    b = sub.add_parser("build", help="long-context eval sets eval_{N}.json (RULER-HQA / MemAgent style)")
    track_given(b)  # an option the chosen --kind does not read is refused (BUILD_OPTIONS)
    b.add_argument("--source", nargs="+", default=None, help="HotpotQA / 2Wiki file(s), either layout")
    b.add_argument("--out", required=True, help="output directory")
    r = b.add_argument_group("--kind ruler (RULER's synthetic tasks, built locally)")
    r.add_argument("--tasks", default=None, help="comma-separated RULER tasks (default: the 11 of MemAgent's paper)")
    r.add_argument("--lengths", default=None, help="comma-separated target lengths in tokens: 8k,16k,... (k = 1024)")
    r.add_argument("--tokenizer", default=None, help="tokenizer / model directory the lengths are measured in")
    r.add_argument("--samples", type=bounded(int, ge=1, le=MAX_COUNT), default=100, help="rows per task and length (RULER: 500)")
    r.add_argument("--haystack", default=None, help="essay text file for the essay haystacks (niah_single_2/3, ...)")
    r.add_argument("--noise", default=None, help="noise sentences, one per line (default: memrl's built-in ones)")
    r.add_argument("--qa-source", default=None, help="SQuAD JSON (qa_1) or HotpotQA file (qa_2) for the qa tasks")
    r.add_argument("--qa-fill", choices=("words", "docs"), default="words",
                   help="qa: fill up to the length with the first words of one more document (words) or whole "
                        "documents only (docs, as RULER)")
    b.add_argument("--docs", default=list(DEFAULT_DOC_COUNTS), help="comma-separated document counts")
    b.add_argument("--num-questions", type=bounded(int, ge=0, le=MAX_COUNT), default=128, help="questions per set (0 = all)")
    b.add_argument("--seed", type=bounded(int, ge=0, le=MAX_SEED), default=42, help="seed of question choice, padding and shuffling")
    b.add_argument("--sub-questions", default=[2, 3],
                   help="--kind multiobjective: sub-question counts to draw from (comma-separated)")
    common(b)
    b.epilog = ("--kind multiobjective builds MemAct tasks (--num-questions of them, 0 = as many as the "
                "sources allow) into the file --out; the sources' own kinds are detected, and each must hold "
                "single questions (a multi-question source is refused).")

    co = sub.add_parser("corpus", help="retrieval corpus JSONL {id, title, text}: deduplicated paragraphs")
    co.add_argument("--source", choices=("hotpotqa", "2wiki"), required=True, help="the files' dataset")
    co.add_argument("files", nargs="+", help="HotpotQA / 2Wiki file(s), either layout, .json[.xz] etc.")
    co.add_argument("--out", required=True, help="output .jsonl file")
    co.add_argument("--skip-bad", action="store_true", help="skip (and count) malformed rows instead of failing")
    co.add_argument("--debug", action="store_true", help="show tracebacks")

    t = sub.add_parser("train", help="training set: questions padded to 200 docs, MemAgent parquet")
    t.add_argument("--source", nargs="+", required=True, help="HotpotQA / 2Wiki file(s), either layout")
    t.add_argument("--out", required=True, help="output .parquet file")
    t.add_argument("--docs", type=bounded(int, ge=1, le=MAX_COUNT), default=TRAIN_NUM_DOCS, help="documents per question")
    t.add_argument("--num-questions", type=bounded(int, ge=0, le=MAX_COUNT), default=0, help="questions (0 = all)")
    t.add_argument("--seed", type=bounded(int, ge=0, le=MAX_SEED), default=42)
    t.add_argument("--data-source", default="hotpotqa", help="the rows' data_source field")
    common(t)

    c = sub.add_parser("convert", help="convert between layouts and formats")
    c.add_argument("src")
    c.add_argument("dst", help="output file; its extension picks json / jsonl / parquet")
    c.add_argument("--to", choices=("hf", "original", "eval", "memagent", "slime"), default="hf",
                   help="output layout (hf/original for HotpotQA and 2Wiki sources)")
    common(c)

    s = sub.add_parser("stats", help="average context tokens per document count")
    s.add_argument("files", nargs="+")
    s.add_argument("--tokenizer", required=True, help="tokenizer / model directory (HuggingFace format)")
    common(s)

    f = sub.add_parser("fetch", help="download a public data set (pinned URL and sha256; cached)")
    f.add_argument("name", metavar="NAME", choices=sorted(DATASETS), help=f"one of: {', '.join(sorted(DATASETS))}")
    f.add_argument("--out", default=None, metavar="DIR",
                   help="copy the file into DIR (default: print the cached file; $MEMRL_CACHE or ~/.cache/memrl)")
    f.add_argument("--file", default=None, metavar="LOCAL",
                   help="a copy you already have (offline machines); checked against the same sha256")
    f.add_argument("--debug", action="store_true", help="show tracebacks")

    sh = sub.add_parser("show", help="print the first rows of a file as tasks")
    sh.add_argument("file")
    sh.add_argument("--rows", type=bounded(int, ge=1, le=MAX_COUNT), default=1)
    sh.add_argument("--chars", type=bounded(int, ge=0, le=MAX_CHARS), default=400, help="context characters to show")
    common(sh)


def _load_sources(paths: list[str], kind: str, skip_bad: bool, docs_from: str | None = None):
    tasks = []
    for p in paths:
        st = ReadStats(p)
        tasks += load_tasks(p, kind, skip_bad=skip_bad, stats=st, docs_from=docs_from)
        note = f", skipped {st.skipped} malformed" if st.skipped else ""
        print(f"read {st.rows - st.skipped} questions from {p}{note}")
    return tasks


def run(args: argparse.Namespace) -> int:
    check_args(args)
    return {"build": _build, "corpus": _corpus, "train": _train, "convert": _convert, "stats": _stats, "show": _show,
            "fetch": _fetch}[args.data_command](args)


def _build(args: argparse.Namespace) -> int:
    if args.kind == "multiobjective":
        return _build_multiobjective(args)
    if args.kind == "ruler":
        return _build_ruler(args)
    if not args.source:
        raise UserError("data build: --source is required (HotpotQA / 2Wiki files), except with --kind ruler")

    writable_dir(args.out, "--out")
    tasks = _load_sources(args.source, args.kind, args.skip_bad, args.docs_from)
    t0 = time.perf_counter()
    man = build_eval_sets(
        tasks, args.out, args.docs, args.num_questions, args.seed, source=args.source,
        on_file=lambda n, p, dt: print(f"  {n:>6} docs -> {p} ({dt:.1f}s)", flush=True),
    )
    print(f"built {len(man.doc_counts)} sets of {man.num_questions} questions (pool {man.pool_size} paragraphs, "
          f"seed {man.seed}) in {time.perf_counter() - t0:.1f}s -> {args.out}")
    return 0


def _check_tokenizer_path(path: str) -> None:
    """--tokenizer names an existing directory (transformers reads a file path as a hub repo id)."""
    if not Path(path).exists():
        raise UserError(f"--tokenizer {path} does not exist")
    if not Path(path).is_dir():
        raise UserError(f"--tokenizer {path} is a file; give the directory that holds it (a HuggingFace tokenizer "
                        "or model directory)")


def _build_ruler(args: argparse.Namespace) -> int:
    if not args.tokenizer:
        raise UserError("data build --kind ruler: --tokenizer MODEL_DIR is required (lengths are counted in it)")
    if not args.lengths:
        raise UserError("data build --kind ruler: --lengths is required, e.g. --lengths 8k,16k,32k")
    _check_tokenizer_path(args.tokenizer)
    for flag, path in (("--haystack", args.haystack), ("--noise", args.noise), ("--qa-source", args.qa_source)):
        if path and not Path(path).is_file():
            raise UserError(f"{flag} {path} does not exist or is not a file")
    try:
        lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError as e:
        raise UserError(f"--lengths: {e}") from e
    if not lengths:
        raise UserError(f"--lengths {args.lengths!r} names no length, e.g. --lengths 8k,16k,32k")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks is not None else list(PAPER_TASKS)
    if not tasks:
        raise UserError(f"--tasks {args.tasks!r} names no task; expected some of {', '.join(BUILD_TASKS)}")
    bad = [t for t in tasks if t not in BUILD_TASKS]
    if bad:
        raise UserError(f"--tasks: unknown {', '.join(bad)}; expected some of {', '.join(BUILD_TASKS)}")
    tok = _counting_tokenizer(args.tokenizer)
    writable_dir(args.out, "--out")
    opts = BuildOptions(seed=args.seed, samples=args.samples, haystack=args.haystack or "", noise=args.noise or "",
                        qa_source=args.qa_source or "", qa_fill=args.qa_fill)
    t0 = time.perf_counter()
    build_ruler(args.out, tok, tasks, lengths, opts, tokenizer_name=Path(args.tokenizer).name,
                on_file=lambda t, n, p, k: print(f"  {t} @ {n} tokens: {k} rows -> {p}", flush=True))
    print(f"built {len(tasks)} RULER tasks x {len(lengths)} lengths ({args.samples} rows each, seed {args.seed}) "
          f"in {time.perf_counter() - t0:.1f}s -> {args.out}")
    return 0


def _build_multiobjective(args: argparse.Namespace) -> int:
    from memrl.workflows.memact import default_prompt  # noqa: PLC0415 - pulls in transformers: only this kind

    writable_file(args.out, "--out")
    file_format(args.out)  # a file type it can write, before reading the sources
    pool = []
    for path in args.source:
        tasks = _load_sources([path], "auto", args.skip_bad)
        multi = next((t for t in tasks if len(t.meta.get("sub_questions") or []) > 1), None)
        if multi is not None:  # combining it would nest questions that no answer format can address
            raise DataError(f"--kind multiobjective combines single questions; {path} holds multi-question "
                            f"tasks (task {multi.task_id} asks {len(multi.meta['sub_questions'])})")
        pool += tasks
    try:
        tasks = build_multiobjective(pool, args.num_questions, args.seed, args.sub_questions)
    except ValueError as e:  # the pool is too small for what was asked
        raise UserError(f"--kind multiobjective: {e}") from e
    n = write_multiobjective(args.out, tasks, prompt=default_prompt)
    sizes = {k: sum(len(t.answers) == k for t in tasks) for k in sorted(set(args.sub_questions))}
    print(f"wrote {n} multi-objective tasks (sub-questions: {sizes}, seed {args.seed}) -> {args.out}")
    return 0


def _corpus(args: argparse.Namespace) -> int:
    kind = {"hotpotqa": "hotpotqa", "2wiki": "2wiki"}[args.source]
    st = CorpusStats()
    docs = build_corpus(_load_sources(args.files, kind, args.skip_bad), st)
    n = write_corpus(args.out, docs)
    empty = f", {st.empty} empty paragraphs dropped" if st.empty else ""
    print(f"wrote {n} unique paragraphs of {st.paragraphs} from {st.questions} questions{empty} -> {args.out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    writable_file(args.out, "--out")
    tasks = _load_sources(args.source, args.kind, args.skip_bad)
    n = build_train_set(tasks, args.out, args.docs, args.seed, args.num_questions, args.data_source)
    print(f"wrote {n} rows of {args.docs} documents -> {args.out}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    writable_file(args.dst, "DST")
    kind = detect_kind(args.src) if args.kind == "auto" else args.kind
    tasks = _load_sources([args.src], kind, args.skip_bad, args.docs_from)
    if args.to in ("hf", "original"):
        if kind not in ("hotpotqa", "2wiki"):
            raise UserError(f"--to {args.to} needs a HotpotQA or 2Wiki source; {args.src} is {kind}")
        mod = hotpotqa if kind == "hotpotqa" else twowiki
        conv = mod.to_hf_record if args.to == "hf" else mod.to_original_record
        recs = [conv(t) for t in tasks]
    elif args.to == "eval":
        recs = [memagent_files.to_eval_record(t) for t in tasks]
    elif args.to == "slime":
        recs = [to_slime_record(t) for t in tasks]
    else:
        recs = [memagent_files.to_parquet_row(t) for t in tasks]
    n = write_records(args.dst, recs)
    print(f"wrote {n} rows ({args.to} layout) -> {args.dst}")
    return 0


def _counting_tokenizer(path: str) -> Any:
    """The tokenizer of --tokenizer DIR for counting tokens: the directory's vocabulary checked first (without
    one, transformers fell back to a one-token tokenizer and the RULER builder never reached a length), and
    transformers' refusals as one line naming the directory."""
    if Path(path).is_dir():  # (a hub name is left to transformers)
        try:
            check_tokenizer_files(Path(path), f"--tokenizer {path}", chat_template=False)
        except ModelFilesError as e:
            raise UserError(str(e)) from None
    from transformers import AutoTokenizer  # noqa: PLC0415 - heavy: only the commands that count tokens load it

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError, KeyError, ImportError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"--tokenizer {path}: transformers cannot load a tokenizer from it ({first})") from None
    tok.model_max_length = 1 << 40  # counting tokens, not feeding a model: no length warning
    return tok


def _count_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Token counts; a fast HF tokenizer encodes the batch in parallel (Rust threads)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]
    return [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]


def context_token_stats(files: list[str], tokenizer, kind: str = "auto", skip_bad: bool = False,
                        docs_from: str | None = None):
    """Rows (num_docs, files, questions, mean context tokens, mean characters) grouped by num_docs."""
    acc: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for f in files:
        tasks = load_tasks(f, kind, skip_bad=skip_bad, docs_from=docs_from)
        for i in range(0, len(tasks), 16):
            batch = tasks[i : i + 16]
            for t, ntok in zip(batch, _count_tokens(tokenizer, [t.context for t in batch]), strict=True):
                n = int(t.meta.get("num_docs") or t.context.count("\n\nDocument ") + 1)
                a = acc[n]
                a[0] += 1
                a[1] += ntok
                a[2] += len(t.context)
    return [(n, int(a[0]), a[1] / a[0], a[2] / a[0]) for n, a in sorted(acc.items())]


def _stats(args: argparse.Namespace) -> int:
    _check_tokenizer_path(args.tokenizer)
    tok = _counting_tokenizer(args.tokenizer)
    rows = context_token_stats(args.files, tok, args.kind, args.skip_bad, args.docs_from)
    print(f"tokenizer: {args.tokenizer}")
    print("| docs | questions | mean context tokens | mean characters |")
    print("|---:|---:|---:|---:|")
    for n, q, tokens, chars in rows:
        print(f"| {n} | {q} | {tokens:,.0f} ({tokens / 1000:.1f}K) | {chars:,.0f} |")
    return 0


def _show(args: argparse.Namespace) -> int:
    kind = detect_kind(args.file) if args.kind == "auto" else args.kind
    print(f"kind: {kind} ({KIND_NAMES.get(kind, kind)})")
    st = ReadStats(args.file)
    tasks = load_tasks(args.file, kind, skip_bad=args.skip_bad, limit=args.rows, stats=st, docs_from=args.docs_from)
    print(f"read {st.rows} rows, {st.skipped} rejected" + (f" (first: {st.reasons[0]})" if st.reasons else ""))
    for t in tasks:
        meta = {k: v for k, v in t.meta.items() if k != "paragraphs"}
        print(json.dumps({"task_id": t.task_id, "question": t.question, "answers": t.answers, "meta": meta,
                          "context_chars": len(t.context)}, ensure_ascii=False, default=str)[:2000])
        print(t.context[: args.chars] + ("..." if len(t.context) > args.chars else ""))
        print()
    return 0


def _fetch(args: argparse.Namespace) -> int:
    pin = DATASETS[args.name]
    path, fresh = fetch_dataset(args.name, args.out, args.file)
    how = ("from --file" if args.file else "downloaded") if fresh else "from the cache"
    print(f"{args.name} ({pin.license}; {how}): {path}")
    print(f"next: {next_command(args.name, path)}")
    return 0
