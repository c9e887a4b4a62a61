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

Its settings are memrl.workflows.memact_config, its first prompt from a row memrl.workflows.memact_prompt, its
answer format and outcome reward (rule or judge) memrl.rewards.multiq.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
from typing import Any

from memrl.engines.base import Engine
from memrl.engines.versioned import VERSION_KEY
from memrl.quiet import encode_pieces, encode_rendered
from memrl.rewards import multiq
from memrl.rewards.multiq import MARKER, PUBLISHED_MARKER, answer_format, final_answer_text, outcome_reward
from memrl.services.session import run_with
from memrl.tools import calls as tc
from memrl.tools import context as ctx
from memrl.tools import search as ts
from memrl.types import Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.chunked import decode_response
from memrl.workflows.memact_config import COUNTERS, TOOL_TEXTS, MemActConfig, load_tool_texts, tool_schemas
from memrl.workflows.memact_prompt import noprune_messages, render_messages, row_prompt, unescape_unicode
from memrl.workflows.memact_report import REPORT
from memrl.workflows.templates import template_kwargs

log = logging.getLogger(__name__)

STOPS = ("answer", "max_turns", "context_budget", "unparsable_calls", "tool_error", "invalid_tool_calls")
"""Why a trajectory's turns stopped (its `stop` info; a stop_<why> metric each, in this order)."""


