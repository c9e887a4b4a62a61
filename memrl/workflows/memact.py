"""MemAct (arXiv 2510.12635): a tool-using agent that curates its own working context.

Each assistant turn sees the working context (system + user, then the kept assistant turns and tool
results) and answers with tool calls (`search`, `prune_context`; at most `max_parallel_calls`; Hermes JSON
or the xml format of qwen3-coder-style templates, `tool_call_format`) or, with no call, the final answer
(`FINAL_ANSWER: ...`). It stops on the answer, after `max_assistant_turns` turns, when the context to send
passes `max_context_tokens`, or after `max_consecutive_invalid_tool_calls` invalid calls in a row.

Token in, token out: the context is a list of messages each holding its ids (memrl.tools.context);
pruning drops messages and concatenates the rest, never re-tokenizing sampled text (turn_tokens=reencoded
and deleted_call_text=cut re-encode turns as the public loop does).

Segments (one training row each): every successful prune closes one. Its row is the working context
just before the deletion, ending with the prune turn's generated ids: prompt = the context up to the first
assistant turn after the previous prune (that turn's role header included), response = the rest; mask 1
only on ids generated in those turns, 0 on tool results and on the headers / end-of-message text we
insert. The final segment covers the turns after the last prune, so no kept turn trains twice (the
public code re-trains kept turns in the final segment: `final_segment=whole_context`). Non-generated tokens carry logprob 0.0, a
placeholder the loss never reads (mask 0). A failed prune changes nothing and closes no segment.
Where the public agent loop's rules differ, MemActConfig's "rollout rules" fields switch to them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from memrl.config import (
    MAX_CHARS,
    MAX_COUNT,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_VOCAB,
    ConfigError,
    check_yaml_text,
    valid,
)
from memrl.data.errors import DataError
from memrl.engines.base import Engine, SamplingParams
from memrl.engines.versioned import VERSION_KEY
from memrl.rewards.judge import ERROR_KINDS, JudgeClient, JudgeSettings
from memrl.rewards.multiq import multiq_reward, published_answer_text
from memrl.services.session import run_with
from memrl.tools import calls as tc
from memrl.tools import context as ctx
from memrl.tools import search as ts
from memrl.types import Score, Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.memagent import decode_response
from memrl.workflows.templates import Template, load_template, template_kwargs

log = logging.getLogger(__name__)

TOOL_RESULT_FORMATS = ("memrl", "published")
TOOL_CALL_FORMATS = ("auto", *tc.CALL_FORMATS)
# The texts of tool_result_format=published (memrl's own wording; the published wording is the user's to
# supply in workflow.tool_texts_file). "{n}": results deleted; "{error}": the retriever's message.
TOOL_TEXTS = {
    "no_results": "No passages found.",
    "missing_query": 'Error: search needs a non-empty string "query".',
    "search_error": "Error: search failed: {error}",
    "prune_done": "Removed {n} tool results. Your memory note stays in your prune_context call above.",
    "prune_no_ids_or_memory": 'prune_context needs a non-empty "memory" and a non-empty "delete_ids".',
    "prune_no_match": "No tool result matched delete_ids. Nothing was removed.",
    "prune_bad_call": "prune_context could not run with these arguments. Nothing was removed.",
}
FINAL_SEGMENTS = ("after_last_prune", "whole_context")
PRUNE_TIMINGS = ("in_order", "first")
TURN_TOKENS = ("sampled", "reencoded")
DELETED_CALL_TEXTS = ("keep", "cut")
ANSWER_SOURCES = ("last_reply", "final_context")
FINAL_MARKER = "FINAL_ANSWER:"
PUBLISHED_FINAL_MARKER = "FINAL_ANSWER: "
COUNTERS = (
    "searches", "search_errors", "prunes", "failed_prunes", "malformed_calls", "unknown_tools",
    "bad_arguments", "dropped_calls", "sanitized_calls", "tool_truncations", "topk_clamped",
    "reencoded_unsampled_tokens", "cut_calls", "invalid_call_streak", "interval_prunes", "tokens_discarded",
)  # fmt: skip


@dataclass
class MemActConfig:
    """MemAct workflow settings, memrl's defaults. The public recipe (arXiv 2510.12635; upstream
    DCPO/scripts/run_dcpo_7B.sh) is the memact_official preset, which also sets the rollout-rule switches
    at the end to their published values."""

    RENAMED: ClassVar[dict[str, str]] = {"judge_url": "judge.url", "judge_model": "judge.model",
                                         "judge_timeout_s": "judge.timeout_s"}

    max_assistant_turns: int = valid(40, ge=1, le=MAX_COUNT)
    """Assistant turns per trajectory."""
    max_turn_tokens: int = valid(2048, ge=1, le=MAX_TOKENS)
    """Generation budget of one assistant turn (the public agent loop: 4096)."""
    max_context_tokens: int = valid(32768, ge=1, le=MAX_TOKENS)
    """Stop before a turn whose working context (prompt) would pass this many tokens."""
    max_tool_response_chars: int = valid(8192, ge=1, le=MAX_CHARS)
    """Tool output longer than this is cut in the middle (head half + marker + tail half)."""
    tool_result_format: str = valid("memrl", choices=TOOL_RESULT_FORMATS)
    """What a tool message holds: "memrl" = "[rK] " then memrl's text (ids r1, r2, ...); "published" (the
    public loop's JSON strings: DCPO/tool_service/search_tool_single.py + verl/tools/utils/
    search_r1_like_utils.py perform_single_search_batch, mem_agent_loop.py prune_actual_messages_prompt_ids)
    = a search: {"success": true, "tool_call_id": ID, "result": [[{"document": {"title", "text"}}, ...]]}
    (or "result": no_results text; a failure {"result": search_error text}; a bad query {"result":
    missing_query text}), \\uXXXX escapes turned back into characters; a prune: {"success": ..., "message":
    ..., "tool_call_id": ID}; ID = 8 hex characters (sha256 of task id and counter: reproducible where the
    public code draws a random short uuid); memrl's own messages (not sent by the public loop) as
    {"result": text}. The texts are tool_texts_file's."""
    tool_texts_file: str | None = None
    """JSON object overriding the texts of tool_result_format=published (memrl.workflows.memact.TOOL_TEXTS:
    no_results, missing_query, search_error ({error}), prune_done ({n}), prune_no_ids_or_memory,
    prune_no_match, prune_bad_call); the published wording is yours to supply."""
    excess_tool_calls: str = valid("reply_error", choices=("reply_error", "drop"))
    """Well-formed calls past max_parallel_calls in one reply: "reply_error" (memrl) answers them with one
    error message; "drop" (published: MemAgentLoop.run runs tool_calls[:max_parallel_calls] only) skips them
    without a word. Counted in dropped_calls either way."""
    tool_parser: str = valid("memrl", choices=tc.PARSERS)
    """How a <tool_call> block is read (memrl.tools.calls): "memrl" recovers what small models emit
    (more invisible characters removed, the first complete JSON object kept, "parameters" accepted for
    "arguments", arguments given as a JSON string decoded, missing or null arguments = {}, the name
    trimmed); "published" (MemAct's tool_parser.py HermesToolParser) = its cleaning (first "{" to last
    "}"), a "name" string used as written and an "arguments" object required, anything else malformed."""
    tool_call_format: str = valid("auto", choices=TOOL_CALL_FORMATS)
    """How the agent writes a call: "hermes" (<tool_call>{"name": ..., "arguments": {...}}</tool_call>),
    "xml" (<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>, the format
    of qwen3-coder-style templates; values converted by the tool's schema) or "auto" (xml when the
    model's chat template writes <function=, else hermes; hermes with tool_parser=published). It also
    picks the wording of the tools block added to templates without tools support."""
    max_consecutive_invalid_tool_calls: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """End the trajectory (stop "invalid_tool_calls", metric stop_invalid_tool_calls) once this many
    calls in a row were invalid: a block that does not parse (an unclosed one included) or a call to a
    tool not offered; a valid call resets the count, in the order the calls were written, and the turn's
    valid calls still run first (verl's max_consecutive_invalid_tool_calls, verl PR #7697). 0 = off.
    invalid_call_streak is the longest run a trajectory had."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch (Qwen3's enable_thinking) for the first prompt and the
    assistant header; None = the template's default. A thinking turn's text stays in the working
    context as sampled (token in, token out)."""
    topk_rule: str = valid("clamp", choices=ts.TOPK_RULES)
    """A search call's topk: "clamp" (memrl) = an integer or digit string clamped to [1, 20], anything else
    an argument error answered to the agent; "published" = the public search tool and service: int() of
    it capped at 20 (true -> 1, 2.9 -> 2), what int() refuses (null, "2.5") -> 5, 0 -> the service's
    default 5 (memrl.tools.search.published_topk); a negative count becomes 1 (not reproduced). Either
    way a changed value is counted in topk_clamped."""
    tool_truncation_marker: str | None = None
    """None (memrl): the head max//2 characters, "\\n...[N characters truncated]...\\n", the rest from the
    tail; a string (published: mem_agent_loop.py MemAgentLoop._call_tool, truncate side "middle"): max//2
    characters from each end around this marker (the memact_official preset gives the published one)."""
    max_parallel_calls: int = valid(5, ge=1, le=MAX_COUNT)
    """Tool calls executed per turn; further well-formed calls are dropped (counted)."""
    no_prune_prob: float = valid(0.5, ge=0, le=1)
    """Probability of withholding prune_context for a trajectory (training; evaluation sets 0)."""
    prune_tool: bool = True
    """False withholds prune_context in every trajectory (the search-only baseline)."""
    prune_every: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """The fixed-interval pruning baseline (MemAct v3's ablation: prune every k turns): before every k-th
    turn the workflow itself removes every tool result in the context (and the assistant turns left without
    results, prune turns kept: memrl.tools.context.prune), closing a segment as a prune does (kind
    "interval_prune", counted in interval_prunes). Combine with prune_tool=false for the rule alone."""
    temperature: float = valid(1.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    top_k: int = valid(-1, ge=-1, le=MAX_VOCAB, note="-1 or 0 = off")
    # ---- retriever and judge wiring (h/mjudge): docs/guides/memact_services.md ----------------------------
    retriever_kind: str = "bm25"
    """bm25 or keyword over retriever_corpus, a name given to register_retriever, or module:attr of a
    class / function marked @memrl.tools.search.retriever_factory (called with the corpus path); any other
    import path is refused before anything is called."""
    retriever_corpus: str | None = None
    """Corpus JSONL ({id, title, text} rows) for an in-process retriever."""
    retriever_url: str | None = None
    """Base URL of a retrieval service (wins over the corpus): `memrl serve retrieval`, or one answering in
    the public MemAct reply shape (documents without id or score; memrl.services.client)."""
    retriever_scope: str = valid("corpus", choices=("corpus", "task"))
    """"corpus": one retriever (retriever_url / retriever_corpus / a registered one) for every task; "task":
    BM25 over the task's own documents, `task.meta["documents"]` (texts or {id, title, text} rows), e.g. a
    HotpotQA question's ten paragraphs or the CPU demo's per-task fact sheet."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    """LLM judge (`workflow.judge.<field>`, memrl.rewards.judge.JudgeSettings): with `judge.url` set, the
    outcome reward is the judge's verdict over the text after FINAL_ANSWER: (1.0 only when CORRECT);
    unset = the rule reward."""
    # ---- end of the retriever and judge block ---------------------------------------------------------
    system_template_file: str | None = None
    """File overriding the system prompt (no placeholders)."""
    system_noprune_template_file: str | None = None
    """File overriding the system prompt used when prune_context is withheld."""
    user_template_file: str | None = None
    """File overriding the user prompt; needs {question} and {answer_format}."""
    system_template: str | None = None
    system_noprune_template: str | None = None
    user_template: str | None = None
    answer_instruction: str | None = None
    """Text put in the user prompt's {answer_format} (None = `answer_format(task)`: the JSON keys spelled out
    for the task's sub-question count). A short one keeps a tiny model's prompt short (the CPU demo)."""

    # --- Rollout rules where memrl differs from the public MemAct agent loop (upstream
    # verl/experimental/agent_loop/mem_agent_loop.py; docs/concepts/memact.md "Rollout switches"). Each default is
    # memrl's rule; the other value is the published one (the memact_official preset sets them all).
    unparsable_tool_calls: str = valid("reply_error", choices=("reply_error", "end"))
    """A reply with <tool_call> blocks: "reply_error" answers every malformed block with an error message
    and the loop goes on; "end" (published) runs only the calls that parse, silently, and a reply none of
    whose calls parse ends the trajectory as its final reply (stop "unparsable_calls")."""
    unknown_tool_calls: str = valid("reply_error", choices=("reply_error", "end"))
    """A call to a tool not offered: "reply_error" answers it with an error message and the loop goes on;
    "end" (published: the tool lookup raises, and any failed call ends the loop) runs the turn's other
    calls, then ends the trajectory with that reply as its last (stop "tool_error")."""
    last_turn_runs_tools: bool = True
    """True: the calls of the last allowed turn (max_assistant_turns) run, a prune there included; False
    (published: the turn limit is checked before any call runs) ends the trajectory on that reply."""
    prune_id_match: str = valid("exact", choices=("exact", "substring"))
    """prune_context's delete_ids: "exact" (every id must be a current result id, else nothing is removed);
    "substring" (published: a result goes when any id occurs in its text, unmatched ids are ignored)."""
    prune_timing: str = valid("in_order", choices=PRUNE_TIMINGS)
    """When a turn's prune_context calls run: "in_order" (memrl) = every call in the order written, so a
    prune may delete a result an earlier call of its own turn just added; "first" (published:
    mem_agent_loop.py MemAgentLoop.run runs the turn's prune calls, then gathers its other calls) = the
    turn's prunes run before its other calls and see only earlier turns' results. The turn's tool messages
    follow the order of the calls either way."""
    prune_turns_deletable: bool = False
    """True (published): an assistant turn holding a prune call goes, memory included, once all its results
    (its prune's own result too) are deleted; False keeps it, so memory notes are never lost."""
    failed_prune_closes_segment: bool = False
    """True (published): every turn with a prune call closes a training segment, also when the prune fails
    (the context is then unchanged); False: only a successful prune closes one."""
    withheld_prune_runs: bool = False
    """True (published): a prune_context call runs even in a trajectory whose prune tool was withheld
    (no_prune_prob / prune_tool=false only hide it from the prompt); False answers it as an unknown tool."""
    answer_source: str = valid("last_reply", choices=ANSWER_SOURCES)
    """Which text the answer is read from: "last_reply" (memrl) = the reply that ended the loop ("" when
    the turns or the context ran out); "final_context" (published: agent_loop.py
    AgentLoopManager.generate_sequences decodes the final row's response ids, special tokens kept) = every
    message of the final working context after the first prompt, decoded with special tokens, so a
    marker in an earlier kept turn or in a tool result counts when the last reply has none. Meant with
    require_final_answer=true (the published reader drops "<|im_end|>")."""
    final_segment: str = valid("after_last_prune", choices=FINAL_SEGMENTS)
    """The trajectory's last training row: "after_last_prune" (memrl) = the turns after the last prune, the
    earlier kept turns its prompt (mask 0), so no turn trains twice; "whole_context" (published: MemAgentLoop.run
    builds the last row with get_trajactories(actual_messages, -1)) = the first prompt, then the whole final
    working context with mask 1 on every kept assistant turn, the turns before the last prune and the
    prune turns holding the memory included (they trained in their own prune rows too)."""
    turn_tokens: str = valid("sampled", choices=TURN_TOKENS)
    """The ids an assistant turn holds in the context and the training rows: "sampled" (memrl) = the ids
    the engine sampled, with its end-of-message text, each tool result rendered on its own; "reencoded"
    (published: mem_agent_loop.py MemAgentLoop.run / get_trajactories re-render every turn through the chat
    template) = the sampled ids but the last (EOS, or a real token when the turn hit max_turn_tokens) decoded
    with special tokens, header + text + end encoded again, the last id dropped (ChatML: the newline after
    <|im_end|>), mask 1 on all after the header; a turn's tool results rendered in one template call (Qwen2.5:
    one user turn). Where the encoded ids leave the sampled ones, the engine's logprob is unknown: 0.0, counted
    in reencoded_unsampled_tokens; training then needs algorithm.old_logprobs=trainer and off_policy=none."""
    deleted_call_text: str = valid("keep", choices=DELETED_CALL_TEXTS)
    """A kept earlier turn some of whose results a prune deleted: "keep" (memrl) = its text stays whole, the
    calls without results included; "cut" (published: mem_agent_loop.py prune_actual_messages_prompt_ids
    removes each deleted call, as restore_as_text writes it back, from the turn's content) = the text of each
    such call is removed where it occurs exactly as memrl.tools.calls.published_call_text writes it, and the
    turn is encoded again (counted in cut_calls); a prune call's text only with prune_turns_deletable=true.
    Needs turn_tokens=reencoded (the cut turn is text the model did not sample)."""

    # ---- data: the row's prompt and the answer format (published layout; docs/DIFFERENCES.md) ----
    prompt_source: str = valid("auto", choices=("auto", "row", "template"))
    """Where the first prompt comes from: "row" = the task's own chat messages (`task.meta["prompt"]`, the
    file row's `prompt`; the published agent loop renders them with the tools through the chat template),
    "template" = memrl's templates above around `task.question`, "auto" = row when the task has messages."""
    require_final_answer: bool = False
    """True: the rule reward (and the judge's input) reads only the text after the last "FINAL_ANSWER: "
    (with the space), "<|im_end|>" removed, and a reply without it scores 0, as the published reward does;
    False (memrl): the text after the last "FINAL_ANSWER:", or the whole reply when it has none."""
    row_noprune_system_cut: str = "# Most important:"
    """prompt_source=row with prune_context withheld: the system message is cut before this text (the
    published loop drops its pruning instructions there); absent from the message = kept whole."""
    row_noprune_user_cut: str = "</developer_message>\n\n"
    """...and the user message keeps only what follows this text (absent = kept whole)."""
    tool_schemas_file: str | None = None
    """JSON or YAML file of the tool schemas the prompt shows, instead of memrl's: a list of OpenAI-style
    schemas, or the published tool config (`tools: [{tool_schema: ...}, ...]`, DCPO/config/*.yaml). It must
    name `search` and `prune_context`; the prompt lists them in the file's order (prune_context left out
    when withheld)."""

    def __post_init__(self) -> None:
        if self.prompt_source not in ("auto", "row", "template"):
            raise ValueError(f"MemActConfig.prompt_source must be auto, row or template, got {self.prompt_source!r}")
        if self.tool_schemas_file is not None:
            load_tool_schemas(self.tool_schemas_file)  # a bad file fails here, by name
        for name in ("max_assistant_turns", "max_turn_tokens", "max_context_tokens", "max_parallel_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"MemActConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.no_prune_prob <= 1.0:
            raise ValueError(f"MemActConfig.no_prune_prob must be in [0, 1], got {self.no_prune_prob}")
        if self.retriever_scope not in ("corpus", "task"):
            raise ValueError(f"MemActConfig.retriever_scope must be corpus or task, got {self.retriever_scope!r}")
        if self.unparsable_tool_calls not in ("reply_error", "end"):
            raise ValueError("MemActConfig.unparsable_tool_calls must be reply_error or end, got "
                             f"{self.unparsable_tool_calls!r}")
        if self.unknown_tool_calls not in ("reply_error", "end"):
            raise ValueError("MemActConfig.unknown_tool_calls must be reply_error or end, got "
                             f"{self.unknown_tool_calls!r}")
        if self.tool_result_format not in TOOL_RESULT_FORMATS:
            raise ValueError(f"MemActConfig.tool_result_format must be one of {', '.join(TOOL_RESULT_FORMATS)}, "
                             f"got {self.tool_result_format!r}")
        load_tool_texts(self.tool_texts_file)  # a bad file fails here, by name
        if self.excess_tool_calls not in ("reply_error", "drop"):
            raise ValueError(f"MemActConfig.excess_tool_calls must be reply_error or drop, got {self.excess_tool_calls!r}")
        if self.tool_parser not in tc.PARSERS:
            raise ValueError(f"MemActConfig.tool_parser must be one of {', '.join(tc.PARSERS)}, got {self.tool_parser!r}")
        if self.tool_call_format not in TOOL_CALL_FORMATS:
            raise ValueError(f"MemActConfig.tool_call_format must be one of {', '.join(TOOL_CALL_FORMATS)}, "
                             f"got {self.tool_call_format!r}")
        if self.tool_call_format == "xml" and self.tool_parser == "published":
            raise ValueError("MemActConfig.tool_parser=published reads Hermes JSON calls only; it cannot be used "
                             "with tool_call_format=xml")
        if self.max_consecutive_invalid_tool_calls < 0:
            raise ValueError("MemActConfig.max_consecutive_invalid_tool_calls must be >= 0 (0 = off), got "
                             f"{self.max_consecutive_invalid_tool_calls}")
        if self.topk_rule not in ts.TOPK_RULES:
            raise ValueError(f"MemActConfig.topk_rule must be one of {', '.join(ts.TOPK_RULES)}, got {self.topk_rule!r}")
        if self.answer_source not in ANSWER_SOURCES:
            raise ValueError(f"MemActConfig.answer_source must be one of {', '.join(ANSWER_SOURCES)}, "
                             f"got {self.answer_source!r}")
        if self.final_segment not in FINAL_SEGMENTS:
            raise ValueError(f"MemActConfig.final_segment must be one of {', '.join(FINAL_SEGMENTS)}, "
                             f"got {self.final_segment!r}")
        if self.turn_tokens not in TURN_TOKENS:
            raise ValueError(f"MemActConfig.turn_tokens must be one of {', '.join(TURN_TOKENS)}, got {self.turn_tokens!r}")
        if self.deleted_call_text not in DELETED_CALL_TEXTS:
            raise ValueError(f"MemActConfig.deleted_call_text must be one of {', '.join(DELETED_CALL_TEXTS)}, "
                             f"got {self.deleted_call_text!r}")
        if self.deleted_call_text == "cut" and self.turn_tokens != "reencoded":
            raise ValueError("MemActConfig.deleted_call_text=cut needs turn_tokens=reencoded (a cut turn is text "
                             f"the model did not sample), got turn_tokens={self.turn_tokens!r}")
        if self.prune_timing not in PRUNE_TIMINGS:
            raise ValueError(f"MemActConfig.prune_timing must be one of {', '.join(PRUNE_TIMINGS)}, got {self.prune_timing!r}")
        if self.prune_id_match not in ("exact", "substring"):
            raise ValueError(f"MemActConfig.prune_id_match must be exact or substring, got {self.prune_id_match!r}")
        if ":" in self.retriever_kind and not self.retriever_url and self.retriever_scope == "corpus":
            ts.resolve_factory(self.retriever_kind)  # an import path is checked now, before anything runs

    def templates(self, prune: bool) -> tuple[Template, Template]:
        if prune:
            system = load_template("memact_system", (), self.system_template_file, self.system_template)
        else:
            system = load_template("memact_system_noprune", (), self.system_noprune_template_file,
                                   self.system_noprune_template)
        user = load_template("memact_user", ("question", "answer_format"), self.user_template_file,
                             self.user_template)
        return system, user

    def sampling(self, rng: random.Random) -> SamplingParams:
        seed = rng.getrandbits(31) if self.temperature > 0 else None
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_turn_tokens, seed=seed)


def answer_format(task: Task) -> str:
    """The answer instruction: a JSON object keyed "1".."k" for k sub-questions, else a short answer."""
    subs = task.meta.get("sub_questions") or []
    if len(subs) > 1:
        keys = ", ".join(f'"{i}": "<answer {i}>"' for i in range(1, len(subs) + 1))
        return (f"Answer all {len(subs)} questions. End with one line: FINAL_ANSWER: {{{keys}}} "
                "(a JSON object; each answer a short phrase).")
    return "End with one line: FINAL_ANSWER: <short answer>."


def default_prompt(task: Task) -> list[dict[str, str]]:
    """The prompt messages memrl writes for a multi-objective task without its own (the `prompt` builder of
    memrl.data.multiobjective's writer): the default system prompt and user prompt, so
    `workflow.prompt_source=auto` then builds the same first prompt as `template`."""
    system, user = MemActConfig().templates(True)
    return [{"role": "system", "content": system.render()},
            {"role": "user", "content": user.render(question=task.question, answer_format=answer_format(task))}]


def final_answer_text(text: str, require_final_answer: bool = False) -> str:
    """The text after the last FINAL_ANSWER: marker ("" when there is none); with require_final_answer,
    what the published reward reads (memrl.rewards.multiq.published_answer_text)."""
    if require_final_answer:
        return published_answer_text(text)
    i = text.rfind(FINAL_MARKER)
    return text[i + len(FINAL_MARKER):].strip() if i >= 0 else ""


# ---- the row's prompt messages (prompt_source) and the tool schemas it shows ----

_TOOL_FILES: dict[str, list[dict[str, Any]]] = {}


def load_tool_texts(path: str | None) -> dict[str, str]:
    """TOOL_TEXTS with a tool_texts_file's overrides (a JSON object of those keys to strings)."""
    texts = dict(TOOL_TEXTS)
    if path is None:
        return texts
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"workflow.tool_texts_file {path}: cannot read it ({e})") from e
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"workflow.tool_texts_file {path}: expected a JSON object of strings")
    unknown = sorted(set(data) - set(TOOL_TEXTS))
    if unknown:
        raise ValueError(f"workflow.tool_texts_file {path}: unknown key(s) {', '.join(unknown)}; "
                         f"known: {', '.join(TOOL_TEXTS)}")
    texts.update(data)
    return texts


def unescape_unicode(text: str) -> str:
    """What the public search tool does to its JSON text (search_tool_single.py): every \\uXXXX escape
    becomes its character, escaped surrogate pairs become one code point."""
    out = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
    try:
        return out.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError:
        return out


def load_tool_schemas(path: str) -> list[dict[str, Any]]:
    """The schemas of a tool_schemas_file (MemActConfig), read once per path; ValueError naming the file."""
    if path in _TOOL_FILES:
        return _TOOL_FILES[path]

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if not path.endswith(".json"):
            check_yaml_text(text, f"workflow.tool_schemas_file {path}")  # an alias bomb refused, not expanded
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except ConfigError:
        raise
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ValueError(f"workflow.tool_schemas_file {path}: cannot read it ({e})") from e
    if isinstance(data, dict) and isinstance(data.get("tools"), list):  # the published tool config
        data = [t.get("tool_schema") if isinstance(t, dict) else None for t in data["tools"]]
    if (not isinstance(data, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in data)):
        raise ValueError(f"workflow.tool_schemas_file {path}: expected a list of tool schemas "
                         "({type: function, function: {name, ...}}) or a tool config with tools[].tool_schema")
    names = [t["function"]["name"] for t in data]
    missing = [n for n in (ts.SEARCH, ts.PRUNE) if n not in names]
    if missing:
        raise ValueError(f"workflow.tool_schemas_file {path}: no schema for {', '.join(missing)} (has {names})")
    _TOOL_FILES[path] = data
    return data


def tool_schemas(cfg: MemActConfig, prune_on: bool) -> list[dict[str, Any]]:
    """The tool schemas the first prompt shows: memrl's, or `cfg.tool_schemas_file`'s in its order."""
    if cfg.tool_schemas_file is None:
        return [ts.SEARCH_SCHEMA] + ([ts.PRUNE_SCHEMA] if prune_on else [])
    return [t for t in load_tool_schemas(cfg.tool_schemas_file) if prune_on or t["function"]["name"] != ts.PRUNE]



def row_prompt(task: Task, cfg: MemActConfig) -> list[dict[str, str]] | None:
    """The task's own prompt messages when they drive the agent (`cfg.prompt_source`), else None."""
    msgs = task.meta.get("prompt")
    if cfg.prompt_source == "template" or (cfg.prompt_source == "auto" and not msgs):
        return None
    if not msgs:  # a data mistake: one line through the rollout runner and the CLI, not a RolloutError
        raise DataError(f"workflow.prompt_source=row: task {task.task_id!r} has no prompt messages (meta.prompt; "
                        "a file row's 'prompt' field, as in the published parquet layout); use such a file "
                        "or workflow.prompt_source=auto")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in msgs]


