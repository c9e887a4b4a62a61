"""`memrl data fetch NAME`: the public data sets memrl's recipes and guides read, from their official sources.

Each entry of `DATASETS` is pinned by URL (a fixed commit or revision where the host has one), byte size and
sha256; the sha256 of each came from a published record of it (docs/guides/data.md#fetching-data-sets says
which). A download goes through `memrl.downloads.download` (resumable, one process per file) into the cache
(`$MEMRL_CACHE/data/NAME/`, default ~/.cache/memrl), and a second fetch only checks the cached file. An
archive (2WikiMultihopQA's zip) is kept beside the member taken out of it, which is pinned by its own sha256.

`--file LOCAL` takes a copy the user already has (the download itself, or for an archive the member) and
checks it against the same sha256 before it enters the cache. Offline, or with a wrong checksum, the error is
one line naming `--file`.

`DATASETS` is the only place URLs and checksums are set; the tests replace it (monkeypatch) with files a
local server of theirs serves. Nothing else overrides them.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from memrl.downloads import DownloadError, cache_root, download, file_matches, sha256_file
from memrl.errors import UserError


@dataclass(frozen=True)
class PinnedFile:
    """One data set file: where it is published, what it must hash to, and what to run next."""

    url: str
    sha256: str
    size: int
    license: str
    about: str
    next_command: str
    """What to run with the file; `{path}` is replaced by its path."""
    member: str = ""
    """For an archive: the file taken out of it (its path inside the archive)."""
    member_sha256: str = ""
    member_size: int = 0
    filename: str = ""
    """The name the file (or the member) is kept under; default: the URL's last part."""

    def target_name(self) -> str:
        if self.filename:
            return self.filename
        return Path(self.member).name if self.member else self.url.rsplit("/", 1)[-1].split("?")[0]


_HOTPOT = "http://curtis.ml.cmu.edu/datasets/hotpot/"
_LME = "https://huggingface.co/datasets/xiaowu0162/longmemeval-cleaned/resolve/98d7416c24c778c2fee6e6f3006e7a073259d48f/"
_LME_ABOUT = ("LongMemEval (cleaned, September 2025 release; Wu et al., ICLR 2025): 500 questions on a user's chat "
              "history")
_RULER = "memrl data build --kind ruler --tokenizer MODEL_DIR --lengths 8k --out data/ruler"

DATASETS: dict[str, PinnedFile] = {
    "hotpotqa_dev_distractor": PinnedFile(
        url=_HOTPOT + "hotpot_dev_distractor_v1.json", size=46_320_117,
        sha256="4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea",
        license="CC BY-SA 4.0", about="HotpotQA dev, distractor setting (Yang et al., 2018): 7,405 questions, "
        "2 gold + 8 distractor paragraphs each",
        next_command="memrl data build --source {path} --out data/hqa"),
    "hotpotqa_train": PinnedFile(
        url=_HOTPOT + "hotpot_train_v1.1.json", size=566_426_227,
        sha256="26650cf50234ef5fb2e664ed70bbecdfd87815e6bffc257e068efea5cf7cd316",
        license="CC BY-SA 4.0", about="HotpotQA train (Yang et al., 2018): 90,447 questions",
        next_command="memrl data train --source {path} --out data/train.parquet"),
    "2wiki_dev": PinnedFile(
        url="https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1", size=258_968_175,
        sha256="95df2bf56fdabe034e27aebc580e02264232203cf52552f9efe8a919e5529eef",
        member="dev.json", member_size=57_614_142,
        member_sha256="79f77ae104088ea8e25b1a65dbece768d45771194663bc5660ec9a98070dadf5",
        filename="2wikimultihopqa_dev.json", license="Apache-2.0",
        about="2WikiMultihopQA dev (Ho et al., 2020; the April 7 release, data_ids_april7.zip): 12,576 questions",
        next_command="memrl data build --source {path} --out data/2wiki"),
    "squad_v2_dev": PinnedFile(
        url="https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json", size=4_370_528,
        sha256="80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
        license="CC BY-SA 4.0", about="SQuAD 2.0 dev (Rajpurkar et al., 2018): the documents and questions of "
        "RULER's qa_1",
        next_command=_RULER + " --tasks qa_1 --qa-source {path}"),
    "tiny_shakespeare": PinnedFile(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/"
            "tinyshakespeare/input.txt", size=1_115_394,
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        filename="tiny_shakespeare.txt", license="public domain (Shakespeare's plays; char-rnn repository MIT)",
        about="40,000 lines of Shakespeare (Karpathy's char-rnn, 1.1 MB, about 300K tokens): a real-text haystack "
              "for RULER's essay needles in place of its Paul Graham essays, which carry no licence",
        next_command=_RULER + " --tasks niah_single_2,niah_single_3,niah_multikey_1 --haystack {path}"),
    "locomo": PinnedFile(
        url="https://raw.githubusercontent.com/snap-research/locomo/3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376/data/"
            "locomo10.json", size=2_805_274,
        sha256="79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4",
        license="CC BY-NC 4.0", about="LoCoMo (Maharana et al., ACL 2024): 10 long multi-session conversations "
        "with 1,986 questions",
        next_command="memrl data show {path}"),
    "longmemeval_s": PinnedFile(
        url=_LME + "longmemeval_s_cleaned.json", size=277_383_467,
        sha256="d6f21ea9d60a0d56f34a05b609c79c88a451d2ae03597821ea3d5a9678c3a442",
        license="MIT", about=_LME_ABOUT + ", S setting (about 115K tokens, ~50 sessions each)",
        next_command="memrl data show {path}"),
    "longmemeval_m": PinnedFile(
        url=_LME + "longmemeval_m_cleaned.json", size=2_737_100_077,
        sha256="9d79e5524794a2e6900a3aa9cb7d9152c5a3e8319c9a87c25494ba1eacee495f",
        license="MIT", about=_LME_ABOUT + ", M setting (about 500 sessions each; 2.7 GB)",
        next_command="memrl data show {path}"),
    "longmemeval_oracle": PinnedFile(
        url=_LME + "longmemeval_oracle.json", size=15_388_478,
        sha256="821a2034d219ab45846873dd14c14f12cfe7776e73527a483f9dac095d38620c",
        license="MIT", about=_LME_ABOUT + ", oracle setting (only the sessions that hold the evidence)",
        next_command="memrl data show {path}"),
}


