"""ReMemR1 (arXiv 2509.23040): MemAgent's chunked loop with revisitable memory.

Each memory step t sees problem + recalled memory + memory m_{t-1} + chunk t and answers
`<thinking>...</thinking>`, one `<update>m_t</update>` and optionally one `<recall>q_t</recall>`. The
query is matched (top-1, `memrl.workflows.recall`) against the memories of steps < t, i.e. m_0..m_{t-1};
the hit is shown in the `<recalled_memory>` block of prompt t+1 (the final prompt for the last step),
"No memory was recalled." otherwise. m_t itself is added to the history only after its own query is
answered: that is the released training code's order. The released eval code adds m_t first, so a query
can return the memory the next prompt already shows (an open bug report there); memrl uses the training
order unless `recall_candidates=with_current` (the released evaluation's order) says otherwise.

Malformed steps never crash a rollout (each case is counted in the metrics):
- no `<update>` at all, or an empty one: no memory, so `empty_memory` decides (default: keep the previous
  memory) (`missing_update`, `empty_update`);
- two or more `<update>`s: the first closed block is the memory (`multiple_updates`);
- an `<update>` that never closes (e.g. cut at max tokens): the text after it to the end of the response
  (`unclosed_update`);
- `<recall>` blocks are cut out of the memory text; the first closed non-empty one is the query
  (`multiple_recalls`), an unclosed or empty one is no query (`unclosed_recall`, `empty_recall`).

`memory_rule=strip_recall` takes the released code's memory instead: the whole response minus its closed
recall blocks (`strip_recall_memory`); the format flags and rewards still read the tags.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from typing import Any

from memrl.config import MAX_COEF, MAX_TOKENS, valid
from memrl.engines.base import Engine
from memrl.rewards import steps as step_rewards_lib
from memrl.rewards.qa import extract_boxed
from memrl.types import Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec, boxed_em_outcome
from memrl.workflows.chunked import (
    EMPTY_MEMORY_RULES,
    THINK_END,
    THINK_OPEN,
    ChunkedConfig,
    call_segment,
    call_template,
    loop_metrics,
    task_chunks,
    think_text_rule,
)
from memrl.workflows.recall import RECALL_RULES, SCORERS, recall_top1, subword_terms
from memrl.workflows.templates import Template

log = logging.getLogger(__name__)

NO_RECALL = "No memory was recalled."
FORMAT_FLAGS = (
    "missing_update", "empty_update", "multiple_updates", "unclosed_update",
    "multiple_recalls", "unclosed_recall", "empty_recall",
)  # fmt: skip
MEMORY_RULES: tuple[str, ...] = ("update_tag", "strip_recall")
QUERY_RULES: tuple[str, ...] = ("first_block", "greedy_line")
RECALL_CANDIDATES: tuple[str, ...] = ("earlier", "with_current")
_DEFAULT_TAGS = {"update_tag": "update", "recall_tag": "recall", "thinking_tag": "thinking"}
_MEMORY_FIELDS = ("problem", "recalled_memory", "memory", "chunk")


@dataclass
class ReMemR1Config(ChunkedConfig):
    """ReMemR1 workflow settings; defaults are the published values (the paper and the released
    recurrent/impls/memory_revisit.py), the prompts excepted (memrl's own wording). The loop settings
    (chunk_tokens, max_chunks, sampling, no_memory_text, and the <think> switches memory_text and
    enable_thinking) are ChunkedConfig's."""

    max_memory_tokens: int = valid(2048, ge=1, le=MAX_TOKENS)
    """Generation budget of a memory step (thinking + update + recall)."""
    max_final_tokens: int = valid(2048, ge=1, le=MAX_TOKENS)
    """Generation budget of the final answer call."""
    no_recall_text: str = NO_RECALL
    """What the <recalled_memory> block holds when nothing was recalled."""
    update_tag: str = "update"
    """Tag around the new memory."""
    recall_tag: str = "recall"
    """Tag around a callback query."""
    thinking_tag: str = "thinking"
    """Tag around the reasoning (not parsed; only named in the default prompt)."""
    scorer: str = valid("tfidf", choices=SCORERS)
    """Recall scorer: tfidf (released code), word_overlap (paper), bm25."""
    min_recall_score: float = valid(0.0, ge=-1, le=MAX_COEF, note="below 0 = the best match is recalled even at score 0")
    """A recall retrieves nothing unless the best score is above this."""
    recall_scoring: str = valid("memrl", choices=RECALL_RULES)
    """How the tfidf scorer picks the recalled memory (memrl.workflows.recall): memrl = lowercase words as
    terms, empty and placeholder memories never candidates, ties to the most recent memory; released =
    the released TfidfRetriever: the policy tokenizer's subword pieces (lowercased, "Ġ" removed) as terms,
    every memory a candidate (the empty one too), no candidate with a term = nothing recalled, ties by a
    fixed stand-in for the set order the released code iterates (SHA-256 order of the texts, the last
    tied one wins). Needs scorer=tfidf."""
    bm25_k1: float = valid(1.5, ge=0, le=MAX_COEF)
    bm25_b: float = valid(0.75, ge=0, le=1)
    format_weight: float = valid(1.0, ge=0, le=MAX_COEF)
    """Step reward weights: w_f * format + w_m * memory gain + w_c * callback gain (memrl.rewards.steps)."""
    memory_weight: float = valid(1.0, ge=0, le=MAX_COEF)
    callback_weight: float = valid(1.0, ge=0, le=MAX_COEF)
    callback_rule: str = valid("paper", choices=step_rewards_lib.CALLBACK_RULES)
    """How a recall is credited (memrl.rewards.steps): paper = only gold-answer words that neither the
    memory the step read nor its chunk hold (normalized words, max over golds); released = the public
    code's rule (raw substrings of the whole step prompt, mean over golds)."""
    format_rule: str = valid("paper", choices=step_rewards_lib.FORMAT_RULES)
    """The format term (memrl.rewards.steps): paper = exactly one <update> opened, closed (across lines) and
    non-empty (final step: one filled \\boxed{}); released = the public code's one-line patterns
    (verl/trainer/ppo/metric_utils.py compute_format_rewards): exactly one non-blank <update>...</update>
    with both tags on one line, blank blocks not counted (final step: greedy one-line \\boxed{...})."""
    memory_gain_rule: str = valid("paper", choices=step_rewards_lib.MEMORY_GAIN_RULES)
    """The memory term (memrl.rewards.steps): paper = recall(m_t) - recall(m_{t-1}) over the parsed memories
    (normalized words, max over golds); released = the public code's (metric_utils.py
    compute_action_rewards): raw-substring recall (mean over golds) of the response's first one-line
    <update> text minus that of the step prompt's first one-line <memory> text (none with the published
    prompt, whose memory sits on its own lines: the term is then the new memory's own recall)."""
    memory_template_file: str | None = None
    """File overriding the memory prompt; needs {problem} (or {prompt}), {recalled_memory}, {memory} and
    {chunk} (read as template_style / template_strip say)."""
    final_template_file: str | None = None
    """File overriding the final prompt; needs {problem} (or {prompt}), {recalled_memory} and {memory}."""
    memory_template: str | None = None
    """Inline memory prompt (wins over the file)."""
    final_template: str | None = None
    """Inline final prompt (wins over the file)."""

    # Published-setup switches (memrl's default first; docs/DIFFERENCES.md).
    memory_rule: str = valid("update_tag", choices=MEMORY_RULES)
    """What the new memory is: update_tag (the first <update> block's text: the paper and memrl) or
    strip_recall (the whole response with every closed <recall>...</recall> block cut out, thinking and
    tags included, whitespace-trimmed: the released code, memory_revisit.py _parse_update_memory)."""
    query_rule: str = valid("first_block", choices=QUERY_RULES)
    """The recall query: first_block (the first closed non-empty <recall> block, across lines,
    whitespace-trimmed: memrl) or greedy_line (the released regex <recall>(.+)</recall>: one line, from
    the first open tag to the last close tag on it, untrimmed: memory_revisit.py _parse_recall_query)."""
    recall_candidates: str = valid("earlier", choices=RECALL_CANDIDATES)
    """Which memories step t's query searches: earlier (those of steps < t: the paper and the released
    training code, memory_revisit.py) or with_current (m_t too, added before its own query is answered:
    the released evaluation, taskutils/memory_eval/utils/rememr1.py async_query_llm)."""
    recall: bool = True
    """False disables callbacks (an ablation at evaluation): the prompt is unchanged and a <recall> query is
    still parsed and counted (`recalls`, `recalls_blocked`), but it retrieves nothing, so the next prompt
    shows no_recall_text and no callback reward is earned."""
    empty_memory: str = valid("keep_previous", choices=EMPTY_MEMORY_RULES)
    """A step that yields no memory (no / empty <update>, or an empty strip_recall text): keep_previous
    (memrl), placeholder (no_memory_text) or empty (the empty string: the released code)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.memory_rule not in MEMORY_RULES:
            raise ValueError(
                f"ReMemR1Config.memory_rule must be one of {', '.join(MEMORY_RULES)}, got {self.memory_rule!r}"
            )
        if self.query_rule not in QUERY_RULES:
            raise ValueError(
                f"ReMemR1Config.query_rule must be one of {', '.join(QUERY_RULES)}, got {self.query_rule!r}"
            )
        if self.callback_rule not in step_rewards_lib.CALLBACK_RULES:
            raise ValueError(
                f"ReMemR1Config.callback_rule must be one of {', '.join(step_rewards_lib.CALLBACK_RULES)}, "
                f"got {self.callback_rule!r}"
            )
        for name, allowed in (("format_rule", step_rewards_lib.FORMAT_RULES),
                              ("memory_gain_rule", step_rewards_lib.MEMORY_GAIN_RULES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ReMemR1Config.{name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        if self.recall_candidates not in RECALL_CANDIDATES:
            raise ValueError(f"ReMemR1Config.recall_candidates must be one of {', '.join(RECALL_CANDIDATES)}, "
                             f"got {self.recall_candidates!r}")
        if not isinstance(self.recall, bool):
            raise ValueError(f"ReMemR1Config.recall must be true or false, got {self.recall!r}")
        if self.scorer not in SCORERS:
            raise ValueError(f"ReMemR1Config.scorer must be one of {', '.join(SCORERS)}, got {self.scorer!r}")
        if self.recall_scoring not in RECALL_RULES:
            raise ValueError(f"ReMemR1Config.recall_scoring must be one of {', '.join(RECALL_RULES)}, "
                             f"got {self.recall_scoring!r}")
        if self.recall_scoring == "released" and self.scorer != "tfidf":
            raise ValueError(f"ReMemR1Config.recall_scoring=released is the released TF-IDF retriever; it needs "
                             f"scorer=tfidf, got {self.scorer!r}")
        tags = [self.update_tag, self.recall_tag, self.thinking_tag]
        for name, tag in zip(_DEFAULT_TAGS, tags, strict=True):
            if not re.fullmatch(r"[A-Za-z_][\w-]*", tag or ""):
                raise ValueError(f"ReMemR1Config.{name} must be a tag name like 'update', got {tag!r}")
        if len(set(tags)) != 3:
            raise ValueError(f"ReMemR1Config: update/recall/thinking tags must differ, got {tags}")
        if any(v is not None for v in (self.memory_template_file, self.final_template_file,
                                       self.memory_template, self.final_template)):
            self.templates()  # a bad template is a one-line error now, not in the middle of a rollout

    def templates(self) -> tuple[Template, Template]:
        mem = self.load_template(
            "rememr1_memory", ("problem", "recalled_memory", "memory", "chunk"),
            self.memory_template_file, self.memory_template,
        )  # fmt: skip
        fin = self.load_template(
            "rememr1_final",
            ("problem", "recalled_memory", "memory"),
            self.final_template_file,
            self.final_template,
        )
        if self.memory_template is None and self.memory_template_file is None:
            mem = Template(self._retag(mem.text), mem.placeholders, mem.source)
        return mem, fin

    def _retag(self, text: str) -> str:
        """The packaged prompt names the default tags; rename them when the config renames tags."""
        for name, default in _DEFAULT_TAGS.items():
            tag = getattr(self, name)
            if tag != default:
                text = text.replace(f"<{default}>", f"<{tag}>").replace(f"</{default}>", f"</{tag}>")
        return text



@dataclass
class ParsedStep:
    """One memory-step response, parsed. `memory` None means: keep the previous memory."""

    memory: str | None
    query: str | None
    update_blocks: int
    recall_blocks: int
    flags: dict[str, bool]

    @property
    def well_formed(self) -> bool:
        """Exactly one closed, non-empty update (what the format reward asks for)."""
        return self.update_blocks == 1 and not any(
            self.flags[k] for k in ("missing_update", "empty_update", "unclosed_update")
        )


def parse_step(text: str, update_tag: str = "update", recall_tag: str = "recall") -> ParsedStep:
    """Memory and recall query of a memory-step response, by the rules in the module docstring."""
    text = text or ""
    u_open, u_close = f"<{update_tag}>", f"</{update_tag}>"
    r_open, r_close = f"<{recall_tag}>", f"</{recall_tag}>"
    recall_block = re.compile(re.escape(r_open) + r"(.*?)" + re.escape(r_close), re.DOTALL)
    flags = dict.fromkeys(FORMAT_FLAGS, False)

    n_update = text.count(u_open)
    memory: str | None = None
    if n_update == 0:
        flags["missing_update"] = True
    else:
        start = text.index(u_open) + len(u_open)
        end = text.find(u_close, start)
        if end < 0:
            flags["unclosed_update"] = True
            body = text[start:]
        else:
            body = text[start:end]
        flags["multiple_updates"] = n_update > 1
        body = recall_block.sub("", body)
        if r_open in body:  # an unclosed recall inside the memory: cut from it to the end
            body = body[: body.index(r_open)]
        body = body.strip()
        if body:
            memory = body
        else:
            flags["empty_update"] = True

    n_recall = text.count(r_open)
    queries = [q.strip() for q in recall_block.findall(text)]
    query: str | None = None
    if n_recall:
        if not queries:
            flags["unclosed_recall"] = True
        elif not queries[0]:
            flags["empty_recall"] = True
        else:
            query = queries[0]
        flags["multiple_recalls"] = n_recall > 1
    return ParsedStep(memory, query, n_update, n_recall, flags)


def greedy_line_query(text: str, recall_tag: str = "recall") -> str | None:
    """The released code's recall query: `<recall>(.+)</recall>` searched without DOTALL (so within one
    line, greedy up to the line's last close tag), not trimmed; None when there is no match."""
    m = re.search(re.escape(f"<{recall_tag}>") + r"(.+)" + re.escape(f"</{recall_tag}>"), text or "")
    return m.group(1) if m else None


def strip_recall_memory(text: str, recall_tag: str = "recall") -> str:
    """The released code's memory: the response without its closed recall blocks (non-greedy, across
    lines), whitespace-trimmed; thinking blocks and <update> tags stay. An unclosed recall stays too."""
    block = re.compile(re.escape(f"<{recall_tag}>") + r".*?" + re.escape(f"</{recall_tag}>"), re.DOTALL)
    return block.sub("", text or "").strip()


@dataclass
class _Reading:
    """What the memory steps carry from one chunk to the next, and their counts."""

    memory: str
    shown_recall: str  # what the next prompt's <recalled_memory> block holds
    history: list[tuple[int, str]] = field(default_factory=list)  # (step, memory) of steps already finished
    segments: list[Segment] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FORMAT_FLAGS, 0))
    memory_lengths: list[int] = field(default_factory=list)
    recalls: int = 0
    retrieved: int = 0
    callback_hits: int = 0
    well_formed: int = 0
    thinking: int = 0


