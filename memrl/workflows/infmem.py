"""InfMem (arXiv 2602.02704; code UCMP13753/InfMem, recurrent/impls/infmem.py): MemAgent's chunked loop
where, before each chunk, a planning call decides to RETRIEVE (a BM25 search with its own top_k over
passages of the same document) or to STOP reading; then a memory call WRITES the memory from the
retrieved passages, the next chunk and the old memory; a final call answers from the memory.

Per step t (chunk t): plan call -> "STOP" anywhere in its reply ends the reading (stop_step = t), else
every `retrieve` call in it runs (the last one's passages are shown) -> memory call -> next step. After
the last chunk, or a stop, the final call. Every call is one training segment (kinds plan / memory /
final); `Segment.step` is 2t for plan t, 2t + 1 for memory t and 2 x chunks for the final call, so
per-step statistics (algorithm=rememr1) compare like with like across trajectories that stopped at
different steps. The outcome, the early-stop reward and the protocol reward are mixed by `reward`
(memrl.rewards.early_stop); the memory-gain step rewards are `step_rewards`.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_CHARS, MAX_COEF, MAX_TOKENS, MAX_VOCAB, valid
from memrl.engines.base import ChatPrompt, Engine
from memrl.quiet import chat_pieces, encode_chat, encode_pieces
from memrl.rewards import early_stop as rw
from memrl.rewards import steps
from memrl.rewards.qa import extract_boxed
from memrl.services.in_document import SCORERS, DocumentRetriever, cut_passages
from memrl.tools.calls import parse_tool_calls
from memrl.types import Group, Score, Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec, boxed_em_outcome
from memrl.workflows.chunked import (
    THINK_END,
    ChunkedConfig,
    call_segment,
    call_template,
    decode_response,
    loop_metrics,
    task_chunks,
    think_text_rule,
)
from memrl.workflows.templates import Template, load_template, template_kwargs

CALL_FORMATS: tuple[str, ...] = ("hermes", "qwen_agent")
MEMORY_WRITES: tuple[str, ...] = ("reply", "after_think")
PLANNER_FRAMES: tuple[str, ...] = ("chat", "open_user")
MAX_STEPS_RULES: tuple[str, ...] = ("chunks", "floor")
# Qwen-Agent's function-call markers, as a model trained on that format writes a call
_QWEN_CALL = re.compile("\u273fFUNCTION\u273f:\\s*([^\\n]+?)\\s*\u273fARGS\u273f:\\s*([^\u273f]*)", re.DOTALL)


@dataclass
class InfMemConfig(ChunkedConfig):
    """InfMem workflow settings: ChunkedConfig's loop (chunk_tokens, max_chunks, budgets, sampling,
    memory_text, the published-setup switches) plus the plan / retrieve / stop actions and the reward
    weights. Defaults: memrl's choices where they differ (docs/DIFFERENCES.md); the infmem_official preset
    sets the released code's values."""

    max_plan_tokens: int = valid(1024, ge=1, le=MAX_TOKENS)
    """Generation budget of a plan call (the released code gives it the memory budget)."""
    retrieve_passage_tokens: int = valid(500, ge=1, le=MAX_TOKENS)
    """Tokens per retrievable passage of the document (InfMem retrieve_chunk_size, 500)."""
    retrieve_top_k: int = valid(5, ge=1, le=MAX_VOCAB)
    """top_k of a call that gives none, or one that is not an integer >= 1 (InfMem's fallback, 5)."""
    require_top_k: bool = False
    """True (released code): a retrieve call without a top_k argument is invalid (it then searches the
    problem text with retrieve_top_k and loses the protocol reward's call term); False: top_k is optional."""
    retrieval_scorer: str = valid("bm25s", choices=SCORERS)
    """How passages are ranked (memrl.services.in_document): bm25s (memrl's BM25Retriever), okapi (rank_bm25's
    BM25Okapi over words) or okapi_published (the released code's index, built over characters)."""
    max_retrieved_chars: int = valid(12000, ge=1, le=MAX_CHARS)
    """The retrieved block is cut to its first this-many characters (InfMem MAX_RETRIEVED_LENGTH)."""
    retrieved_item: str = "[{rank}] {text}"
    """How one retrieved passage is shown ({rank} from 1, {text}); passages are joined by a blank line."""
    no_retrieval_text: str = "Nothing was retrieved."
    """The retrieved block of a step whose plan made no retrieve call."""
    tool_name: str = "retrieve"
    """The name of the retrieval tool a plan call writes (released code: retrievesearch)."""
    call_format: str = valid("hermes", choices=CALL_FORMATS)
    """How a plan call writes its call: hermes (<tool_call>{"name": ..., "arguments": {...}}</tool_call>,
    memrl) or qwen_agent (the Qwen-Agent function-call text the released code parses)."""
    stop_marker: str = "STOP"
    """A plan reply containing this text anywhere stops the reading (the released rule)."""
    planner_frame: str = valid("chat", choices=PLANNER_FRAMES)
    """chat: the plan prompt is a user message with the assistant's generation prompt (memrl); open_user
    (released code): the chat-rendered user message cut right after its content, so the model continues
    the user turn."""
    memory_write: str = valid("reply", choices=MEMORY_WRITES)
    """reply (memrl): the memory is the reply read as memory_text says, empty_memory applying; a memory
    counts as finished (protocol reward) when non-empty and not cut at its token budget. after_think
    (released code): the memory is the text after the reply's first </think>; a reply without one leaves
    the memory as it was and counts as unfinished."""
    plan_history_header: str = "Retrievals so far: {step} of at most {max_steps}."
    """First line of a plan prompt's {history} ({step}: steps done, {max_steps}); one history_line per
    retrieval follows."""
    memory_history_header: str = "This is step {step} of at most {max_steps}."
    """First line of a memory prompt's {history} ({step} counts from 1); the step's last history_line follows."""
    history_line: str = "{i}. query: {query} (top_k {top_k})"
    """One retrieval in a {history} block ({i} from 1, {query}, {top_k}; str.format, so {query!r} works)."""
    max_steps_count: str = valid("chunks", choices=MAX_STEPS_RULES)
    """The {max_steps} shown: chunks (the number of chunks, memrl) or floor (context tokens // chunk_tokens,
    the released code, one short when the last chunk is partial)."""
    early_stop_end: str = valid("own", choices=("own", "batch"))
    """The step a trajectory that never stopped is scored at by the early-stop reward: own (memrl) = its
    own memory steps; batch (released code: `InfMem.end` reads `self.step`, the generation batch's
    counter) = the most memory steps any trajectory of its scored batch took (training's score stage;
    a trajectory scored alone, as in evaluation, uses its own)."""
    first_step_rule: str = valid("counted", choices=rw.FIRST_STEP_RULES)
    """Early-stop reward of a trajectory that never stopped and found the answer at step 0: counted (memrl)
    or published (0, as the released code's bookkeeping gives)."""
    early_stop_gamma: float = valid(0.6, gt=0, le=1)
    """Decay per step read after the answer reached the memory (InfMem gamma 0.6)."""
    outcome_weight: float = valid(0.6, ge=0, le=MAX_COEF)
    """Weight of the outcome (the `reward` verifier) in the mixed reward (released reward manager: 0.6)."""
    early_stop_weight: float = valid(0.6, ge=0, le=MAX_COEF)
    """Weight of the early-stop reward (0.6)."""
    call_protocol_weight: float = valid(0.5, ge=0, le=MAX_COEF)
    """Weight of "every retrieve call was well formed" (0.5)."""
    memory_protocol_weight: float = valid(0.5, ge=0, le=MAX_COEF)
    """Weight of "every memory write finished" (0.5)."""
    plan_template_file: str | None = None
    """File overriding the plan prompt; must contain {problem}, {history} and {memory}."""
    memory_template_file: str | None = None
    """File overriding the memory prompt; must contain {problem}, {history}, {retrieved}, {chunk}, {memory}."""
    final_template_file: str | None = None
    """File overriding the final-answer prompt; must contain {problem} and {memory}."""
    plan_template: str | None = None
    memory_template: str | None = None
    final_template: str | None = None
    plan_system_file: str | None = None
    """File holding a system turn put before the plan prompt's user turn, read as it is (no placeholders).
    Published: infmem.py `_process_messages_for_function_call` runs Qwen-Agent's
    `preprocess_fncall_messages` over the plan conversation, which puts its function-call instructions and
    the retrievesearch schema in a system turn ahead of the user turn; that text is yours to supply. Unset
    (and plan_system unset): no system turn (memrl)."""
    plan_system: str | None = None
    """The plan prompt's system turn inline (as plan_system_file)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.require_template_files and self.plan_template_file is None and self.plan_template is None:
            raise ValueError("workflow.plan_template_file is required (workflow.require_template_files=true, set by "
                             "the published-recipe presets): save the published plan prompt to a file and pass "
                             "workflow.plan_template_file=FILE")
        if self.require_template_files and self.plan_system_file is None and self.plan_system is None:
            raise ValueError("workflow.plan_system_file is required (workflow.require_template_files=true, set by "
                             "the published-recipe presets): save the system text Qwen-Agent's "
                             "preprocess_fncall_messages gives the planner (its function-call instructions and "
                             "the retrievesearch schema) to a file and pass workflow.plan_system_file=FILE")
        self.plan_system_text()
        for f, allowed in (("call_format", CALL_FORMATS), ("memory_write", MEMORY_WRITES),
                           ("planner_frame", PLANNER_FRAMES), ("max_steps_count", MAX_STEPS_RULES),
                           ("first_step_rule", rw.FIRST_STEP_RULES), ("retrieval_scorer", SCORERS),
                           ("early_stop_end", ("own", "batch"))):
            if getattr(self, f) not in allowed:
                raise ValueError(f"InfMemConfig.{f} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        for f in ("max_plan_tokens", "retrieve_passage_tokens", "retrieve_top_k", "max_retrieved_chars"):
            if getattr(self, f) < 1:
                raise ValueError(f"InfMemConfig.{f} must be >= 1, got {getattr(self, f)}")
        if not 0 < self.early_stop_gamma <= 1:
            raise ValueError(f"InfMemConfig.early_stop_gamma must be in (0, 1], got {self.early_stop_gamma}")
        if not self.stop_marker:
            raise ValueError("InfMemConfig.stop_marker must be a non-empty text")
        if self.prompt_assembly != "text":
            raise ValueError("InfMemConfig.prompt_assembly must be text (the plan call's history and retrieved "
                             f"passages are text), got {self.prompt_assembly!r}")
        for f, keys in (("plan_history_header", {"step": 0, "max_steps": 1}),
                        ("memory_history_header", {"step": 1, "max_steps": 1}),
                        ("history_line", {"i": 1, "query": "q", "top_k": 1}),
                        ("retrieved_item", {"rank": 1, "text": "t"})):
            try:
                getattr(self, f).format(**keys)
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"InfMemConfig.{f}: {getattr(self, f)!r} cannot be filled with "
                                 f"{', '.join('{' + k + '}' for k in keys)} ({e})") from e
        if any(v is not None for v in (self.plan_template_file, self.memory_template_file, self.final_template_file,
                                       self.plan_template, self.memory_template, self.final_template)):
            self.templates()

    def templates(self) -> tuple[Template, Template, Template]:
        plan = self.load_template("infmem_plan", ("problem", "history", "memory"), self.plan_template_file,
                                  self.plan_template)
        mem = self.load_template("infmem_memory", ("problem", "history", "retrieved", "chunk", "memory"),
                                 self.memory_template_file, self.memory_template)
        fin = self.load_template("memagent_final", ("problem", "memory"), self.final_template_file,
                                 self.final_template)
        return plan, mem, fin

    def plan_system_text(self) -> str | None:
        """The plan prompt's system turn (plan_system, else plan_system_file's text), or None."""
        if self.plan_system is not None:
            return self.plan_system
        if self.plan_system_file is None:
            return None
        return load_template("infmem_plan", (), self.plan_system_file, None, "memrl", self.template_strip).text

    def weights(self) -> tuple[float, float, float, float]:
        return (self.outcome_weight, self.early_stop_weight, self.call_protocol_weight, self.memory_protocol_weight)


@dataclass
class PlanAction:
    """What a plan reply asks for: stop, or its calls in the order written: (query, top_k, well formed) for
    a retrieve call, (None, None, True) for a call to another tool."""

    stop: bool
    calls: list[tuple[str | None, int | None, bool]]

    @property
    def retrievals(self) -> list[tuple[str, int, bool]]:
        return [(q, k, ok) for q, k, ok in self.calls if q is not None and k is not None]


def _top_k(raw: Any, default: int) -> int:
    """int(raw) when that is >= 1 (an integer-valued string too; a JSON true is 1, a float is cut), else
    the default (InfMem `safe_int`)."""
    try:
        v = int(raw)
    except (TypeError, ValueError, OverflowError):
        return default
    return v if v >= 1 else default


def parse_plan(text: str, problem: str, cfg: InfMemConfig) -> PlanAction:
    """Read a plan reply: the stop marker anywhere = stop; else each call to `cfg.tool_name`. A call whose
    arguments are not a JSON object with a non-empty string query (and, with require_top_k, a top_k) is
    ill formed: it searches the problem text with retrieve_top_k (the released fallback)."""
    if cfg.stop_marker in text:
        return PlanAction(True, [])
    raw: list[tuple[str, Any]] = []  # (name, arguments object or None when it did not parse)
    if cfg.call_format == "qwen_agent":
        for m in _QWEN_CALL.finditer(text):
            args_text = m.group(2).strip()
            if args_text.startswith("{") and "}" in args_text:
                args_text = args_text[: args_text.rfind("}") + 1]
            try:
                args = json.loads(args_text)
            except ValueError:
                args = None
            raw.append((m.group(1).strip(), args))
    else:
        res = parse_tool_calls(text, max_calls=1 << 30)
        raw.extend((c.name, c.arguments) for c in res.calls)
        raw.extend(("", None) for _ in res.errors)  # an unparsable block: an ill-formed call to the tool
    action = PlanAction(False, [])
    for name, args in raw:
        if name and name != cfg.tool_name:
            action.calls.append((None, None, True))
            continue
        ok = (isinstance(args, dict) and isinstance(args.get("query"), str) and bool(args["query"].strip())
              and (not cfg.require_top_k or "top_k" in args))
        if ok:
            action.calls.append((args["query"], _top_k(args.get("top_k", cfg.retrieve_top_k), cfg.retrieve_top_k), True))
        else:
            action.calls.append((problem, cfg.retrieve_top_k, False))
    return action


def history_text(header: str, step: int, max_steps: int, line: str, entries: list[tuple[str, Any]],
                 start: int = 1) -> str:
    """A {history} block: the header, then one `line` per (query, top_k) entry numbered from `start`."""
    lines = [header.format(step=step, max_steps=max_steps)]
    lines += [line.format(i=start + k, query=q, top_k=t) for k, (q, t) in enumerate(entries)]
    return "\n".join(lines)


def plan_messages(user_text: str, system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user_text}]


def open_user_prompt(tokenizer: Any, user_text: str, enable_thinking: bool | None = None,
                     system: str | None = None) -> list[int]:
    """The released plan frame: the (system and) user message rendered through the chat template without a
    generation prompt, cut right after the user message's content (its end-of-turn text dropped)."""
    messages, kw = plan_messages(user_text, system), template_kwargs(enable_thinking)

    def render(msgs: list[dict[str, str]]) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw)

    text = render(messages)
    cut = text.rfind(user_text)
    if cut < 0:
        raise ValueError("planner_frame=open_user: the chat template does not keep the user message as written")
    pieces = chat_pieces(tokenizer, messages, render, text)  # the messages as plain text (memrl.quiet)
    kept, left = [], cut + len(user_text)
    for piece, user in pieces:  # up to the end of the user message's content
        kept.append((piece[:left], user))
        left -= len(piece)
        if left <= 0:
            break
    return encode_pieces(tokenizer, kept)


