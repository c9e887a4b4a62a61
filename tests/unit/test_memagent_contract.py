"""Contract tests: the MemAgent workflow against a scripted engine with a character tokenizer.

With one token per character, chunk boundaries and prompts can be written out by hand.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from doubles import CharTokenizer, ScriptedEngine

from memrl.runtime import rollout_once
from memrl.types import Task
from memrl.workflows import get_workflow
from memrl.workflows.chunked import centre_truncate, chunk_context
from memrl.workflows.memagent import MemAgentConfig, run
from memrl.workflows.templates import TemplateError

MEM_TPL = "P:{problem}|M:{memory}|C:{chunk}"
FIN_TPL = "P:{problem}|M:{memory}|answer:"


def cfg(**kw) -> MemAgentConfig:
    base = dict(chunk_tokens=4, max_memory_tokens=20, max_final_tokens=20, temperature=0.0,
                memory_template=MEM_TPL, final_template=FIN_TPL)
    base.update(kw)
    return MemAgentConfig(**base)


def user(text: str) -> str:
    return f"<user>{text}</user><assistant>"


def run_one(task: Task, engine: ScriptedEngine, c: MemAgentConfig):
    return asyncio.run(run(task, engine, c, random.Random(0)))


def test_exact_prompts_memory_overwrite_and_final_segment():
    # context "abcdefghij" = 10 chars = 10 tokens -> chunks "abcd", "efgh", "ij" (3 memory calls + final)
    task = Task("t1", "Q?", "abcdefghij", ["x"])
    engine = ScriptedEngine(["m1", "m2", "m3", r"so \boxed{x}"])
    traj = run_one(task, engine, cfg())

    prompts = [c.prompt_text for c in engine.calls]
    assert prompts == [
        user("P:Q?|M:No previous memory|C:abcd"),
        user("P:Q?|M:m1|C:efgh"),  # the memory is overwritten wholesale, never appended
        user("P:Q?|M:m2|C:ij"),
        user("P:Q?|M:m3|answer:"),
    ]
    assert [s.step for s in traj.segments] == [0, 1, 2, 3]
    assert [s.info["kind"] for s in traj.segments] == ["memory", "memory", "memory", "final"]
    assert [s.info["memory"] for s in traj.segments] == ["m1", "m2", "m3", "m3"]
    assert [s.info["previous_memory"] for s in traj.segments[:3]] == ["No previous memory", "m1", "m2"]
    # token in, token out: the segment holds the engine's ids (reply + EOS) and logprobs
    tok = CharTokenizer()
    assert traj.segments[0].response_ids == tok.encode("m1") + [tok.eos_token_id]
    assert traj.segments[0].response_logprobs == [-0.5, -0.5, -0.5]
    assert traj.segments[0].loss_mask == [1, 1, 1]
    assert traj.segments[0].prompt_ids == tok.encode(prompts[0])
    final = traj.segments[-1]
    assert final.info["answer_text"] == r"so \boxed{x}"
    assert final.info["prediction"] == "x"
    assert traj.final_answer == "x"
    assert traj.metrics["num_chunks"] == 3.0
    assert traj.metrics["tokens_read"] == 10.0
    # 3 memory calls + the final (InfMem's metrics by the same names: the reading summary's calls, chunks read)
    assert (traj.metrics["model_calls"], traj.metrics["memory_steps"]) == (4.0, 3.0)
    assert traj.metrics["no_box"] == 0.0
    # greedy: sampling carries no seed; budgets come from the config
    assert [c.sampling.max_tokens for c in engine.calls] == [20, 20, 20, 20]
    assert all(c.sampling.temperature == 0 for c in engine.calls)


def test_empty_generated_memory_falls_back_to_placeholder():
    task = Task("t1", "Q?", "abcdefgh", ["x"])
    engine = ScriptedEngine(["", "  ", r"\boxed{y}"])
    traj = run_one(task, engine, cfg())
    assert engine.calls[1].prompt_text == user("P:Q?|M:No previous memory|C:efgh")
    assert engine.calls[2].prompt_text == user("P:Q?|M:No previous memory|answer:")
    assert traj.metrics["empty_memories"] == 2.0


def test_memory_is_capped_at_max_memory_tokens():
    task = Task("t1", "Q?", "abcd", ["x"])
    engine = ScriptedEngine(["0123456789", r"\boxed{x}"])
    traj = run_one(task, engine, cfg(max_memory_tokens=5))
    assert traj.segments[0].info["memory"] == "01234"
    assert traj.segments[0].info["finish_reason"] == "length"
    assert engine.calls[1].prompt_text == user("P:Q?|M:01234|answer:")


def test_empty_context_answers_from_placeholder_memory():
    task = Task("t1", "Q?", "", ["x"])
    engine = ScriptedEngine([r"\boxed{x}"])
    traj = run_one(task, engine, cfg())
    assert len(traj.segments) == 1
    assert engine.calls[0].prompt_text == user("P:Q?|M:No previous memory|answer:")
    assert traj.metrics["num_chunks"] == 0.0


def test_context_shorter_than_one_chunk_is_one_memory_call():
    task = Task("t1", "Q?", "ab", ["x"])
    engine = ScriptedEngine(["m", r"\boxed{x}"])
    traj = run_one(task, engine, cfg(chunk_tokens=100))
    assert [c.prompt_text for c in engine.calls] == [user("P:Q?|M:No previous memory|C:ab"), user("P:Q?|M:m|answer:")]
    assert len(traj.segments) == 2


def test_model_that_never_closes_its_box_gets_no_prediction_and_zero_reward():
    task = Task("t1", "Q?", "ab", ["x"])
    engine = ScriptedEngine(["m", r"the answer is \boxed{x"])
    spec = get_workflow("memagent")
    groups = rollout_once([task], spec, engine, cfg(), n=1)
    traj = groups[0].trajectories[0]
    assert traj.final_answer == ""
    assert traj.metrics["no_box"] == 1.0
    assert traj.reward == 0.0


def test_centre_truncation_keeps_head_and_tail():
    assert centre_truncate(list(range(10)), 5) == [0, 1, 2, 8, 9]
    assert centre_truncate(list(range(10)), 4) == [0, 1, 8, 9]
    assert centre_truncate(list(range(3)), 5) == [0, 1, 2]
    assert centre_truncate(list(range(3)), 0) == [0, 1, 2]
    chunks, truncated = chunk_context(list(range(10)), chunk_tokens=2, max_chunks=2)
    assert chunks == [[0, 1], [8, 9]] and truncated
    chunks, truncated = chunk_context(list(range(5)), chunk_tokens=2, max_chunks=0)
    assert chunks == [[0, 1], [2, 3], [4]] and not truncated


def test_max_chunks_truncates_the_middle_of_the_context():
    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # 12 tokens, cap 2 chunks of 4 -> "abcd" + "ijkl"
    engine = ScriptedEngine(["m1", "m2", r"\boxed{x}"])
    traj = run_one(task, engine, cfg(max_chunks=2))
    assert [c.prompt_text for c in engine.calls[:2]] == [
        user("P:Q?|M:No previous memory|C:abcd"), user("P:Q?|M:m1|C:ijkl")]
    assert traj.metrics["truncated"] == 1.0 and traj.metrics["context_tokens"] == 12.0


def test_template_file_with_missing_placeholder_names_it(tmp_path):
    bad = tmp_path / "mem.txt"
    bad.write_text("P:{problem}|M:{memory}\n")  # no {chunk}
    with pytest.raises(TemplateError, match=r"mem\.txt is missing placeholder\(s\) \{chunk\}"):
        MemAgentConfig(memory_template_file=str(bad)).templates()
    with pytest.raises(TemplateError, match="cannot read template file"):
        MemAgentConfig(final_template_file=str(tmp_path / "nope.txt")).templates()


def test_template_file_overrides_the_prompt(tmp_path):
    f = tmp_path / "fin.txt"
    f.write_text("FINAL {problem} / {memory} \\boxed{}\n")
    task = Task("t1", "Q?", "", ["x"])
    engine = ScriptedEngine([r"\boxed{x}"])
    run_one(task, engine, cfg(final_template=None, final_template_file=str(f)))
    # the file's text exactly: its final newline is part of the prompt (template_strip=False)
    assert engine.calls[0].prompt_text == user("FINAL Q? / No previous memory \\boxed{}\n")
    engine = ScriptedEngine([r"\boxed{x}"])
    run_one(task, engine, cfg(final_template=None, final_template_file=str(f), template_strip=True))
    assert engine.calls[0].prompt_text == user("FINAL Q? / No previous memory \\boxed{}")  # memrl's former reading


def test_default_templates_keep_the_published_tags():
    mem, fin = MemAgentConfig().templates()
    text = mem.render(problem="Q", memory="M", chunk="C")
    for tag in ("<problem>\nQ\n</problem>", "<memory>\nM\n</memory>", "<section>\nC\n</section>"):
        assert tag in text
    assert "\\boxed{}" in fin.render(problem="Q", memory="M")


def test_rollout_groups_ids_rewards_and_seeds():
    tasks = [Task("a", "Q?", "abcd", ["x"]), Task("b", "Q?", "abcd", ["y"])]
    engine = ScriptedEngine(lambda prompt, i: r"\boxed{x}" if "answer:" in prompt else "m")
    spec = get_workflow("memagent")
    groups = rollout_once(tasks, spec, engine, cfg(temperature=1.0), n=3, concurrency=4, seed=7)
    assert [g.task_id for g in groups] == ["a", "b"]
    assert [t.trajectory_id for t in groups[0].trajectories] == ["a#0", "a#1", "a#2"]
    assert groups[0].rewards == [1.0, 1.0, 1.0] and groups[1].rewards == [0.0, 0.0, 0.0]
    assert all(s.trajectory_id == "b#2" and s.task_id == "b" for s in groups[1].trajectories[2].segments)
    seeds = [c.sampling.seed for c in engine.calls]
    assert all(s is not None for s in seeds) and len(set(seeds)) == len(seeds)
    assert len(engine.calls) == 2 * 3 * 2


def test_memagent_reward_writes_memory_gain_step_rewards():
    from memrl.types import Segment, Trajectory
    from memrl.workflows import get_workflow

    def seg(step, **info):
        return Segment(prompt_ids=[1], response_ids=[2], response_logprobs=[0.0], step=step, info=info)

    task = Task("t", "what is Kalo", "ctx", ["deep red"])
    traj = Trajectory("t", "t#0", [
        seg(0, kind="memory", previous_memory="No previous memory", memory="- Kalo is red"),   # +1/2
        seg(1, kind="memory", previous_memory="- Kalo is red", memory="- Kalo is deep red"),    # +1/2
        seg(2, kind="memory", previous_memory="- Kalo is deep red", memory="- Miran is blue"),  # -1
        seg(3, kind="final", memory="- Miran is blue", answer_text="\\boxed{blue} \\boxed{x}"),  # two boxes: 0
    ], info={"answer_text": "\\boxed{blue} \\boxed{x}"})
    spec = get_workflow("memagent")
    assert spec.reward(task, traj) == 0.0
    assert spec.step_rewards(task, traj) == [0.5, 0.5, -1.0, 0.0]
    assert all(s.step_reward is None for s in traj.segments)  # the rewards are pure: nothing written
    traj.segments[3].info["answer_text"] = "\\boxed{ Deep red }"
    traj.info["answer_text"] = "\\boxed{ Deep red }"
    assert spec.reward(task, traj) == 1.0
    assert spec.step_rewards(task, traj)[3] == 1.0


def test_final_step_reward_names_a_verifier_that_a_constant_box_cannot_earn():
    """workflow.final_step_reward: format (default) pays any one non-empty box; published_box_f1 pays the box's
    token F1 against the gold (1 where the published verifier matches)."""
    spec = get_workflow("memagent")
    task = Task("t", "what colour is Kalo", "abcd", ["deep red"])  # one chunk, so [memory gain, final]

    def steps_for(final_reply: str, **kw) -> list[float]:
        traj = run_one(task, ScriptedEngine(["Kalo is deep red", final_reply]), cfg(**kw))
        return spec.step_rewards(task, traj)

    # the memory call gains both gold words (1.0) under either rule
    assert steps_for("\\boxed{2}") == [1.0, 1.0]  # format: any single box earns it
    assert steps_for("\\boxed{2}", final_step_reward="published_box_f1") == [1.0, 0.0]
    # {deep, blue} against {deep, red}: precision 1/2, recall 1/2, F1 1/2
    assert steps_for("\\boxed{deep blue}", final_step_reward="published_box_f1") == [1.0, 0.5]
    assert steps_for("\\boxed{Deep red}", final_step_reward="published_box_f1") == [1.0, 1.0]
    assert steps_for("deep red", final_step_reward="published_box_f1") == [1.0, 0.0]  # no box: nothing
    assert steps_for("deep red") == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"final_step_reward \(format, or a verifier\) must be one of box_weighted_f1, boxed_em"):
        cfg(final_step_reward="box")


def test_memory_text_after_think_keeps_what_follows_the_last_think_end():
    """memory_text=after_think: BytedTsinghua-SIA/MemAgent @ 76b7a658, taskutils/memory_eval/utils/
    recurrent.py async_query_llm sets memory = extract_solution(reply)[0] (utils/__init__.py): with
    "</think>" in the reply, reply.split("</think>")[-1].strip(); without, the reply as it is."""
    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # chunks "abcd", "efgh", "ijkl"
    replies = ["<think>a</think>  m1 ", "r</think>s</think>\nm2", "<think>only</think>", r"\boxed{x}"]
    engine = ScriptedEngine(list(replies))
    run_one(task, engine, cfg(memory_text="after_think", empty_memory="empty", max_memory_tokens=40))
    # reply 0: after "</think>": "  m1" (the reply is trimmed when decoded) -> "m1"; reply 1: after the LAST
    # "</think>": "\nm2" -> "m2"; reply 2: nothing after it -> "" (empty_memory=empty keeps it empty)
    assert [c.prompt_text for c in engine.calls] == [
        user("P:Q?|M:No previous memory|C:abcd"), user("P:Q?|M:m1|C:efgh"), user("P:Q?|M:m2|C:ijkl"),
        user("P:Q?|M:|answer:"),
    ]
    # memrl's default: the whole reply is the memory
    engine = ScriptedEngine(list(replies))
    traj = run_one(task, engine, cfg(max_memory_tokens=40))
    assert engine.calls[1].prompt_text == user("P:Q?|M:<think>a</think>  m1|C:efgh")
    assert [s.info["memory"] for s in traj.segments[:3]] == ["<think>a</think>  m1", "r</think>s</think>\nm2",
                                                            "<think>only</think>"]
    # a reply without "</think>" is kept whole under after_think too
    engine = ScriptedEngine(["plain m", r"\boxed{x}"])
    run_one(Task("t2", "Q?", "abcd", ["x"]), engine, cfg(memory_text="after_think"))
    assert engine.calls[1].prompt_text == user("P:Q?|M:plain m|answer:")
    with pytest.raises(ValueError, match="memory_text must be one of reply, after_think"):
        cfg(memory_text="think")