def noprune_messages(msgs: list[dict[str, str]], cfg: MemActConfig) -> list[dict[str, str]]:
    """The row's messages with the pruning instructions cut out (prune_context withheld), as the published
    loop does: the system message up to `row_noprune_system_cut`, the user message after `row_noprune_user_cut`."""
    out = [dict(m) for m in msgs]
    for m in out:
        if m["role"] == "system" and cfg.row_noprune_system_cut and cfg.row_noprune_system_cut in m["content"]:
            m["content"] = m["content"].split(cfg.row_noprune_system_cut)[0]
        elif m["role"] == "user" and cfg.row_noprune_user_cut and cfg.row_noprune_user_cut in m["content"]:
            m["content"] = m["content"].split(cfg.row_noprune_user_cut)[-1]
    return out


def render_messages(tok: Any, msgs: list[dict[str, str]], tools: list[dict[str, Any]],
                    template_kwargs: dict[str, Any] | None = None, call_format: str = "hermes") -> tuple[str, bool]:
    """(the messages through the chat template with `tools=`, without the generation prompt; whether the
    template took the tools). A template that ignores `tools=` gets the tools block (`call_format`'s
    wording) appended to the system message (one is added first when there is none), as
    memrl.tools.calls.render_system does. `template_kwargs`: extra template variables (enable_thinking)."""
    kw = dict(template_kwargs or {})
    plain = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw)
    try:
        with_tools = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False, **kw)
    except Exception:  # noqa: BLE001 - a template may reject the argument; use the fallback
        with_tools = plain
    if with_tools != plain:
        return with_tools, True
    msgs = [dict(m) for m in msgs]
    block = tc.tools_fallback_text(tools, call_format)
    if msgs[0]["role"] == "system":
        msgs[0]["content"] += block
    else:
        msgs.insert(0, {"role": "system", "content": block.lstrip("\n")})
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw), False