def system_chat_prompt(tokenizer: Any, user_text: str, system: str, enable_thinking: bool | None = None) -> ChatPrompt:
    """A system and a user message through the chat template with the assistant's generation prompt."""
    messages, kw = plan_messages(user_text, system), template_kwargs(enable_thinking)
    _, ids = encode_chat(tokenizer, messages, lambda msgs: tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, **kw))  # the messages as plain text (memrl.quiet)
    return ChatPrompt(ids, messages, kw)


def retrieved_block(hits_text: list[str], cfg: InfMemConfig) -> str:
    block = "\n\n".join(cfg.retrieved_item.format(rank=r, text=t) for r, t in enumerate(hits_text, 1))
    return block[: cfg.max_retrieved_chars]


def read_memory(reply: str, finish_reason: str, previous: str, cfg: InfMemConfig) -> tuple[str, bool]:
    """(the memory after a memory call, whether the write finished), as memory_write says."""
    if cfg.memory_write == "after_think":
        if THINK_END not in reply:
            return previous, False
        return reply.split(THINK_END, 1)[1].strip(), True
    text = think_text_rule(reply, cfg.memory_text)
    return cfg.memory_after(text, previous), bool(text) and finish_reason != "length"


async def run(task: Task, engine: Engine, cfg: InfMemConfig, rng: random.Random) -> Trajectory:
    """One InfMem trajectory: (plan, memory) calls per chunk until a stop or the last chunk, then the final."""
    plan_tpl, mem_tpl, fin_tpl = cfg.templates()
    system = cfg.plan_system_text()
    tok = engine.tokenizer
    context_ids, chunks, truncated = task_chunks(task, tok, cfg)
    kept_ids = [i for c in chunks for i in c]  # the context the chunks cover (after max_chunks' cut)
    retriever = DocumentRetriever(cut_passages(kept_ids, tok, cfg.retrieve_passage_tokens), cfg.retrieval_scorer)
    max_steps = len(chunks) if cfg.max_steps_count == "chunks" else len(kept_ids) // cfg.chunk_tokens
    memory = cfg.no_memory_text
    history: list[tuple[str, Any]] = []
    segments: list[Segment] = []
    memory_lengths: list[int] = []
    stop_step: int | None = None
    retrievals = 0
    tokens_read = 0
    for t, chunk_ids in enumerate(chunks):
        # ---- plan: retrieve or stop
        hist = history_text(cfg.plan_history_header, t, max_steps, cfg.history_line, history)
        values = {"problem": task.question, "history": hist, "memory": memory}
        sampling = cfg.sampling(cfg.max_plan_tokens, rng)
        if cfg.planner_frame == "open_user" or system is not None:
            text = plan_tpl.render(**values)
            prompt_ids = (open_user_prompt(tok, text, cfg.enable_thinking, system) if cfg.planner_frame == "open_user"
                          else system_chat_prompt(tok, text, system or "", cfg.enable_thinking))
            out = await engine.generate(prompt_ids, sampling)
            reply = decode_response(tok, out.token_ids)
        else:
            prompt_ids, out, reply = await call_template(engine, plan_tpl, sampling, "text", cfg.enable_thinking,
                                                         **values)
        action = parse_plan(reply, task.question, cfg)
        block = None
        for query, top_k, _ in action.calls:
            if query is None or top_k is None:
                history.append(("", ""))  # a call to another tool: an empty entry (the released bookkeeping)
                continue
            history.append((query, top_k))
            hits = await retriever.retrieve([query], top_k)
            retrievals += 1
            block = retrieved_block([h.document.text for h in hits[0]], cfg)  # the last call's passages are shown
        segments.append(call_segment(prompt_ids, out, 2 * t, {
            "kind": "plan", "chunk_index": t, "action": "stop" if action.stop else ("retrieve" if action.retrievals else "none"),
            "retrievals": [{"query": q, "top_k": k, "well_formed": ok} for q, k, ok in action.retrievals],
            "calls_well_formed": all(ok for _, _, ok in action.calls), "memory_shown": memory,
        }))
        if action.stop:
            stop_step = t
            break
        # ---- write the memory from the retrieved passages, the chunk and the old memory
        last = history[-1:] if history else [("", "")]
        mem_hist = history_text(cfg.memory_history_header, t + 1, max_steps, cfg.history_line, last,
                                start=max(len(history), 1) if history else 0)
        retrieved = block if block is not None else cfg.no_retrieval_text
        prompt_ids, out, reply = await call_template(
            engine, mem_tpl, cfg.sampling(cfg.max_memory_tokens, rng), "text", cfg.enable_thinking,
            problem=task.question, history=mem_hist, retrieved=retrieved, chunk=chunk_ids, memory=memory)
        new_memory, finished = read_memory(reply, out.finish_reason, memory, cfg)
        memory_lengths.append(len(out.token_ids))
        tokens_read += len(chunk_ids)
        segments.append(call_segment(prompt_ids, out, 2 * t + 1, {
            "kind": "memory", "chunk_index": t, "chunk_tokens": len(chunk_ids), "chunk": tok.decode(chunk_ids),
            "retrieved": retrieved, "previous_memory": memory, "memory": new_memory, "memory_finished": finished,
        }))
        memory = new_memory

    prompt_ids, out, answer_text = await call_template(
        engine, fin_tpl, cfg.sampling(cfg.max_final_tokens, rng), "text", cfg.enable_thinking,
        problem=task.question, memory=memory)
    boxed = extract_boxed(answer_text)
    segments.append(call_segment(prompt_ids, out, 2 * len(chunks), {  # the same key whether or not it stopped
        "kind": "final", "memory": memory, "answer_text": answer_text, "prediction": boxed or "",
    }))
    memories = [s.info["memory"] for s in segments if s.info["kind"] == "memory"]
    metrics = {
        **loop_metrics(context_ids, chunks, truncated, memory_lengths, boxed, segments),
        "tokens_read": float(tokens_read),  # what the memory calls read in order (a stop reads less)
        "retrievals": float(retrievals),
        "stopped": float(stop_step is not None),
        "stop_step": float(stop_step if stop_step is not None else len(chunks)),
        "model_calls": float(len(segments)),
        "memory_steps": float(len(memories)),
    }
    return Trajectory(task.task_id, "", segments, final_answer=boxed or "", metrics=metrics,
                      info={"answer_text": answer_text, "memories": memories, "reward": cfg.reward,
                            "infmem": {"gamma": cfg.early_stop_gamma, "weights": list(cfg.weights()),
                                       "first_step_rule": cfg.first_step_rule,
                                       "early_stop_end": cfg.early_stop_end}})