async def run(task: Task, engine: Engine, cfg: ReMemR1Config, rng: random.Random) -> Trajectory:
    """One ReMemR1 trajectory: memory steps over the chunks (with callbacks), then the final answer."""
    mem_tpl, fin_tpl = cfg.templates()
    context_ids, chunks, truncated = task_chunks(task, engine.tokenizer, cfg)
    terms = subword_terms(engine.tokenizer) if cfg.recall_scoring == "released" else None
    st = _Reading(cfg.no_memory_text, cfg.no_recall_text)
    for t, chunk_ids in enumerate(chunks):
        await _memory_step(st, t, chunk_ids, task, engine, cfg, rng, mem_tpl, terms)
    prompt_ids, out, answer_text = await call_template(
        engine, fin_tpl, cfg.sampling(cfg.max_final_tokens, rng), cfg.prompt_assembly, cfg.enable_thinking,
        problem=task.question, recalled_memory=st.shown_recall, memory=st.memory)
    boxed = extract_boxed(answer_text)
    st.segments.append(call_segment(prompt_ids, out, len(chunks), {
        "kind": "final", "response_text": answer_text, "memory": st.memory, "shown_recalled_memory": st.shown_recall,
        "answer_text": answer_text, "prediction": boxed or "",
    }))
    return Trajectory(task_id=task.task_id, trajectory_id="", segments=st.segments, final_answer=boxed or "",
                      metrics=_metrics(st, cfg, context_ids, chunks, truncated, boxed),
                      info=_info(st, cfg, mem_tpl, answer_text))