def segment_from(snapshot: list[ctx.Message], since_turn: int, step: int, info: dict) -> Segment | None:
    """The row of the turns after `since_turn` in `snapshot` (module docstring); None if nothing trains."""
    first = next((i for i, m in enumerate(snapshot) if m.kind == "assistant" and m.turn > since_turn), None)
    if first is None:
        return None
    lead = snapshot[first]
    prompt = ctx.context_ids(snapshot[:first]) + lead.ids[: lead.header_len]
    ids, mask, lps = lead.ids[lead.header_len:], lead.mask[lead.header_len:], lead.logprobs[lead.header_len:]
    for m in snapshot[first + 1:]:
        ids, mask, lps = ids + m.ids, mask + m.mask, lps + m.logprobs
    if 1 not in mask:
        return None
    end = len(mask) - mask[::-1].index(1)  # drop what follows the last generated token
    turns = sorted({m.turn for m in snapshot[first:] if m.kind == "assistant"})
    return Segment(prompt_ids=prompt, response_ids=ids[:end], response_logprobs=lps[:end], loss_mask=mask[:end],
                   step=step, info={**info, "turns": turns})


class _Run:
    """State of one trajectory: the messages, counters, segments and result ids."""

    def __init__(self, task: Task, engine: Engine, cfg: MemActConfig, rng: random.Random, services: Any) -> None:
        self.task, self.engine, self.cfg, self.rng = task, engine, cfg, rng
        self.tok = engine.tokenizer
        self.template_kw = template_kwargs(cfg.enable_thinking)
        self.fmt = ctx.ChatFormat.from_tokenizer(self.tok, self.template_kw)
        self.call_format = cfg.tool_call_format
        if self.call_format == "auto":
            self.call_format = "hermes" if cfg.tool_parser == "published" else tc.detect_call_format(self.tok)
        self.prune_on = cfg.prune_tool and not (cfg.no_prune_prob > 0 and rng.random() < cfg.no_prune_prob)
        self.prune_runs = self.prune_on or cfg.withheld_prune_runs  # the tool offered, or run anyway
        self.tools = tool_schemas(cfg, self.prune_on)
        self.schemas = tc.schema_index(self.tools)
        self.invalid_streak = 0  # invalid calls in a row (max_consecutive_invalid_tool_calls)
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.messages: list[ctx.Message] = []
        self.segments: list[Segment] = []
        self.memories: list[str] = []
        self.next_id = 1
        self.published = cfg.tool_result_format == "published"
        self.texts = load_tool_texts(cfg.tool_texts_file) if self.published else TOOL_TEXTS
        self.last_prune_turn = -1
        self.context_lengths: list[int] = []
        self.turn_versions: dict[int, int] = {}  # asynchronous training: turn -> the policy version it ran under
        # the run's retriever (memrl.runtime.Services, built once per run) before the first turn: a missing
        # retriever fails fast, by name
        self.retriever = (ts.task_retriever(task) if cfg.retriever_scope == "task" else
                          services.retriever(cfg.retriever_kind, cfg.retriever_corpus, cfg.retriever_url))
        self.generated = 0  # pruned turns included
        self.tool_failed = False  # unknown_tool_calls=end: a call this turn named no offered tool
        self.reencoded = cfg.turn_tokens == "reencoded"
        self.group_ids: dict[tuple[str, ...], list[int]] = {}  # turn_tokens=reencoded: tool runs' ids

    def count_invalid(self, parsed: tc.ParseResult) -> bool:
        """Update the invalid-call streak over this turn's blocks in the order written (a block that does
        not parse, or a call to a tool not offered, adds one; a valid call resets it); True when it
        reached max_consecutive_invalid_tool_calls."""
        offered = {ts.SEARCH, *([ts.PRUNE] if self.prune_runs else [])}
        calls = iter(parsed.calls)
        for ok in parsed.valid:
            call = next(calls, None) if ok else None  # calls past max_parallel_calls were dropped: valid
            self.invalid_streak = 0 if ok and (call is None or call.name in offered) else self.invalid_streak + 1
            self.counts["invalid_call_streak"] = max(self.counts["invalid_call_streak"], self.invalid_streak)
        cap = self.cfg.max_consecutive_invalid_tool_calls
        return cap > 0 and self.invalid_streak >= cap

    def add_segment(self, seg: Segment) -> None:
        """Append a row; under asynchronous training it carries the oldest policy version of its turns."""
        got = [self.turn_versions[t] for t in seg.info.get("turns", ()) if t in self.turn_versions]
        if got:
            seg.info[VERSION_KEY] = min(got)
        self.segments.append(seg)

    def reencode(self, m: ctx.Message) -> ctx.Message:
        """A turn whose text a prune cut (deleted_call_text=cut), encoded again (ctx.reencoded_assistant)."""
        new, unsampled = ctx.reencoded_assistant(self.tok, self.fmt, m.content or "", m.ids[m.header_len:],
                                                 m.logprobs[m.header_len:], m.turn, m.text)
        new.call_ids, new.has_prune, new.call_texts = m.call_ids, m.has_prune, m.call_texts
        self.counts["reencoded_unsampled_tokens"] += unsampled
        return new

    def regroup_tools(self) -> None:
        """turn_tokens=reencoded: each run of consecutive tool messages rendered in one template call (as the
        published loop renders a turn's results); the run's ids go to its first message, the others hold none."""
        msgs, i = self.messages, 0
        while i < len(msgs):
            j = i
            while j < len(msgs) and msgs[j].kind == "tool":
                j += 1
            if j == i:
                i += 1
                continue
            key = tuple(m.text for m in msgs[i:j])
            if key not in self.group_ids:
                self.group_ids[key] = self.encode(ctx.tool_group_text(self.tok, self.fmt, list(key)))
            for k, m in enumerate(msgs[i:j]):
                m.ids = list(self.group_ids[key]) if k == 0 else []
                m.mask, m.logprobs = [0] * len(m.ids), [0.0] * len(m.ids)
            i = j

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def new_id(self) -> str:
        """The next result id: r1, r2, ... (memrl) or 8 hex characters (tool_result_format=published)."""
        n = self.next_id
        self.next_id += 1
        if self.published:
            return hashlib.sha256(f"{self.task.task_id}:{n}".encode()).hexdigest()[:8]
        return f"r{n}"

    def add_tool(self, turn: int, body: str, owner: ctx.Message, rid: str | None = None,
                 shaped: bool = False) -> str:
        """Append a tool message; `shaped`: `body` is already the published JSON (with `rid` in it)."""
        rid = rid or self.new_id()
        if self.published and not shaped:  # memrl's own messages, which the public loop never sends
            body = json.dumps({"result": body}, ensure_ascii=False)
        body, cut = ts.truncate_middle(body, self.cfg.max_tool_response_chars, self.cfg.tool_truncation_marker)
        self.counts["tool_truncations"] += int(cut)
        content = body if self.published else f"[{rid}] {body}"
        ids = self.encode(self.fmt.tool_prefix + content + self.fmt.tool_suffix)
        self.messages.append(ctx.tool_message(ids, turn, rid, content))
        owner.call_ids.append(rid)
        return rid

    async def call(self, turn: int, call: tc.ToolCall, owner: ctx.Message) -> None:
        if call.name == ts.SEARCH:
            out = await ts.run_search(self.retriever, call.arguments, self.cfg.topk_rule)
            self.counts["searches"] += 1
            self.counts["topk_clamped"] += int(out.clamped)
            if out.error is not None:
                self.counts["search_errors" if out.error == "retrieval" else "bad_arguments"] += 1
            if self.published:
                self.add_published_search(turn, out, owner)
            else:
                self.add_tool(turn, out.text, owner)
        elif call.name == ts.PRUNE and self.prune_runs:
            self.prune(turn, call, owner)
        else:
            self.counts["unknown_tools"] += 1
            if self.cfg.unknown_tool_calls == "end":  # published: ends the trajectory after this turn
                self.tool_failed = True
                return
            names = ", ".join(t["function"]["name"] for t in self.tools)
            self.add_tool(turn, f"Error: unknown tool {call.name!r}; available tools: {names}.", owner)

    def add_published_search(self, turn: int, out: ts.SearchOutcome, owner: ctx.Message) -> None:
        """A search result as the public tool writes it (MemActConfig.tool_result_format)."""
        rid, t = self.new_id(), self.texts
        if out.error == "retrieval":
            body = unescape_unicode(json.dumps({"result": t["search_error"].replace("{error}", out.detail)}))
        elif out.error is not None:
            body = json.dumps({"result": t["missing_query"]}, ensure_ascii=False)
        else:
            result: Any = ([[{"document": {"title": h.document.title, "text": h.document.text}} for h in out.hits]]
                           if out.hits else t["no_results"])
            body = unescape_unicode(json.dumps({"success": True, "tool_call_id": rid, "result": result}))
        self.add_tool(turn, body, owner, rid=rid, shaped=True)

    def prune_reply(self, turn: int, owner: ctx.Message, memrl_text: str, key: str, n: int = 0) -> None:
        """A prune's tool message: memrl's text, or the published JSON with the tool_texts `key`."""
        if not self.published:
            self.add_tool(turn, memrl_text, owner)
            return
        rid = self.new_id()
        message = self.texts[key].replace("{n}", str(n))
        body = json.dumps({"success": key == "prune_done", "message": message, "tool_call_id": rid})
        self.add_tool(turn, body, owner, rid=rid, shaped=True)

    def prune(self, turn: int, call: tc.ToolCall, owner: ctx.Message) -> None:
        memory, ids = call.arguments.get("memory"), call.arguments.get("delete_ids")
        if isinstance(ids, str):
            ids = [ids]
        error = None
        key = "prune_no_match"  # the published text for a prune that removed nothing
        if not isinstance(memory, str) or not memory.strip():
            error = 'prune_context needs a non-empty "memory" string'
            key = "prune_no_ids_or_memory"
        elif not isinstance(ids, list) or not all(isinstance(i, str | int) for i in ids):
            error = 'prune_context needs "delete_ids", a list of result ids'
            key = "prune_no_ids_or_memory" if not ids else "prune_bad_call"
        elif not ids:
            key = "prune_no_ids_or_memory"  # published: `not delete_ids` (memrl: the prune's own error below)
        outcome = None
        snapshot = self.messages[: self.messages.index(owner) + 1]
        if error is None:
            outcome = ctx.prune(self.messages, [str(i) for i in ids],  # type: ignore[union-attr]
                                match=self.cfg.prune_id_match, current_turn=turn,
                                keep_prune_turns=not self.cfg.prune_turns_deletable,
                                cut_call_text=self.cfg.deleted_call_text == "cut")
            error = outcome.error
        if error is not None or outcome is None:
            self.counts["failed_prunes"] += 1
            if self.cfg.failed_prune_closes_segment and self.last_prune_turn < turn:  # published rule
                seg = segment_from(snapshot, self.last_prune_turn, len(self.segments),
                                   {"kind": "failed_prune", "prune_turn": turn})
                if seg is not None:
                    self.add_segment(seg)
                self.last_prune_turn = turn
            self.prune_reply(turn, owner, f"Error: {error}. Nothing was removed.", key)
            return
        seg = segment_from(snapshot, self.last_prune_turn, len(self.segments),
                           {"kind": "prune", "prune_turn": turn, "memory": memory.strip(),
                            "deleted": outcome.removed_results, "removed_turns": outcome.removed_turns,
                            # the viewer's prune record (docs/CONTRACTS.md, trajectory records)
                            "prunes": [{"deleted_ids": outcome.removed_results, "memory": memory.strip()}]})
        if seg is not None:
            self.add_segment(seg)
        self.count_discarded(outcome.messages)
        self.messages = [self.reencode(m) if m.kind == "assistant" and m.turn in outcome.edited_turns else m
                         for m in outcome.messages]
        self.counts["cut_calls"] += len(outcome.edited_turns)
        self.last_prune_turn = turn
        self.counts["prunes"] += 1
        self.memories.append(memory.strip())
        self.prune_reply(turn, owner, f"Removed {', '.join(outcome.removed_results)}. Your memory note stays in "
                                      "your prune_context call above.", "prune_done", len(outcome.removed_results))

    def in_call_order(self, owner: ctx.Message, rids: list[str]) -> None:
        """Put the turn's tool messages (after `owner`) and its call ids in the order of its calls."""
        rank = {rid: n for n, rid in enumerate(rids)}
        at = next(i for i, m in enumerate(self.messages) if m is owner) + 1
        tail = self.messages[at:]
        self.messages[at:] = sorted(tail, key=lambda m: rank.get(m.result_id, len(rank)))
        owner.call_ids.sort(key=lambda rid: rank.get(rid, len(rank)))

    def interval_prune(self, turn: int) -> None:
        """prune_every: remove every tool result before `turn` (MemActConfig.prune_every)."""
        ids = [m.result_id for m in self.messages if m.kind == "tool" and m.result_id]
        if not ids:
            return
        outcome = ctx.prune(self.messages, ids, current_turn=turn,
                            keep_prune_turns=not self.cfg.prune_turns_deletable)
        seg = segment_from(self.messages, self.last_prune_turn, len(self.segments),
                           {"kind": "interval_prune", "prune_turn": turn, "deleted": outcome.removed_results,
                            "removed_turns": outcome.removed_turns,
                            "prunes": [{"deleted_ids": outcome.removed_results, "memory": ""}]})
        if seg is not None:
            self.add_segment(seg)
        self.count_discarded(outcome.messages)
        self.messages = outcome.messages
        self.last_prune_turn = turn - 1
        self.counts["interval_prunes"] += 1

    def count_discarded(self, kept: list[ctx.Message]) -> None:
        ids = {id(m) for m in kept}
        self.counts["tokens_discarded"] += sum(len(m.ids) for m in self.messages if id(m) not in ids)

    def head(self) -> tuple[str, bool]:
        """(text of the first prompt without the assistant header, whether the template took `tools=`)."""
        cfg, task = self.cfg, self.task
        row = row_prompt(task, cfg)
        if row is not None:
            if not self.prune_on:
                row = noprune_messages(row, cfg)
            return render_messages(self.tok, row, self.tools, self.template_kw, self.call_format)
        sys_tpl, user_tpl = cfg.templates(self.prune_on)
        return tc.render_system(
            self.tok, sys_tpl.render(), user_tpl.render(question=task.question, answer_format=(
                cfg.answer_instruction if cfg.answer_instruction is not None else answer_format(task))),
            self.tools, self.template_kw, self.call_format,
        )

    async def run(self) -> Trajectory:
        cfg, task = self.cfg, self.task
        head_text, native = self.head()
        self.messages.append(ctx.head_message(self.encode(head_text), head_text))
        header = self.encode(self.fmt.assistant_header)
        eos = getattr(self.tok, "eos_token_id", None)
        eos_text = self.tok.decode([eos]) if eos is not None else None
        end_full = self.encode(self.fmt.assistant_end)
        end_after_eos = self.encode(self.fmt.assistant_end[len(eos_text):]) if (
            eos_text and self.fmt.assistant_end.startswith(eos_text)) else end_full
        answer_text, stop, turns = "", "max_turns", 0
        for turn in range(cfg.max_assistant_turns):
            if self.reencoded:
                self.regroup_tools()
            if cfg.prune_every and turn > 0 and turn % cfg.prune_every == 0:
                self.interval_prune(turn)
            prompt = ctx.context_ids(self.messages) + header
            if len(prompt) > cfg.max_context_tokens:
                stop = "context_budget"
                break
            self.context_lengths.append(len(prompt))
            out = await self.engine.generate(prompt, cfg.sampling(self.rng))
            if VERSION_KEY in out.info:
                self.turn_versions[turn] = int(out.info[VERSION_KEY])
            turns += 1
            gen = list(out.token_ids)
            self.generated += len(gen)
            text = decode_response(self.tok, gen)
            end = end_after_eos if gen and gen[-1] == eos else end_full
            if self.reencoded:  # published: the turn's text but its last id, encoded again
                owner, unsampled = ctx.reencoded_assistant(
                    self.tok, self.fmt, self.tok.decode(gen[:-1], skip_special_tokens=False), gen,
                    list(out.logprobs), turn, text)
                self.counts["reencoded_unsampled_tokens"] += unsampled
            else:
                owner = ctx.assistant_message(header, gen, list(out.logprobs), end, turn, text)
            self.messages.append(owner)
            parsed = tc.parse_tool_calls(text, cfg.max_parallel_calls, cfg.tool_parser, self.call_format,
                                         self.schemas)
            if not parsed.attempted:
                answer_text, stop = text, "answer"
                break
            self.counts["sanitized_calls"] += parsed.sanitized
            self.counts["malformed_calls"] += len(parsed.errors)
            if turn == cfg.max_assistant_turns - 1 and not cfg.last_turn_runs_tools:
                break  # published: the last turn's calls never run (stop stays "max_turns")
            silent = cfg.unparsable_tool_calls == "end"  # published: malformed blocks get no reply
            if silent and not parsed.calls:  # ... and a reply with none that parse ends the trajectory
                answer_text, stop = text, "unparsable_calls"
                break
            owner.has_prune = self.prune_runs and any(c.name == ts.PRUNE for c in parsed.calls)
            order = list(range(len(parsed.calls)))
            if cfg.prune_timing == "first":  # published: the turn's prunes, then its other calls
                order.sort(key=lambda k: parsed.calls[k].name != ts.PRUNE)
            made: dict[int, list[str]] = {}  # call index -> the result ids its tool messages got
            for k in order:
                c = parsed.calls[k]
                before = len(owner.call_ids)
                await self.call(turn, c, owner)
                made[k] = owner.call_ids[before:]
                if cfg.deleted_call_text == "cut" and (c.name != ts.PRUNE or cfg.prune_turns_deletable):
                    owner.call_texts.update(dict.fromkeys(made[k], tc.published_call_text(c)))
            if order != sorted(order):
                self.in_call_order(owner, [rid for k in sorted(made) for rid in made[k]])
            for err in [] if silent else parsed.errors:
                self.add_tool(turn, f"Error: {err}. Write each call as {tc.call_example(self.call_format)}.", owner)
            if parsed.dropped:
                self.counts["dropped_calls"] += parsed.dropped
            if parsed.dropped and cfg.excess_tool_calls == "reply_error":
                self.add_tool(turn, f"Error: at most {cfg.max_parallel_calls} tool calls run per turn; "
                                    f"{parsed.dropped} more were not run.", owner)
            if self.tool_failed:
                answer_text, stop = text, "tool_error"
                break
            if self.count_invalid(parsed):  # after the turn's valid calls ran
                answer_text, stop = text, "invalid_tool_calls"
                break
        if self.reencoded:
            self.regroup_tools()
        since = -1 if cfg.final_segment == "whole_context" else self.last_prune_turn
        final = segment_from(self.messages, since, len(self.segments), {"kind": "final"})
        if final is not None:
            self.add_segment(final)
        if turns == 0:  # the very first prompt is over the budget: counted, no segment, no answer
            log.warning("memact: task %s: the first prompt (%d tokens) is over max_context_tokens=%d",
                        task.task_id, len(ctx.context_ids(self.messages)) + len(header), cfg.max_context_tokens)
        read = answer_text
        if cfg.answer_source == "final_context":  # published: the decoded final row, special tokens kept
            read = self.tok.decode(ctx.context_ids(self.messages[1:]), skip_special_tokens=False)
        n = len(self.context_lengths)
        metrics = {
            "turns": float(turns),
            "generated_tokens": float(self.generated),
            "mean_context_tokens": sum(self.context_lengths) / n if n else 0.0,
            "peak_context_tokens": float(max(self.context_lengths, default=0)),
            "context_tokens": float(max(self.context_lengths, default=0)),  # the eval table's column: the peak
            "final_context_tokens": float(len(ctx.context_ids(self.messages))),
            "prune_withheld": float(not self.prune_on),
            "native_tools_template": float(native),
            "stop_answer": float(stop == "answer"),
            "stop_max_turns": float(stop == "max_turns"),
            "stop_context_budget": float(stop == "context_budget"),
            "stop_unparsable_calls": float(stop == "unparsable_calls"),
            "stop_tool_error": float(stop == "tool_error"),
            "stop_invalid_tool_calls": float(stop == "invalid_tool_calls"),
            "xml_tool_calls": float(self.call_format == "xml"),
            "no_final_marker": float((PUBLISHED_FINAL_MARKER if cfg.require_final_answer else FINAL_MARKER)
                                     not in read),
            "segments": float(len(self.segments)),
            **{k: float(v) for k, v in self.counts.items()},
        }
        return Trajectory(
            task_id=task.task_id, trajectory_id="", segments=self.segments,
            final_answer=final_answer_text(read, cfg.require_final_answer), metrics=metrics,
            # answer_text: the text the answer is read from (the rule reward reads it too)
            info={"answer_text": read, "memories": self.memories, "stop": stop,
                  **({"last_reply": answer_text} if cfg.answer_source == "final_context" else {}),
                  "require_final_answer": cfg.require_final_answer,
                  # what the reward's judge call needs (no secret: the key stays in its environment variable)
                  **({"judge_settings": dataclasses.asdict(cfg.judge)} if cfg.judge.url else {}),
                  "transcript": [{"kind": m.kind, "turn": m.turn, "id": m.result_id, "text": m.text}
                                 for m in self.messages]},
        )