def default_prompt(task: Task) -> list[dict[str, str]]:
    """The prompt messages memrl writes for a multi-objective task without its own (the `prompt` builder of
    memrl.data.multiobjective's writer): the default system prompt and user prompt, so
    `workflow.prompt_source=auto` then builds the same first prompt as `template`."""
    system, user = MemActConfig().templates(True)
    return [{"role": "system", "content": system.render()},
            {"role": "user", "content": user.render(question=task.question, answer_format=answer_format(task))}]


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
        # the run's retriever (memrl.services.session.Services, built once per run) before the first turn: a missing
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
                self.group_ids[key] = encode_rendered(  # the results as plain text
                    self.tok, list(key), lambda v: ctx.tool_group_text(self.tok, self.fmt, v))[1]
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
        # a tool result (retrieved passages) as plain text: a control token's text in it is never a control id
        ids = encode_pieces(self.tok, [(self.fmt.tool_prefix, False), (content, True), (self.fmt.tool_suffix, False)])
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

    def head(self) -> tuple[str, bool, list[int]]:
        """(text of the first prompt without the assistant header, whether the template took `tools=`, its ids:
        the messages' text, a row's and the question included, as plain text, memrl.quiet.encode_rendered)."""
        cfg, task = self.cfg, self.task
        row = row_prompt(task, cfg)
        if row is not None:
            if not self.prune_on:
                row = noprune_messages(row, cfg)

            def render(contents: list[str]) -> tuple[str, bool]:
                msgs = [{**m, "content": c} for m, c in zip(row, contents, strict=True)]
                return render_messages(self.tok, msgs, self.tools, self.template_kw, self.call_format)

            values = [m["content"] for m in row]
        else:
            sys_tpl, user_tpl = cfg.templates(self.prune_on)
            values = [sys_tpl.render(), user_tpl.render(question=task.question, answer_format=(
                cfg.answer_instruction if cfg.answer_instruction is not None else answer_format(task)))]

            def render(contents: list[str]) -> tuple[str, bool]:
                return tc.render_system(self.tok, contents[0], contents[1], self.tools, self.template_kw,
                                        self.call_format)

        text, ids = encode_rendered(self.tok, values, lambda v: render(v)[0])
        return text, render(values)[1], ids

    async def run(self) -> Trajectory:
        """The trajectory: the first prompt, the turns, the final row, what it read and its metrics."""
        head_text, native, head_ids = self.head()
        self.messages.append(ctx.head_message(head_ids, head_text))
        self.header = self.encode(self.fmt.assistant_header)
        self.eos = getattr(self.tok, "eos_token_id", None)
        eos_text = self.tok.decode([self.eos]) if self.eos is not None else None
        self.end_full = self.encode(self.fmt.assistant_end)  # a turn's end, and after a sampled eos its rest
        self.end_after_eos = self.encode(self.fmt.assistant_end[len(eos_text):]) if (
            eos_text and self.fmt.assistant_end.startswith(eos_text)) else self.end_full
        answer_text, stop, turns = await self.turns()
        if self.reencoded:
            self.regroup_tools()
        since = -1 if self.cfg.final_segment == "whole_context" else self.last_prune_turn
        final = segment_from(self.messages, since, len(self.segments), {"kind": "final"})
        if final is not None:
            self.add_segment(final)
        if turns == 0:  # the very first prompt is over the budget: counted, no segment, no answer
            log.warning("memact: task %s: the first prompt (%d tokens) is over max_context_tokens=%d",
                        self.task.task_id, len(ctx.context_ids(self.messages)) + len(self.header),
                        self.cfg.max_context_tokens)
        return self.trajectory(answer_text, stop, turns, native)

    async def turns(self) -> tuple[str, str, int]:
        """The assistant turns until one answers or something ends the trajectory: (the last reply's text where
        it ended the loop, why it stopped, turns generated)."""
        cfg = self.cfg
        answer_text, stop, turns = "", "max_turns", 0
        for turn in range(cfg.max_assistant_turns):
            if self.reencoded:
                self.regroup_tools()
            if cfg.prune_every and turn > 0 and turn % cfg.prune_every == 0:
                self.interval_prune(turn)
            prompt = ctx.context_ids(self.messages) + self.header
            if len(prompt) > cfg.max_context_tokens:
                stop = "context_budget"
                break
            self.context_lengths.append(len(prompt))
            owner, text = await self.generate(turn, prompt)
            turns += 1
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
            await self.run_calls(turn, owner, parsed, silent)
            if self.tool_failed:
                answer_text, stop = text, "tool_error"
                break
            if self.count_invalid(parsed):  # after the turn's valid calls ran
                answer_text, stop = text, "invalid_tool_calls"
                break
        return answer_text, stop, turns

    async def generate(self, turn: int, prompt: list[int]) -> tuple[ctx.Message, str]:
        """One assistant turn sampled on `prompt` and appended to the messages: (its message, its text)."""
        out = await self.engine.generate(prompt, self.cfg.sampling(self.rng))
        if VERSION_KEY in out.info:
            self.turn_versions[turn] = int(out.info[VERSION_KEY])
        gen = list(out.token_ids)
        self.generated += len(gen)
        text = decode_response(self.tok, gen)
        if self.reencoded:  # published: the turn's text but its last id, encoded again
            owner, unsampled = ctx.reencoded_assistant(
                self.tok, self.fmt, self.tok.decode(gen[:-1], skip_special_tokens=False), gen,
                list(out.logprobs), turn, text)
            self.counts["reencoded_unsampled_tokens"] += unsampled
        else:
            end = self.end_after_eos if gen and gen[-1] == self.eos else self.end_full
            owner = ctx.assistant_message(self.header, gen, list(out.logprobs), end, turn, text)
        self.messages.append(owner)
        return owner, text

    async def run_calls(self, turn: int, owner: ctx.Message, parsed: tc.ParseResult, silent: bool) -> None:
        """The turn's parsed calls run (prunes first under prune_timing=first, results kept in call order), then
        the replies to its malformed (unless `silent`) and dropped calls."""
        cfg = self.cfg
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

    def trajectory(self, answer_text: str, stop: str, turns: int, native: bool) -> Trajectory:
        """The Trajectory: its answer (read from the last reply, or the final context), metrics and info."""
        cfg, task = self.cfg, self.task
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
            **{f"stop_{s}": float(stop == s) for s in STOPS},
            "xml_tool_calls": float(self.call_format == "xml"),
            "no_final_marker": float((PUBLISHED_MARKER if cfg.require_final_answer else MARKER)
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
    `services`: the run's memrl.services.session.Services (its retriever); None = a Services for this call alone."""
    return await run_with(services, lambda s: _Run(task, engine, cfg, rng, s).run())


SPEC = WorkflowSpec(
    "memact", run, MemActConfig, outcome_reward,
    format_keys=("no_final_marker", "malformed_calls", "answer_unparsed"),
    eval_defaults={"temperature": 0.0, "no_prune_prob": 0.0},  # greedy, and the prune tool always offered
    report=REPORT,  # the MemAct table in `memrl eval`'s report (memrl.workflows.memact_report)
    row_columns=multiq.row_columns,  # all sub-questions right, mean sub-question F1, what the model generated
)
