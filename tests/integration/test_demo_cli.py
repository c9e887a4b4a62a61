"""`memrl demo` end to end at a toy budget: every output is written, the printed table is results.md and
its numbers are results.json's; the sampled evaluation is seeded and reproducible on a real model."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main
from memrl.eval.evaluator import paired_gain
from memrl.recipes.pipeline import load_recipe

pytestmark = pytest.mark.slow

TOY = ["sft.num_tasks=40", "sft.epochs=1", "sft.p_aware=0.5", "eval.num_tasks=8", "eval.samples=3",
       "eval.multipliers=[1,2]", "train.data.synthetic.min_chunks=1", "train.data.synthetic.num_chunks=2",
       "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2",
       "train.trainer.progress=false", "train.trainer.tensorboard=false"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["demo", "--out", str(out), *TOY])
    assert rc == 0
    return out, buf.getvalue()


def test_demo_writes_every_output(demo):
    out, _ = demo
    for name in ("results.md", "results.json", "accuracy_vs_length.png", "rl_reward.png", "demo_config.yaml",
                 "sft/config.json", "rl/metrics.jsonl", "rl/checkpoints/step_000002/model.safetensors"):
        assert (out / name).is_file(), name
    for png in ("accuracy_vs_length.png", "rl_reward.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def stages(res: dict) -> dict:
    """policy -> length -> decoding -> summary row, of results.json's summary rows (the one layout)."""
    out: dict = {}
    for s in res["summary"]:
        out.setdefault(s["policy"], {}).setdefault(s["bucket"], {})[s["decoding"]] = s
    return out


def test_printed_table_is_results_json(demo):
    out, printed = demo
    res = json.loads((out / "results.json").read_text())
    table = (out / "results.md").read_text()
    assert table in printed
    assert res["facts"] == {"lengths": [2, 4]} and len(res["history"]) == 2 and res["config"]["sft"]["p_aware"] == 0.5
    assert res["train"]["data"]["synthetic"] == {"num_chunks": 2, "min_chunks": 1, "chunk_words": 8}
    st = stages(res)
    assert sorted(st) == ["demonstrator", "rl", "sft"]
    for n in ("2", "4"):
        assert set(st["demonstrator"][n]) == {"sampled"} and set(st["sft"][n]) == set(st["rl"][n]) == {"greedy", "sampled"}
        for stage in ("demonstrator", "sft", "rl"):
            for r in st[stage][n].values():
                # 8 tasks, each a mean of 1 (greedy) or 3 (sampled) rewards in {0, 1}
                assert r["num_tasks"] == 8 and len(r["per_task"]) == 8
                assert r["accuracy"] == pytest.approx(100 * sum(r["per_task"]) / 8)
                k = r["samples"]
                assert all((x * k) == pytest.approx(round(x * k)) for x in r["per_task"])
        d, s, g = st["demonstrator"][n]["sampled"], st["sft"][n], st["rl"][n]
        gs = "{:+.1f} ± {:.1f}".format(*paired_gain(s["sampled"]["per_task"], g["sampled"]["per_task"]))
        gg = "{:+.1f} ± {:.1f}".format(*paired_gain(s["greedy"]["per_task"], g["greedy"]["per_task"]))
        row = (f"| {n} | {int(n) * 8} | {int(n) // 2}x | {d['accuracy']:.1f} ± {d['se']:.1f} | "
               f"{s['sampled']['accuracy']:.1f} ± {s['sampled']['se']:.1f} | "
               f"{g['sampled']['accuracy']:.1f} ± {g['sampled']['se']:.1f} | {gs} | "
               f"{s['greedy']['accuracy']:.1f} ± {s['greedy']['se']:.1f} | "
               f"{g['greedy']['accuracy']:.1f} ± {g['greedy']['se']:.1f} | {gg} |")
        assert row in table.splitlines()
        ret = (f"| {n} | {s['greedy']['answer_seen']:.1f}% | {s['greedy']['answer_kept']:.1f}% | "
               f"{g['greedy']['answer_seen']:.1f}% | {g['greedy']['answer_kept']:.1f}% |")
        assert ret in table.splitlines()
        for r in (s["greedy"], g["greedy"]):  # a memory that ends with the answer held it at some call
            assert r["answer_kept"] <= r["answer_seen"]


