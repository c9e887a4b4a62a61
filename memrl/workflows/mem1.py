"""MEM1 (arXiv 2506.15841; code MIT-MI/MEM1, Mem1/train/rollout/llm_agent/generation_think.py): a
multi-turn search agent whose context holds only the task prompt, its LATEST internal state and the
latest observation. Each turn the model rewrites its internal state `<IS>...</IS>` and takes one action,
`<search>query</search>` or `<answer>a1; a2; ...</answer>`; a search's results come back as the next
observation `<information>...</information>`; everything older is dropped, so the context a call sees
stays flat in the number of turns.

Token in, token out: the next context is the prompt's ids, then the ids this reply sampled from the one
that opens `<IS>` through the one that closes the action (the rest of the reply, EOS included, is cut),
then the observation's ids; nothing sampled is decoded and encoded again. Every model call is one
training row (prompt = the context it saw, response = its sampled ids, mask 1): rows per turn. MEM1's
trainer packs a trajectory's turns into one sequence with a 2D attention mask instead, in which a turn
does not see the previous internal state it was sampled after: not the same context, so not the same
gradient (docs/DIFFERENCES.md).

`context=full_history` is the baseline the paper compares against: every earlier turn and observation
stays in the context (a ReAct-style agent whose context grows with the turns).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_COUNT, MAX_TEMPERATURE, MAX_TOKENS, MAX_VOCAB, valid
from memrl.engines.base import Engine, SamplingParams
from memrl.quiet import encode_text
from memrl.rewards.multiq import gold_aliases, row_columns
from memrl.rewards.qa import best_em, best_f1
from memrl.services.session import Services
from memrl.tools import search as ts
from memrl.types import Score, Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.chunked import call_segment, decode_response
from memrl.workflows.templates import Template, chat_prompt, load_template

CONTEXTS: tuple[str, ...] = ("latest_state", "full_history")
RESULT_FORMATS: tuple[str, ...] = ("memrl", "published")
REWARD_SCALES: tuple[str, ...] = ("mean", "sum")
_ACTION = re.compile(r"<(answer|search)>(.*?)</\1>", re.DOTALL)


@dataclass
class Mem1Config:
    """MEM1 workflow settings: defaults are the released training script's (Mem1/train/train_ppo.sh) where
    it sets them, memrl's choices elsewhere (docs/DIFFERENCES.md); the mem1_official preset names them."""

    max_turns: int = valid(6, ge=1, le=MAX_COUNT)
    """Model calls per trajectory (train_ppo.sh MAX_TURNS=6); a trajectory without an answer by then scores 0."""
    max_turn_tokens: int = valid(1000, ge=1, le=MAX_TOKENS)
    """Generation budget of one turn (data.max_response_length)."""
    max_obs_tokens: int = valid(1000, ge=1, le=MAX_TOKENS)
    """An observation is cut to its first this-many tokens (data.max_obs_length)."""
    max_context_tokens: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = no cap")
    """Cap on a call's context (0 = no cap; memrl: MEM1's context is short by design); what it cuts is
    `context_cap`'s."""
    context_cap: str = valid("call", choices=("call", "rolling"))
    """What max_context_tokens cuts. "call": the call's own context (prompt + latest state and observation)
    keeps its LAST max_context_tokens tokens. "rolling" (published: generation_think.py
    `_update_rolling_state` keeps the last data.max_prompt_length = 4096 tokens of the whole history, every
    reply through its action and every observation included; tensor_helper.py `mask_using_kept_lengths`
    then shows the window's FIRST prompt-length tokens and its last kept ones, the latest state and
    observation): once the history passes the cap, the first part is no longer the prompt, and the
    question itself falls out."""
    topk: int = valid(3, ge=1, le=100)
    """Passages per search (retriever.topk)."""
    state_tag: str = "IS"
    """The internal state's tag: IS (the paper's <IS>) or think (the released training code keeps the
    reply from its <think> on)."""
    context: str = valid("latest_state", choices=CONTEXTS)
    """latest_state (MEM1): prompt + latest internal state and action + latest observation; full_history
    (the baseline): every turn and observation so far."""
    result_format: str = valid("memrl", choices=RESULT_FORMATS)
    """How a search's passages read: memrl ("(i) title\\ntext" blocks) or published ("Doc i(Title: title)
    text" lines, the released _passages2string)."""
    hint_turns_left: str = "{n} turns left."
    """Observation hint while more than one turn is left ({n}); "" = none. The released code gives one."""
    hint_last_turn: str = "One turn left: answer in the next turn."
    """Observation hint when one turn is left; "" = none."""
    answer_separator: str = ";"
    """Separator of the objectives' answers inside <answer> (the released reward splits on ";")."""
    reward_scale: str = valid("mean", choices=REWARD_SCALES)
    """mean (memrl): the fraction of objectives answered exactly right, in [0, 1]; sum (released
    qa_multiple.compute_score_em): their count."""
    retriever_kind: str = "bm25"
    """As MemAct's: bm25 or keyword over retriever_corpus, a registered name, or module:attr."""
    retriever_corpus: str | None = None
    """Corpus JSONL ({id, title, text} rows) for an in-process retriever."""
    retriever_url: str | None = None
    """Base URL of a retrieval service (wins over the corpus)."""
    retriever_scope: str = valid("corpus", choices=("corpus", "task"))
    """corpus: one retriever for every task; task: BM25 over the task's own `meta["documents"]`."""
    temperature: float = valid(1.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    top_k: int = valid(-1, ge=-1, le=MAX_VOCAB, note="-1 or 0 = off")
    enable_thinking: bool | None = None
    """The chat template's thinking switch for the prompt; None = the template's default (true on a template
    without the switch is refused once the tokenizer loads)."""
    prompt_template_file: str | None = None
    """File overriding the task prompt; must contain {question}."""
    prompt_template: str | None = None

    def __post_init__(self) -> None:
        for f, allowed in (("context", CONTEXTS), ("result_format", RESULT_FORMATS), ("reward_scale", REWARD_SCALES),
                           ("retriever_scope", ("corpus", "task"))):
            if getattr(self, f) not in allowed:
                raise ValueError(f"Mem1Config.{f} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        if self.context_cap not in ("call", "rolling"):
            raise ValueError(f"Mem1Config.context_cap must be one of call, rolling, got {self.context_cap!r}")
        if self.max_context_tokens < 0:
            raise ValueError(f"Mem1Config.max_context_tokens must be >= 0 (0 = no cap), got {self.max_context_tokens}")
        for f in ("max_turns", "max_turn_tokens", "max_obs_tokens", "topk"):
            if getattr(self, f) < 1:
                raise ValueError(f"Mem1Config.{f} must be >= 1, got {getattr(self, f)}")
        if not re.fullmatch(r"[A-Za-z_][\w-]*", self.state_tag):
            raise ValueError(f"Mem1Config.state_tag must be a tag name such as IS or think, got {self.state_tag!r}")
        if not self.answer_separator:
            raise ValueError("Mem1Config.answer_separator must be a non-empty text")
        try:
            self.hint_turns_left.format(n=2)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"Mem1Config.hint_turns_left: {self.hint_turns_left!r} takes only {{n}} ({e})") from e
        if self.prompt_template is not None or self.prompt_template_file is not None:
            self.template()

    def template(self) -> Template:
        return load_template("mem1_prompt", ("question",), self.prompt_template_file, self.prompt_template)

    def sampling(self, rng: random.Random) -> SamplingParams:
        seed = rng.getrandbits(31) if self.temperature > 0 else None
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_turn_tokens, seed=seed)


