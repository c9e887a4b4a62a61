"""Validation during training (trainer.val_every, the `val` section) and the experiment trackers
(trainer.loggers: wandb offline, mlflow on a local file store), on the tiny model (CPU)."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from memrl.cli import main
from memrl.config import ConfigError, load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.monitor.metrics_log import read_metrics
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow

WORDS = "the quick brown fox jumps over a lazy dog near river bank".split()


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _val_file(path, dataset: str, n: int, answers: list[str]) -> str:
    """memrl Task rows (kind "tasks"): one question per answer, labelled (dataset, num_docs=n)."""
    with open(path, "w", encoding="utf-8") as f:
        for i, a in enumerate(answers):
            ctx = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(16)) + f" the code is {a}."
            f.write(json.dumps({"task_id": f"{dataset}-{i}", "question": f"What is code {i}?", "context": ctx,
                                "answers": [a], "meta": {"dataset": dataset, "num_docs": n}}) + "\n")
    return str(path)


@pytest.fixture
def val_files(tmp_path):
    return [_val_file(tmp_path / "hq.jsonl", "hq", 2, ["alpha", "beta"]),
            _val_file(tmp_path / "wiki.jsonl", "wiki", 4, ["alpha"])]


def _overrides(model: str, out, steps: int, files: list[str], *extra: str) -> list[str]:
    return [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=8",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=1", "algorithm.n=2",
        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=600", "trainer.progress=false",
        "trainer.tensorboard=false", "engine.name=hf", "trainer.val_every=1",
        f"val.files=[{','.join(files)}]", *extra,
    ]


def _cfg(model: str, out, steps: int, files: list[str], *extra: str) -> TrainConfig:
    return load_config(TrainConfig, _overrides(model, out, steps, files, *extra))


# ------------------------------------------------------------------ wandb's offline run file
def wandb_history(out) -> list[tuple[str, dict[str, str]]]:
    """(run id, history row) of every offline run file under out/wandb, oldest first. The .wandb file is
    a LevelDB-style log (wandb's transaction log): a 7-byte header (":W&B", magic, version), then 32 KiB
    blocks of records, each a 7-byte header (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle,
    4 last) and payload; a whole payload is one wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    out_rows = []
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    for f in files:
        data = f.read_bytes()
        assert data[:4] == b":W&B"
        pos, buf, block = 7, b"", 32768
        while pos + 7 <= len(data):
            left = block - pos % block
            if left < 7:
                pos += left
                continue
            _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0 and n == 0:  # padding up to the block's end
                pos += left
                continue
            buf = data[pos + 7:pos + 7 + n] if kind in (1, 2) else buf + data[pos + 7:pos + 7 + n]
            pos += 7 + n
            if kind in (1, 4):
                rec = pb.Record()
                rec.ParseFromString(buf)
                if rec.WhichOneof("record_type") == "history":
                    out_rows.append((f.stem[4:], {i.key or "/".join(i.nested_key): i.value_json
                                                  for i in rec.history.item}))
    return out_rows


def test_validation_metrics_trackers_and_resume(tiny_path, tmp_path, val_files):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    extra = ("trainer.loggers=[jsonl,wandb,mlflow]", "val.before_train=true", "trainer.save_every=1",
             "trainer.dump_every=1", "trainer.dump_trajectories=2")
    assert main(["train", *_overrides(tiny_path, out, 2, val_files, *extra)]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    keys = {"val/hq/2/accuracy", "val/hq/2/em", "val/hq/2/f1", "val/wiki/4/accuracy", "val/mean_accuracy"}
    for r in rows:
        assert keys <= set(r), sorted(r)
        assert r["val/hq/2/questions"] == 2.0 and r["val/wiki/4/questions"] == 1.0
        # mean_accuracy is the mean over the two (dataset, N) pairs
        assert r["val/mean_accuracy"] == pytest.approx((r["val/hq/2/accuracy"] + r["val/wiki/4/accuracy"]) / 2)
        res = [json.loads(x) for x in (out / "val" / f"step_{r['step']}" / "results.jsonl").read_text().splitlines()]
        assert sorted((x["dataset"], x["num_docs"], x["task_id"]) for x in res) == [
            ("hq", 2, "hq-0"), ("hq", 2, "hq-1"), ("wiki", 4, "wiki-0")]
        assert r["val/hq/2/accuracy"] == 100 * sum(x["sub_em"] for x in res if x["dataset"] == "hq") / 2

    state = __import__("torch").load(out / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
    wandb_id, mlflow_id = state["trackers"]["wandb"], state["trackers"]["mlflow"]

    # wandb: the offline run holds the same numbers at the same steps, and the trajectory tables
    hist = wandb_history(out)
    assert {rid for rid, _ in hist} == {wandb_id}
    by_step = {int(h["_step"]): h for _, h in hist}
    for r in rows:
        assert float(by_step[r["step"]]["val/mean_accuracy"]) == pytest.approx(r["val/mean_accuracy"])
    assert json.loads(by_step[2]["trajectories/_type"]) == "table-file"

    # mlflow: the same numbers, and the trajectory sample as a JSON artifact
    client = MlflowClient(tracking_uri=f"file:{out / 'mlruns'}")
    got = client.get_metric_history(mlflow_id, "val/hq/2/accuracy")
    assert [(m.step, m.value) for m in got] == [(r["step"], r["val/hq/2/accuracy"]) for r in rows]
    arts = {a.path for a in client.list_artifacts(mlflow_id, "trajectories")}
    assert arts == {"trajectories/step_1.json", "trajectories/step_2.json"}

    # resume to step 3: both tracker runs continue (same ids), step 3 appended
    assert main(["train", *_overrides(tiny_path, out, 3, val_files, *extra), "--resume"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3]
    hist = wandb_history(out)
    assert {rid for rid, _ in hist} == {wandb_id}
    assert sorted(int(h["_step"]) for _, h in hist if "val/mean_accuracy" in h) == [0, 1, 2, 3]
    got = client.get_metric_history(mlflow_id, "val/mean_accuracy")
    assert [m.step for m in got] == [0, 1, 2, 3]
    assert len(client.search_runs([client.get_run(mlflow_id).info.experiment_id])) == 1
    state = __import__("torch").load(out / "checkpoints" / "step_000003" / "trainer_state.pt", weights_only=True)
    assert state["trackers"] == {"wandb": wandb_id, "mlflow": mlflow_id}


def test_validation_equals_memrl_eval(tiny_path, tmp_path, val_files):
    """Validation at step 2 and `memrl eval` on checkpoint step_2 with the same workflow, sampling
    (T 1.0, top_p 0.7, 2 samples), seed (0) and engine settings: identical predictions, answer texts and
    model calls, question by question and sample by sample."""
    out = tmp_path / "run"
    cfg = _cfg(tiny_path, out, 2, val_files, "trainer.val_every=2", "trainer.save_every=2", "val.samples=2",
               "val.temperature=1.0", "val.top_p=0.7")
    Trainer(assemble(cfg)).fit()
    trained_threads = torch.get_num_threads()  # the intra-op count validation ran with
    rows = read_metrics(out / "metrics.jsonl")
    assert [("val/mean_accuracy" in r) for r in rows] == [False, True]
    assert {"val/hq/2/mean_at_k", "val/hq/2/pass_at_k"} <= set(rows[1])
    val = [json.loads(x) for x in (out / "val" / "step_2" / "results.jsonl").read_text().splitlines()]
    # memrl eval's own engine defaults differ from training's (max_batch_size, hf.deterministic): pass the
    # training engine's values, so both runs use the same engine settings. Its thread count is load-aware
    # (memrl.threads: fewer threads beside busy processes), and another count rounds floats differently, so
    # the sampled answers would part under load: pin it to validation's
    assert main(["eval", "--model", str(out / "checkpoints" / "step_000002"), "--out", str(tmp_path / "eval"),
                 *val_files, "--no-progress", "workflow=memagent", "workflow.chunk_tokens=24",
                 "workflow.max_memory_tokens=6", "workflow.max_final_tokens=8", "workflow.temperature=1.0",
                 "workflow.top_p=0.7", "samples=2", "seed=0", "engine.name=hf",
                 f"engine.max_batch_size={cfg.engine.max_batch_size}",
                 f"engine.hf.deterministic={str(cfg.engine.hf.deterministic).lower()}",
                 f"threads.intra_op={trained_threads}"]) == 0
    ev = [json.loads(x) for x in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]

    def key(r):
        return (r["dataset"], r["task_id"], r["sample"])

    def same(r):
        return (r["prediction"], r["answer_text"], r["sub_em"], [s.get("response") for s in r["steps"]])

    assert len(val) == len(ev) == 6
    by = {key(r): same(r) for r in val}
    assert by[("hq", "hq-0", 0)] != by[("hq", "hq-0", 1)]  # sampled: the two answers differ
    assert by == {key(r): same(r) for r in ev}


def test_save_best_keeps_the_best_step_through_pruning_and_resume(tiny_path, tmp_path, val_files):
    """A scripted engine answers validation right or wrong by step, so val/mean_accuracy is known:
    steps 1..4 -> 0, 100, 100, 0 (every question right at steps 2 and 3, none otherwise). The best is
    step 2 (step 3 only ties it); keep_checkpoints=1 prunes step_2, checkpoints/best keeps it; a resumed
    run (steps 5, 6 -> 0, 100) compares against the saved best and keeps step 2."""
    import torch
    from doubles import ScriptedEngine
    from transformers import AutoTokenizer

    right = {2, 3, 6}

    def run(steps: int, resume: bool) -> Trainer:
        cfg = _cfg(tiny_path, tmp_path / "run", steps, val_files, "trainer.save_every=0",
                   "trainer.keep_checkpoints=1", "trainer.save_best=val/mean_accuracy",
                   "workflow.max_final_tokens=16")

        def script(prompt: str, i: int) -> str:
            # every call (memory updates too) replies with the boxed answer: right only at the scripted
            # steps; hq-1 (the only question "What is code 1?") is `beta`, the others `alpha`
            ans = ("beta" if "What is code 1?" in prompt else "alpha") if tr.step in right else "wrong"
            return f"\\boxed{{{ans}}}"

        tok = AutoTokenizer.from_pretrained(tiny_path)
        tr = Trainer(assemble(cfg, resume=resume, engine=ScriptedEngine(script, tok)))  # the run samples with it
        tr.fit()
        return tr

    run(4, False)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    ckpts = tmp_path / "run" / "checkpoints"
    best = json.loads((ckpts / "best" / "best.json").read_text())
    assert best == {"metric": "val/mean_accuracy", "value": pytest.approx(100.0), "step": 2}
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000004"]
    assert torch.load(ckpts / "best" / "trainer_state.pt", weights_only=True)["step"] == 2
    assert [r["val/mean_accuracy"] for r in rows] == [0.0, 100.0, 100.0, 0.0]
    run(6, True)
    best = json.loads((ckpts / "best" / "best.json").read_text())
    assert best["step"] == 2
    assert [r["val/mean_accuracy"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")][4:] == [0.0, 100.0]


def test_config_errors_are_one_line(tiny_path, tmp_path, val_files):
    with pytest.raises(ConfigError, match="val.files is empty"):
        assemble(load_config(TrainConfig, [f"model.path={tiny_path}", f"out_dir={tmp_path}", "trainer.val_every=5"]))
    with pytest.raises(ConfigError, match="val.files: .*nope.jsonl does not exist"):
        assemble(_cfg(tiny_path, tmp_path, 1, [str(tmp_path / "nope.jsonl")]))
    with pytest.raises(ConfigError, match="must hold jsonl"):
        assemble(_cfg(tiny_path, tmp_path, 1, val_files, "trainer.loggers=[wandb]"))
    with pytest.raises(ConfigError, match="trainer.loggers"):
        _cfg(tiny_path, tmp_path, 1, val_files, "trainer.loggers=[jsonl,comet]")
    with pytest.raises(ConfigError, match="trainer.save_best=val/mean_accuracy needs validation"):
        assemble(_cfg(tiny_path, tmp_path, 1, val_files, "trainer.save_best=val/mean_accuracy", "trainer.val_every=0"))
    with pytest.raises(ConfigError, match="trainer.save_best_after=-1"):
        _cfg(tiny_path, tmp_path, 1, val_files, "trainer.save_best_after=-1")
    with pytest.raises(ConfigError, match="val.samples"):
        _cfg(tiny_path, tmp_path, 1, val_files, "val.samples=0")


def test_save_best_after_tracks_the_best_but_saves_only_later(tmp_path):
    """trainer.save_best_after=k (ReMemR1's `global_steps > 20`): steps <= k set the best value without
    saving. Values 5, 3, 7, 6 at steps 1..4 with k=2: step 1 sets best=5 (no save), step 2 is not better,
    step 3 (7 > 5) saves, step 4 (6 < 7) does not."""
    from types import SimpleNamespace

    from memrl.training.step.validation import keep_best

    saved: list[int] = []
    root = tmp_path / "checkpoints"

    class Run:  # what keep_best uses of a Trainer: its trainer section, its state (best) and save()
        cfg = SimpleNamespace(trainer=SimpleNamespace(save_best="reward/mean", save_best_after=2))
        best = None

        def save(self):
            saved.append(self.best["step"])
            d = root / f"step_{self.best['step']:06d}"
            d.mkdir(parents=True)
            (d / "weights").write_text(str(self.best["step"]))
            return d

    run = Run()
    got = [keep_best(run.cfg.trainer, run, s, {"reward/mean": v}, run.save) for s, v in zip([1, 2, 3, 4], [5.0, 3.0, 7.0, 6.0], strict=True)]
    assert got == [False, False, True, False]
    assert saved == [3]
    assert run.best == {"metric": "reward/mean", "value": 7.0, "step": 3}
    assert (root / "best" / "weights").read_text() == "3"
    with pytest.raises(ConfigError, match="not a metric of this run"):
        keep_best(run.cfg.trainer, run, 5, {"reward/max": 1.0}, run.save)


def test_missing_tracker_package_is_one_line(tiny_path, tmp_path, val_files, monkeypatch, capsys):
    """A tracker whose package does not import: exit 1 with one line naming the extra to install."""
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    code = main(["train", *_overrides(tiny_path, tmp_path / "run", 1, val_files, "trainer.loggers=[jsonl,wandb]",
                                      "trainer.val_every=0")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "trainer.loggers names wandb but it is not installed" in err[0] and "memrl[track]" in err[0]


def test_restore_best_after_a_kill(tmp_path):
    """restore_best on resume: (a) killed between moving best aside and swapping the copy in: the old
    best comes back and the half copy goes; (b) killed after saving step_3 as the new best but before the
    copy: best is copied from step_3."""
    from memrl.training.step.validation import restore_best

    root = tmp_path / "checkpoints"
    (root / ".best-old").mkdir(parents=True)
    (root / ".best-old" / "best.json").write_text(json.dumps({"metric": "m", "value": 1.0, "step": 2}))
    (root / ".best-new").mkdir()
    restore_best(root, {"metric": "m", "value": 1.0, "step": 2})
    assert sorted(p.name for p in root.iterdir()) == ["best"]
    assert json.loads((root / "best" / "best.json").read_text())["step"] == 2

    (root / "step_000003").mkdir()
    (root / "step_000003" / "weights").write_text("3")
    restore_best(root, {"metric": "m", "value": 2.0, "step": 3})
    assert (root / "best" / "weights").read_text() == "3"
    assert json.loads((root / "best" / "best.json").read_text()) == {"metric": "m", "value": 2.0, "step": 3}
