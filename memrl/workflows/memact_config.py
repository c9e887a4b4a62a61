"""MemAct's settings (`workflow=memact`): MemActConfig, the tool-result texts of the published format and the
tool schemas a file supplies (read and checked when the config is built, so a bad file fails by name)."""

from __future__ import annotations

import json
import random
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
from memrl.engines.base import SamplingParams
from memrl.rewards.judge import JudgeSettings
from memrl.tools import calls as tc
from memrl.tools import search as ts
from memrl.workflows.templates import Template, load_template

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
    """JSON object overriding the texts of tool_result_format=published (memrl.workflows.memact_config.TOOL_TEXTS:
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