async def _memory_step(st: _Reading, t: int, chunk_ids: list[int], task: Task, engine: Engine, cfg: ReMemR1Config,
                       rng: random.Random, mem_tpl: Template, terms: Any) -> None:
    """Memory step t on chunk `chunk_ids`: the call, its memory and recall query read, the recall, its row."""
    chunk = engine.tokenizer.decode(chunk_ids)
    # spliced (memory_revisit.py): each text value encoded on its own, the chunk's ids as cut; the memory is
    # the parsed update text, encoded again (the released update keeps no reply ids)
    prompt_ids, out, reply = await call_template(
        engine, mem_tpl, cfg.sampling(cfg.max_memory_tokens, rng), cfg.prompt_assembly, cfg.enable_thinking,
        problem=task.question, recalled_memory=st.shown_recall, memory=st.memory, chunk=chunk_ids)
    st.thinking += int(THINK_END in reply or THINK_OPEN in reply)
    # memory_text: the tags (and strip_recall's memory) are read from the reply without its reasoning
    response = think_text_rule(reply, cfg.memory_text)
    parsed = parse_step(response, cfg.update_tag, cfg.recall_tag)
    for k, v in parsed.flags.items():
        st.counts[k] += int(v)
    st.well_formed += int(parsed.well_formed)
    query = greedy_line_query(response, cfg.recall_tag) if cfg.query_rule == "greedy_line" else parsed.query
    new_memory = cfg.memory_after(
        strip_recall_memory(response, cfg.recall_tag) if cfg.memory_rule == "strip_recall" else parsed.memory,
        st.memory,
    )
    # Retrieval sees only the memories of steps < t: m_t joins the history after its own query
    # (with_current: before it, as the released evaluation does).
    # released: every memory joins the history (the released code adds whatever the step parsed)
    recallable = cfg.recall_scoring == "released" or (bool(new_memory) and new_memory != cfg.no_memory_text)
    candidates = (st.history + [(t, new_memory)] if cfg.recall_candidates == "with_current" and recallable
                  else st.history)
    hit = (
        recall_top1(query, candidates, cfg.scorer, cfg.min_recall_score, cfg.bm25_k1, cfg.bm25_b,
                    rule=cfg.recall_scoring, tokenize=terms)
        if query and cfg.recall
        else None
    )
    st.recalls += int(query is not None)
    st.retrieved += int(hit is not None)
    gold_in_recall = hit is not None and step_rewards_lib.answer_word_recall(hit.text, task.answers) > 0
    st.callback_hits += int(gold_in_recall)
    st.memory_lengths.append(len(out.token_ids))
    st.segments.append(call_segment(prompt_ids, out, t, {
        "kind": "memory",
        "chunk_index": t,
        "chunk_tokens": len(chunk_ids),
        "chunk": chunk,
        "response_text": response,
        **({"reply_text": reply} if reply != response else {}),  # the whole reply, <think> text included
        "previous_memory": st.memory,
        "memory": new_memory,
        "shown_recalled_memory": st.shown_recall,
        "recall_query": query,
        "recalled_memory": hit.text if hit else None,
        "recalled_step": hit.step if hit else None,
        "recall_score": hit.score if hit else None,
        "recall_hit": hit is not None,
        "callback_hit": gold_in_recall,
        "format_ok": parsed.well_formed,
        "format_flags": [k for k, v in parsed.flags.items() if v],
    }))
    if recallable:  # the placeholder is not a memory worth recalling (memrl)
        st.history.append((t, new_memory))
    st.memory = new_memory
    st.shown_recall = hit.text if hit else cfg.no_recall_text


