"""The full-context baseline: the whole document in one prompt, centre-truncated to
`max_context_tokens`, answered in `\\boxed{}` (workflow name "full_context")."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_TEMPERATURE, MAX_TOKENS, valid
from memrl.engines.base import SamplingParams
from memrl.quiet import encode_document
from memrl.rewards.qa import extract_boxed
from memrl.types import Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec, boxed_em_outcome
from memrl.workflows.chunked import centre_truncate, decode_response
from memrl.workflows.templates import chat_prompt, load_template

FULL_CONTEXT_TEMPLATE = """You are given a problem and a long document. Read the document, then answer the problem and put the final answer inside \\boxed{{}}.

<problem>
{problem}
</problem>

<document>
{context}
</document>

Answer:""".replace("{{}}", "{}")


@dataclass
class FullContextConfig:
    """The full-context baseline: whole document in one prompt, truncated in the middle to a budget."""

    max_context_tokens: int = valid(120_000, ge=1, le=MAX_TOKENS)
    """Document tokens kept (head half + tail half); the rest of the model window is prompt + answer."""
    fit_window: bool = True
    """Keep fewer document tokens where the engine's window (its max_positions; the hf engine declares one)
    could not hold the prompt plus max_final_tokens, so a long document is truncated in the middle to the
    model's window instead of failing. False = max_context_tokens alone (a prompt past the window is the
    engine's error)."""
    max_final_tokens: int = valid(1024, ge=1, le=MAX_TOKENS)
    temperature: float = valid(0.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    template: str | None = None
    """Inline prompt with {problem} and {context} (default: a boxed-answer prompt)."""
    template_file: str | None = None
    enable_thinking: bool | None = None
    """The chat template's thinking switch (Qwen3's enable_thinking); None = the template's default."""
    reward: str = "boxed_em"
    """Outcome verifier, as the chunked workflows' `reward`: a name in memrl.rewards.verifiers (boxed_em,
    verl_hotpotqa, published_box_f1, format_f1, box_weighted_f1) or package.module:fn, a function marked with
    @memrl.rewards.verifiers.verifier."""


async def run(task: Task, engine: Any, cfg: FullContextConfig, rng: random.Random) -> Trajectory:
    """Baseline: one call with the (centre-truncated) whole document; the answer is the last \\boxed{}."""
    tok = engine.tokenizer
    tpl = load_template("full_context", ("problem", "context"), cfg.template_file,
                        cfg.template if cfg.template is not None or cfg.template_file else FULL_CONTEXT_TEMPLATE)

    ids = encode_document(tok, task.context) if task.context else []  # centre-truncated below
    budget = cfg.max_context_tokens
    kept = centre_truncate(ids, budget)
    _, prompt_ids = chat_prompt(tok, tpl.render(problem=task.question, context=tok.decode(kept)), cfg.enable_thinking)
    window = getattr(engine, "max_positions", None) if cfg.fit_window else None
    while window and len(prompt_ids) + cfg.max_final_tokens > window and kept:
        # the text around the document and re-encoding at its edges cost tokens: cut the excess and retry
        budget = max(0, len(kept) - (len(prompt_ids) + cfg.max_final_tokens - window))
        kept = centre_truncate(ids, budget) if budget else []
        _, prompt_ids = chat_prompt(tok, tpl.render(problem=task.question, context=tok.decode(kept)), cfg.enable_thinking)
    seed = rng.getrandbits(31) if cfg.temperature > 0 else None
    sp = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_final_tokens, seed=seed)
    out = await engine.generate(prompt_ids, sp)
    text = decode_response(tok, out.token_ids)
    boxed = extract_boxed(text)
    seg = Segment(prompt_ids=prompt_ids, response_ids=list(out.token_ids), response_logprobs=list(out.logprobs),
                  info={"kind": "final", "answer_text": text, "prediction": boxed or "",
                        "finish_reason": out.finish_reason})
    metrics = {"context_tokens": float(len(ids)), "tokens_read": float(len(kept)),
               "truncated": float(len(kept) < len(ids)), "no_box": float(boxed is None),
               "generated_tokens": float(len(out.token_ids))}
    return Trajectory(task.task_id, "", [seg], final_answer=boxed or "", metrics=metrics,
                      info={"answer_text": text, "memories": [], "reward": cfg.reward})


SPEC = WorkflowSpec("full_context", run, FullContextConfig, boxed_em_outcome, format_keys=("no_box",))