def parse_action(text: str) -> tuple[str | None, str]:
    """The reply's first complete <search> or <answer> block: (action, its stripped content); (None, "")
    when there is none (the turn is invalid and the trajectory ends)."""
    m = _ACTION.search(text)
    return (m.group(1), m.group(2).strip()) if m else (None, "")


def internal_state(text: str, tag: str) -> str:
    """The text of the reply's first <tag>...</tag> ("" when there is none)."""
    m = re.search(f"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    return m.group(1).strip() if m else ""


def kept_span(tokenizer: Any, ids: list[int], tag: str) -> tuple[int, int]:
    """[start, end) of the sampled ids the next context keeps: from the token that opens <tag> (0 when the
    reply has none) through the token that closes its action (the whole reply, less trailing special ids,
    when it closes none). Token boundaries found by decoding prefixes and suffixes; nothing re-encoded."""
    def text(a: int, b: int) -> str:
        return tokenizer.decode(ids[a:b], skip_special_tokens=True)

    end = len(ids)
    while end > 0 and text(end - 1, end) == "" and tokenizer.decode(ids[end - 1:end]) != "":
        end -= 1  # EOS / pad at the end
    full = text(0, end)
    m = _ACTION.search(full)
    if m:
        lo, hi = 1, end  # the shortest prefix whose text holds the action's closing tag
        while lo < hi:
            mid = (lo + hi) // 2
            if _ACTION.search(text(0, mid)):
                hi = mid
            else:
                lo = mid + 1
        end = lo
    start = 0
    opener = f"<{tag}>"
    if opener in text(0, end):
        lo, hi = 0, end - 1  # the longest suffix whose text still holds the opening tag
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if opener in text(mid, end):
                lo = mid
            else:
                hi = mid - 1
        start = lo
    return start, end


def format_results(hits: list[Any], fmt: str) -> str:
    if fmt == "published":
        return "".join(f"Doc {i}(Title: {h.document.title}) {h.document.text}\n" for i, h in enumerate(hits, 1))
    return "\n\n".join(f"({i}) {h.document.title}\n{h.document.text}" if h.document.title else f"({i}) {h.document.text}"
                       for i, h in enumerate(hits, 1))


def rolling_view(history: list[int], prompt_len: int, kept_len: int, cap: int) -> list[int]:
    """What a call sees under context_cap=rolling: the last `cap` tokens of the history (the window), then
    its first `prompt_len` tokens and its last `kept_len` ones (the whole window where the two overlap)."""
    window = history[-cap:]
    if prompt_len + kept_len >= len(window):
        return window
    return window[:prompt_len] + (window[-kept_len:] if kept_len else [])


def hint(cfg: Mem1Config, turns_left: int) -> str:
    """The observation's hint after a turn that leaves `turns_left` turns (the released rule)."""
    if turns_left > 1:
        return cfg.hint_turns_left.format(n=turns_left)
    return cfg.hint_last_turn if turns_left == 1 else ""


async def run(task: Task, engine: Engine, cfg: Mem1Config, rng: random.Random, services: Any = None) -> Trajectory:
    """One MEM1 trajectory: turns until an answer, an invalid turn or max_turns."""
    tok = engine.tokenizer
    if cfg.retriever_scope == "task":
        retriever = ts.task_retriever(task)
    else:
        if services is None:
            services = Services()
        retriever = services.retriever(cfg.retriever_kind, cfg.retriever_corpus, cfg.retriever_url)
    _, head = chat_prompt(tok, cfg.template().render(question=task.question), cfg.enable_thinking)
    head = list(head)
    carried: list[int] = []  # latest_state: the kept reply + observation; full_history: every turn's
    history = list(head)  # context_cap=rolling: the prompt, every reply through its action, every observation
    segments: list[Segment] = []
    answer, stop, searches, peak = "", "max_turns", 0, 0
    for turn in range(cfg.max_turns):
        prompt = head + carried
        if cfg.max_context_tokens and cfg.context_cap == "rolling":
            prompt = rolling_view(history, len(head), len(carried), cfg.max_context_tokens)
        elif cfg.max_context_tokens and len(prompt) > cfg.max_context_tokens:
            prompt = prompt[-cfg.max_context_tokens:]
        out = await engine.generate(prompt, cfg.sampling(rng))
        ids = list(out.token_ids)
        reply = decode_response(tok, ids)
        action, content = parse_action(reply)
        start, end = kept_span(tok, ids, cfg.state_tag)
        peak = max(peak, len(prompt) + len(ids))
        info: dict[str, Any] = {"kind": "turn", "turn": turn, "context_tokens": len(prompt), "action": action or "invalid",
                                "internal_state": internal_state(reply, cfg.state_tag), "response_text": reply}
        obs_ids: list[int] = []
        if action == "search":
            searches += 1
            outcome = await ts.run_search(retriever, {"query": content, "topk": cfg.topk}, "published")
            body = format_results(outcome.hits, cfg.result_format) if outcome.error is None else outcome.text
            obs = f"\n\n<information>{hint(cfg, cfg.max_turns - turn - 1)}\n\n{body.strip()}</information>\n\n"
            obs_ids = encode_text(tok, obs)[: cfg.max_obs_tokens]  # retrieved passages: plain text, no control ids
            info.update(query=content, observation=tok.decode(obs_ids))
        segments.append(call_segment(prompt, out, turn, info))
        if action != "search":
            answer, stop = (content, "answered") if action == "answer" else ("", "invalid")
            break
        kept = ids[start:end] if cfg.context == "latest_state" else ids[:end]
        history += ids[:end] + obs_ids
        carried = kept + obs_ids if cfg.context == "latest_state" else carried + kept + obs_ids
    metrics = {
        "turns": float(len(segments)),
        "model_calls": float(len(segments)),
        "searches": float(searches),
        "answered": float(stop == "answered"),
        "invalid_turn": float(stop == "invalid"),
        "peak_context_tokens": float(peak),
        "context_tokens": 0.0,
        # the mean prompt over the calls (as MemAct's and fold's mean_context_tokens)
        "mean_context_tokens": math.fsum(s.info["context_tokens"] for s in segments) / len(segments) if segments else 0.0,
        "generated_tokens": float(sum(len(s.response_ids) for s in segments)),
    }
    return Trajectory(task.task_id, "", segments, final_answer=answer, metrics=metrics,
                      info={"answer_text": answer, "stop": stop, "reward_scale": cfg.reward_scale,
                            "answer_separator": cfg.answer_separator,
                            "internal_states": [s.info["internal_state"] for s in segments]})


def objective_scores(answer: str, task: Task, separator: str = ";") -> tuple[list[float], list[float]]:
    """(EM, F1) per objective: the answer split on `separator`, answer i against objective i's aliases
    (a missing answer scores 0)."""
    golds = gold_aliases(task)
    preds = [p.strip() for p in answer.split(separator)] if answer.strip() else []
    ems = [best_em(preds[i], g) if i < len(preds) else 0.0 for i, g in enumerate(golds)]
    f1s = [best_f1(preds[i], g) if i < len(preds) else 0.0 for i, g in enumerate(golds)]
    return ems, f1s


def reward(task: Task, traj: Trajectory) -> Score:
    """Per-objective exact match: their mean (reward_scale=mean) or count (sum, the released reward); the
    multiq_* metrics the evaluator reads for multi-objective rows."""
    ems, f1s = objective_scores(traj.final_answer, task, str(traj.info.get("answer_separator", ";")))
    k = len(ems)
    total = sum(ems)
    value = total if traj.info.get("reward_scale") == "sum" else total / k
    return Score(value, metrics={"multiq_questions": float(k), "multiq_correct": total,
                                 "multiq_all_correct": float(total == k), "multiq_subq_accuracy": total / k,
                                 "multiq_f1_mean": sum(f1s) / k})


SPEC = WorkflowSpec("mem1", run, Mem1Config, reward, format_keys=("invalid_turn",), row_columns=row_columns)
"""`workflow=mem1` (registered in memrl.workflows); evaluation is greedy (the spec's default)."""