async def run(task: Task, engine: Engine, cfg: MemActConfig, rng: random.Random,
              services: Any = None) -> Trajectory:
    """One MemAct trajectory for `task` (module docstring); generation only (the judge is the reward's).
    `services`: the run's memrl.runtime.Services (its retriever); None = a Services for this call alone."""
    return await run_with(services, lambda s: _Run(task, engine, cfg, rng, s).run())


async def judge_score(task: Task, traj: Trajectory, on_failure: str, client: Any) -> Score:
    """The judge's verdict on the final answer as a Score: reward = its score (1.0 only when CORRECT),
    info["judge"] = {score, verdict, error}, metrics judge_correct / judge_error / judge_error_<kind> /
    judge_excluded. A failed call scores 0 and is counted (memrl.rewards.judge never raises); with
    judge.on_failure=exclude it also sets info["exclude_from_group"]."""
    multi = len(task.meta.get("sub_questions", [])) > 1
    gold = [json.dumps(task.answers, ensure_ascii=False)] if multi else list(task.answers)
    if isinstance(task.meta.get("ground_truth"), str):  # a file row's ground truth, verbatim (Q-keyed JSON)
        gold = [task.meta["ground_truth"]]
    res = await client.judge(task.question, gold, traj.final_answer)
    excluded = res.error is not None and on_failure == "exclude"
    metrics = {"judge_error": float(res.error is not None),
               **{f"judge_error_{k}": float(res.error == k) for k in ERROR_KINDS},
               "judge_correct": float(res.verdict == "correct"), "judge_excluded": float(excluded)}
    info: dict[str, Any] = {"judge": {"score": res.score, "verdict": res.verdict, "error": res.error}}
    if excluded:
        info["exclude_from_group"] = True
    return Score(float(res.score), metrics=metrics, info=info)


