"""benchmarks/engine_compare.py without running a model: FLOPs per token from a config, the table from
hand-made cells, and the --dry-run plan (the measured run is the benchmark's job, not a test's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_compare.py"
_spec = importlib.util.spec_from_file_location("engine_compare", _PATH)
ec = importlib.util.module_from_spec(_spec)
sys.modules["engine_compare"] = ec
_spec.loader.exec_module(ec)

TINY = {"vocab_size": 4096, "hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2}


def test_flops_per_token_of_the_tiny_shape():
    # per layer: q 192*192 + k 192*96 + v 192*96 + o 192*192 = 110592; MLP 3*192*768 = 442368 -> 552960;
    # 4 layers 2211840; LM head 4096*192 = 786432; 2998272 multiply-adds, 2 FLOPs each
    assert ec.flops_per_token(TINY) == 5996544
    # an explicit head_dim (Qwen3) replaces hidden / heads: q and o 192*(4*64), k and v 192*(2*64)
    assert ec.flops_per_token({**TINY, "head_dim": 64}) == 2 * (4 * (192 * 256 * 2 + 192 * 128 * 2 + 442368)
                                                                + 786432)


def test_table_medians_ratios_identity_and_peak_fraction():
    ref = ec.Cell("hf", "tiny", 16, tokens_per_s=[100.0, 300.0, 200.0], tokens_per_cpu_s=[400.0, 410.0, 420.0],
                  flops_per_s=[1e9, 3e9, 2e9], outputs=[[[1, 2]], [[1, 2]], [[1, 2]]],
                  prompt_per_s=[900.0, 1100.0, 1000.0])
    other = ec.Cell("vllm", "tiny", 16, tokens_per_s=[150.0, 250.0, 500.0], tokens_per_cpu_s=[100.0, 205.0, 300.0],
                    flops_per_s=[4e9, 5e9, 6e9], outputs=[[[1, 2]], [[1, 3]], [[1, 3]]])
    lines = ec.format_table([ref, other], peak=10e9, reference="hf").splitlines()
    # medians 200 and 250 -> 1.25x; per CPU second 410 and 205 -> 0.50x; flops medians 2e9 and 5e9 of a
    # 10e9 peak -> 20.0 % and 50.0 %; prompt tok/s median 1000, "-" where not measured
    # no logprobs recorded: "-" in the logprob column
    assert lines[2] == "| tiny | 16 | hf | 200 (100-300) | 1.00x | 1000 | 410 (400-420) | 1.00x | yes | - | 20.0 |"
    assert lines[3] == ("| tiny | 16 | vllm | 250 (150-500) | 1.25x | - | 205 (100-300) | 0.50x | "
                        "no (1/1 calls differ) | - | 50.0 |")


def test_logprob_gap_counts_only_shared_prompts_up_to_the_first_differing_token():
    # one round, three calls: call 0 same prompt, tokens agree then differ at position 2 (its 0.5 gap there
    # is not counted); call 1 same prompt and tokens, gaps 0.25 and 0.125; call 2 another prompt (gap 9
    # not counted)
    ref = ec.Cell("hf", "m", 16, tokens_per_s=[1.0], outputs=[[[1, 2, 3], [4, 5], [6]]],
                  logprobs=[[[-1.0, -2.0, -3.0], [-1.0, -1.0], [-1.0]]], prompts=[[11, 12, 13]])
    other = ec.Cell("llama", "m", 16, tokens_per_s=[1.0], outputs=[[[1, 2, 7], [4, 5], [6]]],
                    logprobs=[[[-1.0625, -2.0, -2.5], [-1.25, -1.125], [-10.0]]], prompts=[[11, 12, 99]])
    assert ec.logprob_gap(ref, other) == 0.25
    assert ec.logprob_gap(ref, ec.Cell("x", "m", 16)) is None
    line = ec.format_table([ref, other], peak=0, reference="hf").splitlines()[3]
    assert line.endswith("| no (1/3 calls differ) | 2.5e-01 | - |")  # call 2: other prompt, same tokens


def test_latency_table_of_the_last_rounds_stats():
    stats = {"first_tokens": 4, "first_token_wait_s": 2.0, "max_first_token_s": 0.9, "max_decode_gap_s": 0.25,
             "prefill_chunks": 7, "decode_steps_beside_prefill": 12}
    cells = [ec.Cell("hf-new-chunked", "tiny", 16, stats=stats), ec.Cell("vllm", "tiny", 16, stats={})]
    lines = ec.format_latency(cells).splitlines()
    # 2.0 s over 4 first tokens -> 0.500 mean; vllm has no counters and no row
    assert lines[2:] == ["| tiny | 16 | hf-new-chunked | 0.500 | 0.900 | 0.250 | 7 | 12 |"]


def test_dry_run_plans_without_running(capsys, tmp_path):
    missing = tmp_path / "no-python"
    assert ec.main(["--dry-run", "--presets", "tiny", "--engines", "hf", "vllm", "--vllm-python", str(missing)]) == 0
    err = capsys.readouterr().err
    assert f"# vllm: {missing} not found; vllm rows skipped" in err
    assert "# tiny: 6.00 MFLOP per token" in err  # 5996544 FLOPs
    assert "# would run hf on tiny with" in err and "would run vllm" not in err


def test_quick_sets_the_small_grid(capsys):
    assert ec.main(["--quick", "--dry-run", "--engines", "hf"]) == 0
    err = capsys.readouterr().err
    assert "rounds 1, C [1, 2], MemAgent chunk 32 x 1 + final, memory 8, final 4, greedy" in err


def test_llama_rows_skip_with_a_note_without_their_venv_or_gguf(capsys, tmp_path):
    missing = tmp_path / "no-python"
    assert ec.main(["--dry-run", "--presets", "tiny", "--engines", "hf", "llama", "llama-f32",
                    "--llama-python", str(missing)]) == 0
    err = capsys.readouterr().err
    assert f"# llama: {missing} not found; llama rows skipped (scripts/install_llama_cpp.sh makes one)" in err
    assert f"# llama-f32: {missing} not found; llama-f32 rows skipped" in err
    assert "would run llama" not in err
    # a python that exists, but a tiny preset (no GGUF of it) and no --gguf: skipped, saying what it needs
    assert ec.main(["--dry-run", "--presets", "tiny", "--engines", "llama", "--llama-python", sys.executable]) == 0
    err = capsys.readouterr().err
    assert "# llama/tiny: needs --gguf FILE and the preset as that GGUF's imported model directory" in err
    assert "would run llama" not in err


def test_llama_context_per_sequence():
    # chunk 256 + memory 64 read and written + final 16 + 512 of template = 912 -> 1024 (multiple of 256)
    args = ec.argparse.Namespace(chunk_tokens=256, memory_tokens=64, final_tokens=16)
    assert ec.ctx_per_seq(args) == 1024
    args.chunk_tokens = 512  # 1168 -> 1280
    assert ec.ctx_per_seq(args) == 1280


def test_f32_gguf_dequantizes_every_tensor_and_keeps_the_metadata(tmp_path):
    gguf = __import__("pytest").importorskip("gguf")
    import numpy as np

    src, dst = tmp_path / "m.Q8_0.gguf", tmp_path / "m.F32.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_uint32("llama.block_count", 2)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    # one Q8_0 block of 32 values, largest magnitude 63.5: scale 63.5 / 127 = 0.5, q = 2 * value, so these
    # halves dequantize exactly
    values = np.array([-63.5] + [k / 2 for k in range(-15, 16)], dtype=np.float32)
    w.add_tensor("blk.0.w", gguf.quants.quantize(values.reshape(1, 32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("norm", np.array([1.0, -2.0], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert ec.write_f32_gguf(src, dst) == dst
    r = gguf.GGUFReader(str(dst))
    assert r.fields["general.file_type"].contents() == 0  # ALL_F32
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.block_count"].contents() == 2
    assert r.fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a", "b"]
    t = {x.name: x for x in r.tensors}
    assert t["blk.0.w"].tensor_type == gguf.GGMLQuantizationType.F32
    assert t["blk.0.w"].data.reshape(-1).tolist() == values.tolist()
    assert t["norm"].data.tolist() == [1.0, -2.0]