def _metrics(st: _Reading, cfg: ReMemR1Config, context_ids: list[int], chunks: list[Any], truncated: Any,
             boxed: str | None) -> dict[str, float]:
    """The trajectory's metrics: the chunked loop's, then the recall and format counts."""
    n = len(chunks)
    return {
        **loop_metrics(context_ids, chunks, truncated, st.memory_lengths, boxed, st.segments),
        "recalls": float(st.recalls),
        "recall_rate": st.recalls / n if n else 0.0,
        "recall_retrieved": float(st.retrieved),
        "recalls_blocked": float(0 if cfg.recall else st.recalls),
        "callback_hits": float(st.callback_hits),
        "callback_hit_rate": st.callback_hits / st.recalls if st.recalls else 0.0,
        "format_ok_rate": st.well_formed / n if n else 1.0,
        "format_errors": float(n - st.well_formed),
        "thinking_memory_calls": float(st.thinking),  # memory replies holding <think> or </think> text
        **{k: float(v) for k, v in st.counts.items()},
    }


def _info(st: _Reading, cfg: ReMemR1Config, mem_tpl: Template, answer_text: str) -> dict[str, Any]:
    """The trajectory's info: the answer text, the memories, and what its step rewards read."""
    return {
        "answer_text": answer_text,
        # One memory per memory call, as MemAgent's (the eval JSONL's memory_trace); the recall
        # candidates leave out placeholder memories, so they can be fewer.
        "memories": [s.info["memory"] for s in st.segments if s.info.get("kind") == "memory"],
        "recall_candidates": [m for _, m in st.history],
        "step_reward_weights": [cfg.format_weight, cfg.memory_weight, cfg.callback_weight],
        "update_tag": cfg.update_tag,
        "reward": cfg.reward,
        "callback_rule": cfg.callback_rule,
        # the released callback and memory rules read the whole step prompt: re-rendered from this at
        # reward time
        **({"memory_template_text": mem_tpl.text, "no_recall_text": cfg.no_recall_text}
           if "released" in (cfg.callback_rule, cfg.memory_gain_rule) else {}),
        **({"format_rule": cfg.format_rule} if cfg.format_rule != "paper" else {}),
        **({"memory_gain_rule": cfg.memory_gain_rule} if cfg.memory_gain_rule != "paper" else {}),
    }