def reward(task: Task, traj: Trajectory, services: Any = None) -> float | Awaitable[Score]:
    """Outcome reward: 1.0 only when every sub-question is answered right (memrl.rewards.multiq; its
    metrics are written either way), a float; with `judge.url` (traj.info["judge_settings"], the config's
    JudgeSettings as a dict) instead an awaitable of the judge's verdict as a memrl.types.Score (with its
    metrics and info; a failed judgement scores 0), through the run's judge client (`services.judge`)."""
    rule = multiq_reward(task, traj)
    settings = traj.info.get("judge_settings")
    if not settings or not settings.get("url"):
        return rule
    return _judged(task, traj, settings, services)


async def _judged(task: Task, traj: Trajectory, settings: dict[str, Any], services: Any) -> Score:
    on_failure = str(settings.get("on_failure", "zero"))
    if services is not None:
        return await judge_score(task, traj, on_failure, services.judge(settings))

    client = JudgeClient(JudgeSettings(**settings))  # outside a run: its own client, closed here
    try:
        return await judge_score(task, traj, on_failure, client)
    finally:
        await client.close()


SPEC = WorkflowSpec(
    "memact", run, MemActConfig, reward,
    format_keys=("no_final_marker", "malformed_calls", "answer_unparsed"),
    eval_defaults={"temperature": 0.0, "no_prune_prob": 0.0},  # greedy, and the prune tool always offered
)
