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
                  flops_per_s=[1e9, 3e9, 2e9], outputs=[[[1, 2]], [[1, 2]], [[1, 2]]])
    other = ec.Cell("vllm", "tiny", 16, tokens_per_s=[150.0, 250.0, 500.0], tokens_per_cpu_s=[100.0, 205.0, 300.0],
                    flops_per_s=[4e9, 5e9, 6e9], outputs=[[[1, 2]], [[1, 3]], [[1, 3]]])
    lines = ec.format_table([ref, other], peak=10e9, reference="hf").splitlines()
    # medians 200 and 250 -> 1.25x; per CPU second 410 and 205 -> 0.50x; flops medians 2e9 and 5e9 of a
    # 10e9 peak -> 20.0 % and 50.0 %
    assert lines[2] == "| tiny | 16 | hf | 200 (100-300) | 1.00x | 410 (400-420) | 1.00x | yes | 20.0 |"
    assert lines[3] == "| tiny | 16 | vllm | 250 (150-500) | 1.25x | 205 (100-300) | 0.50x | no (1/1 calls differ) | 50.0 |"


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