def _why_file(pin: PinnedFile) -> str:
    what = f"sha256 {pin.sha256}"
    if pin.member:
        what += f", or its {pin.member} with sha256 {pin.member_sha256}"
    return what


def _extract(pin: PinnedFile, archive: Path, target: Path) -> None:
    """The pinned member of `archive` into `target` (through a temporary file), checked."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(archive) as z, z.open(pin.member) as f, open(tmp, "wb") as o:
            shutil.copyfileobj(f, o, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{archive}: not the archive expected ({e})") from None
    if not file_matches(tmp, pin.member_sha256, pin.member_size):
        got = sha256_file(tmp)
        tmp.unlink()
        raise UserError(f"{archive}!{pin.member}: sha256 {got} is not the pinned {pin.member_sha256}; refusing it")
    os.replace(tmp, target)


def _from_file(name: str, pin: PinnedFile, local: Path, root: Path, target: Path) -> None:
    """`--file LOCAL` into the cache, when it is the pinned download (or, for an archive, the member)."""
    if not local.is_file():
        raise UserError(f"--file {local}: no such file")
    if pin.member and file_matches(local, pin.member_sha256, pin.member_size):
        shutil.copyfile(local, target)
        return
    if not file_matches(local, pin.sha256, pin.size):
        raise UserError(f"--file {local}: sha256 {sha256_file(local)} ({local.stat().st_size:,} bytes) is not the "
                        f"pinned {name} ({_why_file(pin)}); refusing it")
    if not pin.member:
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(local, tmp)
        os.replace(tmp, target)
        return
    _extract(pin, local, target)


def fetch_dataset(name: str, out: str | os.PathLike | None = None, file: str | os.PathLike | None = None,
                  cache: Path | None = None, quiet: bool = False) -> tuple[Path, bool]:
    """The checked file of data set `name`, from the cache, the network or `file`; copied into the directory
    `out` when given. Returns (its path, whether it was fetched now)."""
    pin = DATASETS.get(name)
    if pin is None:
        raise UserError(f"unknown data set {name!r}; known: {', '.join(sorted(DATASETS))}")
    root = (cache or cache_root()) / "data" / name
    target = root / pin.target_name()
    want_sha, want_size = (pin.member_sha256, pin.member_size) if pin.member else (pin.sha256, pin.size)
    fresh = False
    if not file_matches(target, want_sha, want_size):
        root.mkdir(parents=True, exist_ok=True)
        if file is not None:
            _from_file(name, pin, Path(file), root, target)
        else:
            dest = root / (pin.url.rsplit("/", 1)[-1].split("?")[0]) if pin.member else target
            try:
                download(pin.url, dest, pin.sha256, pin.size, quiet=quiet)
            except DownloadError as e:
                raise UserError(f"could not fetch {name}: {e}; offline? download it elsewhere and pass --file FILE "
                                f"(checked against {_why_file(pin)})") from None
            if pin.member:
                _extract(pin, dest, target)
        fresh = True
    if out is None:
        return target, fresh
    dest_dir = Path(out)
    dest_dir.mkdir(parents=True, exist_ok=True)
    copy = dest_dir / target.name
    if not file_matches(copy, want_sha, want_size):
        tmp = copy.with_name(f"{copy.name}.{os.getpid()}.tmp")
        shutil.copyfile(target, tmp)
        os.replace(tmp, copy)
    return copy, fresh


def next_command(name: str, path: Path) -> str:
    return DATASETS[name].next_command.format(path=path)


def fetched_path(name: str) -> Path:
    """The cached file of data set `name` (what the guides and benchmarks default to); UserError naming the
    `memrl data fetch` command when it has not been fetched (a file of another size there counts as absent;
    its sha256 was checked when it was fetched)."""
    pin = DATASETS[name]
    path = cache_root() / "data" / name / pin.target_name()
    size = pin.member_size if pin.member else pin.size
    if not path.is_file() or path.stat().st_size != size:
        raise UserError(f"{name} has not been fetched ({path} is missing); run `memrl data fetch {name}`")
    return path