def stopped_early(traj: Trajectory) -> bool:
    return any(s.info.get("action") == "stop" for s in traj.segments if s.info.get("kind") == "plan")


def memory_steps(traj: Trajectory) -> int:
    return sum(1 for s in traj.segments if s.info.get("kind") == "memory")


def reward_terms(task: Task, traj: Trajectory, batch_steps: int | None = None) -> dict[str, float]:
    """The terms of InfMem's mixed reward, read off the trajectory: outcome, early_stop, calls_ok,
    memories_ok (memrl.rewards.early_stop). `batch_steps`: the step a trajectory that never stopped is scored
    at (early_stop_end=batch); None = its own memory steps."""
    opts = traj.info.get("infmem", {})
    memories = [s.info.get("memory", "") for s in traj.segments if s.info.get("kind") == "memory"]
    plans = [s for s in traj.segments if s.info.get("kind") == "plan"]
    stopped = stopped_early(traj)
    found = rw.first_answer_step(memories, task.answers)
    end = batch_steps if batch_steps is not None and not stopped else len(memories)
    early = rw.early_stop_reward(found, end, stopped, float(opts.get("gamma", 0.6)),
                                 str(opts.get("first_step_rule", "counted")))
    return {
        "outcome": boxed_em_outcome(task, traj),
        "early_stop": early,
        "calls_ok": float(all(s.info.get("calls_well_formed", True) for s in plans)),
        "memories_ok": float(all(s.info.get("memory_finished", True) for s in traj.segments
                                 if s.info.get("kind") == "memory")),
    }


