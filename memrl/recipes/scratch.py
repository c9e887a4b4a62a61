"""Tiny Qwen2 models trained from scratch on a task's own text (the demos' model init).

- `fresh_qwen2`: save a tokenizer and a seeded, randomly initialised Qwen2 of a given shape; load both back.
- `init_memagent_model`: BPE trained on the synthetic task's text and the MemAgent workflow's filled
  templates (every word of a piece one token, so chunks line up with facts), then `fresh_qwen2` (or a
  memrl.models.tiny preset).
- `init_memact_model`: BPE trained in two passes on the MemAct task's text (the second pass adds whole
  working contexts the scripted agent reaches with the first tokenizer), compact-tools chat template.
- `init_context_model`: the same two passes for the context-management family (fold, summarize,
  sliding_window): the second pass adds the whole contexts each scripted agent reaches through its workflow.
- `init_mem1_model`: the same two passes for the MEM1 demo (the oracle's contexts under both `context` settings).
- `init_reading_model`: the same two passes for MemAgent and InfMem on the synthetic task (the InfMem demo):
  the task's text, then the whole contexts the reading oracle reaches through each workflow.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from memrl.config import MAX_TOKENS
from memrl.data.synthetic import corpus_text, make_task, memory_text
from memrl.data.synthetic_memact import tokenizer_text
from memrl.demonstrators.mem1 import StateDemonstrator, mem1_demonstrations
from memrl.demonstrators.memact import answer_reply, prune_reply, search_reply
from memrl.demonstrators.stages import context_demonstrations, memact_demonstrations
from memrl.models.tiny import (
    CHAT_TEMPLATE_COMPACT_TOOLS,
    ModelPreset,
    init_tiny_model,
    qwen2_config,
    train_tokenizer,
)
from memrl.quiet import encode_document, hf_progress_off
from memrl.types import Task
from memrl.workflows.memact import answer_format

log = logging.getLogger(__name__)


def fresh_qwen2(init_dir: str | Path, tokenizer: Any, shape: ModelPreset, seed: int) -> tuple[Any, Any]:
    """(tokenizer, model) loaded back from `init_dir`, where `tokenizer` and a Qwen2 of `shape` (vocabulary:
    the tokenizer's length), initialised under torch.manual_seed(seed), are saved."""
    tokenizer.save_pretrained(init_dir)
    torch.manual_seed(seed)
    with hf_progress_off():
        cfg = qwen2_config(shape, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
        Qwen2ForCausalLM(cfg).save_pretrained(init_dir)
        return AutoTokenizer.from_pretrained(init_dir), AutoModelForCausalLM.from_pretrained(init_dir)


def init_memagent_model(out: str | Path, syn: Any, wf_cfg: Any, shape: ModelPreset | str, vocab_size: int,
                        seed: int, *, restate_key: bool = False, restate_sep: str | None = ":",
                        unanswerable_text: str | None = None) -> tuple[Any, Any]:
    """(tokenizer, model) for the MemAgent workflow `wf_cfg` on the synthetic task `syn` (a SyntheticConfig):
    the tokenizer corpus (out/tokenizer_corpus.txt) is the task's text plus the filled templates (and the
    restated-key memory / unanswerable answer the cold start demonstrates, when on); the model is saved to
    out/init, of `shape` or of the memrl.models.tiny preset it names. Warns when a piece is not one token
    per word or the workflow's chunk size is not the task's piece size."""
    out = Path(out)
    mem_tpl, fin_tpl = wf_cfg.templates()
    sample = make_task(syn, seed=0, index=0)
    question = sample.question
    filled = [mem_tpl.render(problem=question, memory=wf_cfg.no_memory_text, chunk=" the"),
              fin_tpl.render(problem=question, memory="Kalo is red")]
    if restate_key:
        filled.append(memory_text([("Kalo", "red")], topic="Linka", topic_sep=restate_sep))
    if unanswerable_text:
        filled.append(f"\\boxed{{ {unanswerable_text}}}")
    corpus = out / "tokenizer_corpus.txt"
    corpus.write_text(corpus_text(seed=seed, extra=tuple(filled * 50)), encoding="utf-8")
    init_dir = out / "init"
    if isinstance(shape, ModelPreset):
        tokenizer, model = fresh_qwen2(init_dir, train_tokenizer([corpus], vocab_size, seed), shape, seed)
    else:
        init_tiny_model(init_dir, preset=shape, corpus=[corpus], seed=seed, vocab_size=vocab_size)
        tokenizer = AutoTokenizer.from_pretrained(init_dir)
        with hf_progress_off():
            model = AutoModelForCausalLM.from_pretrained(init_dir)
    # Chunks must line up with the task's pieces: every word one token.
    n_tok = len(encode_document(tokenizer, sample.context))
    want = sample.meta["num_chunks"] * syn.chunk_words
    if n_tok != want:
        log.warning("synthetic pieces are %d tokens, expected %d: chunks will not align with facts", n_tok, want)
    if wf_cfg.chunk_tokens != syn.chunk_words:
        log.warning("workflow chunk_tokens=%d but synthetic chunk_words=%d", wf_cfg.chunk_tokens, syn.chunk_words)
    return tokenizer, model


def init_memact_model(out: str | Path, task_cfg: Any, wf_cfg: Any, sample_tasks: list[Task], shape: ModelPreset,
                      vocab_size: int, seed: int, search_topk: int) -> tuple[Any, Any]:
    """(tokenizer, model) for the memact workflow `wf_cfg` on the synthetic_memact task `task_cfg`: BPE
    (out/tokenizer_corpus.txt) on the task's text, the filled templates and the scripted agent's replies
    on the first 40 `sample_tasks`, then again with the whole working contexts the scripted agent reaches
    on the first 60 with that first tokenizer; compact-tools ChatML, model_max_length the shape's
    positions; the model is saved to out/init."""
    out = Path(out)
    sys_tpl, user_tpl = wf_cfg.templates(True)
    extra = [sys_tpl.render(), "tools: search prune_context",
             "Removed r1, r2, r3. Your memory note stays in your prune_context call above."]
    for task in sample_tasks[:40]:
        names, attrs = task.meta["entities"], task.meta["attributes"]
        instruction = wf_cfg.answer_instruction if wf_cfg.answer_instruction is not None else answer_format(task)
        extra.append(user_tpl.render(question=task.question, answer_format=instruction))
        extra += [search_reply(a, n, search_topk) for a, n in zip(attrs, names, strict=True)]
        extra.append(prune_reply([(n, a, v) for n, a, v in zip(names, attrs, task.answers, strict=True)],
                                 ["r1", "r2"]))
        extra.append(answer_reply(task.answers))
    big = replace(wf_cfg, max_context_tokens=MAX_TOKENS)

    def contexts(tok: Any) -> list[Any]:
        return [g for g in memact_demonstrations(sample_tasks[:60], tok, big, 0.5, 0, search_topk)]

    return _two_pass_model(out, task_cfg, extra, contexts, shape, vocab_size, seed)


def _two_pass_model(out: Path, task_cfg: Any, extra: list[str], play: Any, shape: ModelPreset, vocab_size: int,
                    seed: int) -> tuple[Any, Any]:
    """Two passes: a first tokenizer (BPE on the task's text + `extra`) plays the scripted agents
    (`play(tokenizer)` -> their groups) on a few tasks, whose whole working contexts (chat markers, tool
    results, the workflow's own messages) join the text the final tokenizer learns (out/tokenizer_corpus.txt);
    compact-tools ChatML, model_max_length the shape's positions; the model is saved to out/init."""
    corpus = out / "tokenizer_corpus.txt"
    corpus.write_text(tokenizer_text(task_cfg, tuple(extra * 10)), encoding="utf-8")
    tok = train_tokenizer([corpus], vocab_size, seed)
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    seen = [tok.decode(s.prompt_ids + s.response_ids) for g in play(tok) for s in g.trajectories[0].segments]
    corpus.write_text(tokenizer_text(task_cfg, tuple(extra * 10 + seen * 10)), encoding="utf-8")
    tok = train_tokenizer([corpus], vocab_size, seed)
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    tok.model_max_length = shape.max_position_embeddings
    return fresh_qwen2(out / "init", tok, shape, seed)


def init_context_model(out: str | Path, task_cfg: Any, plays: list[tuple[str, Any, Any]], sample_tasks: list[Task],
                       shape: ModelPreset, vocab_size: int, seed: int) -> tuple[Any, Any]:
    """(tokenizer, model) for the context-management family: `plays` is a list of (workflow, its config,
    scripted agent) (memrl.demonstrators.stages.context_demonstrator; the demo passes every arm's, so every method
    gets the same tokenizer and its budget counts the same tokens). BPE (out/tokenizer_corpus.txt) on the
    task's text, the agents' replies on the first 40 `sample_tasks` and the workflows' own messages (summary
    request and restart where a config has them), then again with the whole working contexts (every row's
    prompt and response) each agent reaches on the first 60 with that first tokenizer; compact-tools ChatML,
    model_max_length the shape's positions; the model is saved to out/init."""
    out = Path(out)
    extra = []
    for _, wf_cfg, _ in plays:
        extra += [f"{wf_cfg.answer_instruction or ''} {wf_cfg.system_template or ''}",
                  getattr(wf_cfg, "summary_request", ""), getattr(wf_cfg, "summary_restart", "")]
    for task in sample_tasks[:40]:
        facts = list(zip(task.meta["entities"], task.meta["attributes"], task.answers, strict=True))
        extra.append(task.question)
        extra += [search_reply(a, n, 2) for n, a, _ in facts]
        extra.append("<summary> " + "; ".join(f"{n} {a} {v}" for n, a, v in facts) + "</summary>")
        extra.append(answer_reply(task.answers))

    def contexts(tok: Any) -> list[Any]:
        return [g for workflow, wf_cfg, agent in plays
                for g in context_demonstrations(sample_tasks[:60], tok, workflow, wf_cfg, agent)]

    return _two_pass_model(out, task_cfg, extra, contexts, shape, vocab_size, seed)


def init_mem1_model(out: str | Path, task_cfg: Any, wf_cfgs: list[Any], sample_tasks: list[Task], shape: ModelPreset,
                    vocab_size: int, seed: int) -> tuple[Any, Any]:
    """(tokenizer, model) for the MEM1 demo (memrl.recipes.mem1): `wf_cfgs` are mem1 workflow configs (the demo
    passes both `context` settings, so both methods get the same tokenizer). BPE (out/tokenizer_corpus.txt)
    on the task's text, the prompt and the oracle's state / search / answer replies on the first 40
    `sample_tasks`, then again with the whole contexts (every row's prompt and response) the oracle
    (memrl.demonstrators.mem1.StateDemonstrator) reaches under each config on the first 60 with that first
    tokenizer; compact-tools ChatML, model_max_length the shape's positions; the model is saved to out/init."""
    out = Path(out)
    extra = []
    for task in sample_tasks[:40]:
        extra.append(wf_cfgs[0].template().render(question=task.question))
        oracle = StateDemonstrator(wf_cfgs[0].answer_separator)
        extra += [oracle(task.question), f"<IS>{';'.join(task.answers)}</IS><answer>{'; '.join(task.answers)}</answer>"]

    def contexts(tok: Any) -> list[Any]:
        return [g for wf_cfg in wf_cfgs for g in mem1_demonstrations(sample_tasks[:60], tok, wf_cfg)]

    return _two_pass_model(out, task_cfg, extra, contexts, shape, vocab_size, seed)


def init_reading_model(out: str | Path, syn: Any, plays: list[tuple[str, Any, Any]], sample_tasks: list[Task],
                       shape: ModelPreset, vocab_size: int, seed: int) -> tuple[Any, Any]:
    """(tokenizer, model) for the InfMem demo on the synthetic task `syn` (a SyntheticConfig): `plays` is a list
    of (workflow, its config, scripted agent) (memrl.demonstrators.infmem.ReadingDemonstrator; the demo passes both
    arms', so both methods get the same tokenizer). BPE (out/tokenizer_corpus.txt) on the task's text
    (memrl.data.synthetic.corpus_text), then again with the whole contexts (every row's prompt and response)
    each agent reaches on the first 60 `sample_tasks` with that first tokenizer; model_max_length the shape's
    positions; the model is saved to out/init. Warns when a piece is not one token per word."""
    out = Path(out)
    corpus = out / "tokenizer_corpus.txt"
    corpus.write_text(corpus_text(seed=seed), encoding="utf-8")
    tok = train_tokenizer([corpus], vocab_size, seed)
    seen = [tok.decode(s.prompt_ids + s.response_ids) for workflow, wf_cfg, agent in plays
            for g in context_demonstrations(sample_tasks[:60], tok, workflow, wf_cfg, agent)
            for s in g.trajectories[0].segments]
    corpus.write_text(corpus_text(seed=seed, extra=tuple(seen * 10)), encoding="utf-8")
    tok = train_tokenizer([corpus], vocab_size, seed)
    tok.model_max_length = shape.max_position_embeddings
    sample = sample_tasks[0]
    n_tok = len(encode_document(tok, sample.context))
    if n_tok != sample.meta["num_chunks"] * syn.chunk_words:
        log.warning("synthetic pieces are %d tokens, expected %d: chunks will not align with facts", n_tok,
                    sample.meta["num_chunks"] * syn.chunk_words)
    return fresh_qwen2(out / "init", tok, shape, seed)