def test_sampled_evaluation_is_seeded_and_reproducible(demo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.eval.evaluator import EngineRollout, eval_record, evaluate_rows, model_engine
    from memrl.recipes.memagent import RECIPE, heldout_tasks

    out, _ = demo
    again = load_recipe(RECIPE, TOY, out.parent / "again")
    cfg, tcfg, spec, wf_cfg = again.cfg, again.tcfg, again.spec, again.wf_cfg
    tasks = heldout_tasks(cfg, tcfg)[2]
    tok = AutoTokenizer.from_pretrained(out / "sft")
    model = AutoModelForCausalLM.from_pretrained(out / "sft")

    def run(seed: int, temperature: float = 1.0, samples: int = 3):
        seen = {}
        with model_engine(model, tok, tcfg.engine) as engine:
            rows = evaluate_rows(EngineRollout(engine, spec), wf_cfg, tasks, samples, temperature, seed,
                                 on_trajectory=lambda t, tr: seen.setdefault(tr.trajectory_id, [
                                     s.response_ids for s in tr.segments]))
        return eval_record(rows, samples, temperature), seen

    a, ta = run(7)
    b, tb = run(7)
    c, tc = run(8)
    assert len(ta) == 8 * 3 and ta == tb and a == b
    assert ta != tc  # another seed samples other trajectories
    assert len({tuple(map(tuple, v)) for v in ta.values()}) > 8  # it samples: the 3 samples of a task differ


def test_demo_refuses_unknown_override_before_work(tmp_path, capsys):
    rc = main(["demo", "--out", str(tmp_path / "d"), "sft.epoch=1"])
    assert rc != 0
    assert "sft.epoch" in capsys.readouterr().err
    assert not (tmp_path / "d" / "sft").exists()
    rc = main(["demo", "--out", str(tmp_path / "e"), "sft.p_aware=1.5"])
    assert rc != 0 and "p_aware" in capsys.readouterr().err


def test_reading_rows_answer_from_the_whole_document(tmp_path):
    from memrl.data.synthetic import SyntheticConfig, corpus_text, make_tasks
    from memrl.demonstrators.stages import reading_segments
    from memrl.models.tiny import train_tokenizer
    from memrl.workflows.templates import load_template

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(num_docs=50), encoding="utf-8")
    tok = train_tokenizer([corpus], 1024)
    fin = load_template("final", ("problem", "memory"), None, "Q: {problem}\nM: {memory}\nA:")
    tasks = make_tasks(SyntheticConfig(num_chunks=2, chunk_words=8, fact_position="start"), 3, seed=5)
    segs = reading_segments(tasks, tok, fin)
    assert len(segs) == 3
    for t, s in zip(tasks, segs, strict=True):
        prompt = tok.decode(s.prompt_ids)
        assert f"Q: {t.question}\nM: {t.context.strip()}\nA:" in prompt  # the whole document, no memory
        assert tok.decode(s.response_ids) == f"\\boxed{{ {t.answers[0]}}}<|im_end|>"
        assert s.loss_mask == [1] * len(s.response_ids) and s.info["kind"] == "reading"


def test_results_json_is_computed_from_the_rows(demo):
    """Each policy's evaluation rows (eval_rows/<policy>.jsonl: one per trajectory, with policy, decoding, bucket,
    seed and held-out digest) give results.json's summary rows exactly: memrl.eval.evaluator.eval_record's
    numbers, flat (memrl.recipes.memagent.FIELDS)."""
    from memrl.eval.evaluator import DEFAULT_METRICS, ROW_COLUMNS, eval_record, group_rows

    out, _ = demo
    res = json.loads((out / "results.json").read_text())
    st = stages(res)
    digests = set()
    for stage in ("demonstrator", "sft", "rl"):
        rows = [json.loads(x) for x in (out / "eval_rows" / f"{stage}.jsonl").read_text().splitlines()]
        assert {r["policy"] for r in rows} == {stage} and {r["seed"] for r in rows} == {987654}
        digests |= {r["heldout_sha256"] for r in rows}
        assert all(set(ROW_COLUMNS) <= set(r) for r in rows)
        cells = group_rows(rows, by=("bucket", "decoding"))
        # results.json's order: length, then greedy before sampled
        assert [(str(n), m) for n, m in cells] == [(n, m) for n, modes in st[stage].items() for m in modes]
        for (n, mode), rs in cells.items():
            want = st[stage][str(n)][mode]
            rec = eval_record(rs, want["samples"], 0.0 if mode == "greedy" else 1.0, 0.0, DEFAULT_METRICS)
            got = {"policy": stage, "decoding": mode, "bucket": str(n), "accuracy": rec["accuracy"], "se": rec["se"],
                   "num_tasks": rec["num_tasks"], "samples": rec["samples"], **rec["metrics"],
                   "per_task": rec["per_task"]}
            assert json.loads(json.dumps(got)) == want, (stage, n, mode)
    assert len(digests) == 1 and len(d := digests.pop()) == 64  # the same held-out tasks for every policy
    assert res["heldout_sha256"] == [d]