def reward(task: Task, traj: Trajectory, batch_steps: int | None = None) -> Score:
    """InfMem's trajectory reward: w_out * outcome + w_stop * early_stop + w_call * calls_ok + w_mem *
    memories_ok (the workflow's *_weight fields); each term is reported as a metric (infmem_<term>)."""
    terms = reward_terms(task, traj, batch_steps)
    weights = tuple(traj.info.get("infmem", {}).get("weights", (0.6, 0.6, 0.5, 0.5)))
    value = rw.mixed_reward(terms["outcome"], terms["early_stop"], terms["calls_ok"] >= 1.0,
                            terms["memories_ok"] >= 1.0, weights)  # type: ignore[arg-type]
    return Score(value, metrics={f"infmem_{k}": v for k, v in terms.items()})


def batch_scores(groups: list[Group], scores: list[list[Score]]) -> list[list[Score]]:
    """early_stop_end=batch: a trajectory that never stopped is scored again at the most memory steps any
    trajectory of the batch took (released `InfMem.end`: d = self.step - the first found step); the rest
    keep their Scores. A Score that failed (reward_error) is left as it is."""
    longest = max((memory_steps(t) for g in groups for t in g.trajectories), default=0)
    out = []
    for g, per_group in zip(groups, scores, strict=True):
        row = []
        for traj, score in zip(g.trajectories, per_group, strict=True):
            if (traj.info.get("infmem", {}).get("early_stop_end") == "batch" and not stopped_early(traj)
                    and "reward_error" not in score.metrics and g.task is not None):
                again = reward(g.task, traj, longest)
                score = dataclasses.replace(score, reward=again.reward, metrics={**score.metrics, **again.metrics})
            row.append(score)
        out.append(row)
    return out