def step_rewards(task: Task, traj: Trajectory, cfg: ReMemR1Config | None = None) -> list[float]:
    """The step reward of every segment of a ReMemR1 trajectory (pure: the score stage returns them,
    WorkflowSpec.step_rewards).

    Weights come from `cfg`, else from the config the trajectory ran with (traj.info), else 1.

    Memory step t: w_f*format(response) + w_m*(recall(m_t) - recall(m_{t-1})) + w_c*max(0, recall(m_{t-1} +
    c_t + recalled_t) - recall(m_{t-1} + c_t)), recall = fraction of gold-answer words found, max over
    golds; c_t is the step's chunk, recalled_t what step t's own query retrieved: a recall earns only
    what neither the memory the step read nor its chunk hold (`callback_rule=released`: the public
    code's rule over the whole step prompt, memrl.rewards.steps.released_callback_gain).
    Final step: w_f * (exactly one non-empty \\boxed{}).
    """
    if cfg is not None:
        wf, wm, wc = cfg.format_weight, cfg.memory_weight, cfg.callback_weight
        tag, rule = cfg.update_tag, cfg.callback_rule
        fmt_rule, gain_rule = cfg.format_rule, cfg.memory_gain_rule
        tpl_text, no_recall = cfg.templates()[0].text, cfg.no_recall_text
    else:
        wf, wm, wc = traj.info.get("step_reward_weights", (1.0, 1.0, 1.0))
        tag, rule = traj.info.get("update_tag", "update"), traj.info.get("callback_rule", "paper")
        fmt_rule = traj.info.get("format_rule", "paper")
        gain_rule = traj.info.get("memory_gain_rule", "paper")
        tpl_text, no_recall = traj.info.get("memory_template_text"), traj.info.get("no_recall_text", NO_RECALL)
    needs_prompt = "released" in (rule, gain_rule)
    if needs_prompt and not tpl_text:
        raise ValueError(f"trajectory {traj.trajectory_id or traj.task_id}: callback_rule=released and "
                         "memory_gain_rule=released need the memory prompt "
                         "(traj.info['memory_template_text'] or a config)")
    template = Template(tpl_text, _MEMORY_FIELDS, "the trajectory's memory prompt") if needs_prompt else None
    out = []
    for seg in traj.segments:
        info = seg.info
        final = info.get("kind") == "final"
        if "response_text" not in info:
            raise ValueError(
                f"trajectory {traj.trajectory_id or traj.task_id}: segment {seg.step} has no "
                "info['response_text']; step rewards need a ReMemR1 trajectory"
            )
        response = info["response_text"]
        if tag != "update" and not final:
            # memrl.rewards.steps.format_reward only knows <update>: present a renamed tag under that name.
            response = response.replace(f"<{tag}>", "<update>").replace(f"</{tag}>", "</update>")
        recalled = None if final else info.get("recalled_memory")
        prompt = None
        if template is not None and not final:
            prompt = template.render(problem=task.question, recalled_memory=info["shown_recalled_memory"],
                                     memory=info["previous_memory"], chunk=info["chunk"])
            if rule == "released":
                # the released code prepends the no-recall text when nothing was recalled (a recalled empty
                # memory is prepended as it is)
                recalled = no_recall if recalled is None else recalled
        r = step_rewards_lib.step_reward(
            response,
            task.answers,
            final=final,
            new_memory=None if final else info["memory"],
            prev_memory=None if final else info["previous_memory"],
            chunk=None if final else info.get("chunk"),
            recalled=recalled,
            format_weight=wf,
            memory_weight=wm,
            callback_weight=wc,
            callback_rule=rule,
            prompt=prompt,
            format_rule=fmt_rule,
            memory_gain_rule=gain_rule,
        )
        out.append(r)
    return out


def reward(task: Task, traj: Trajectory) -> float:
    """Outcome reward = the verifier `workflow.reward` names (default boxed_em: boxed exact match, max over
    golds). The step rewards are `step_rewards`' (weights from the config the trajectory ran with, kept
    in traj.info), returned next to it by the score stage."""
    return boxed_em_outcome(task, traj)


SPEC = WorkflowSpec(
    "rememr1", run, ReMemR1Config, reward, step_rewards=step_rewards,
    format_keys=("no_box", *FORMAT_FLAGS),
    train_defaults={"max_chunks": 8},  # training caps the context at 8 chunks, as for memagent
    ask=True, recall_key="recall_query",  # `memrl ask` runs it and shows each step's recall query
)