def step_rewards(task: Task, traj: Trajectory) -> list[float | None]:
    """Per-call step rewards (for algorithm=rememr1): a memory call earns its memory gain (memrl.rewards.steps),
    the final call 1 for one non-empty \\boxed{}; a plan call none."""
    out: list[float | None] = []
    for seg in traj.segments:
        kind = seg.info.get("kind")
        if kind == "final":
            out.append(steps.format_reward(seg.info.get("answer_text", ""), final=True))
        elif kind == "memory":
            out.append(steps.memory_gain(seg.info.get("memory", ""), seg.info.get("previous_memory"), task.answers))
        else:
            out.append(None)
    return out


def row_columns(traj: Trajectory) -> dict[str, Any]:
    """InfMem's decided actions as evaluation-row columns: its retrievals and where it stopped reading."""
    return {k: traj.metrics[k] for k in ("retrievals", "stopped", "stop_step") if k in traj.metrics}


SPEC = WorkflowSpec(
    "infmem", run, InfMemConfig, reward, step_rewards=step_rewards, batch_scores=batch_scores,
    format_keys=("no_box",), row_columns=row_columns,
    train_defaults={"max_chunks": 8},  # the released config's recurrent.infmem.config.max_chunks
)
"""`workflow=infmem` (registered in memrl.workflows); evaluation is greedy (the spec's default)."""
