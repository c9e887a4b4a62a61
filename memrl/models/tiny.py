"""Tiny local models for tests and demos: a byte-level BPE tokenizer with a ChatML template and a randomly
initialized Qwen2, Qwen3 or Qwen3-MoE causal LM, saved in HuggingFace format (safetensors). No hub access.

`init_tiny_model(out_dir, preset)` builds one; `cached_tiny_model(preset, cache_dir)` builds once and
reuses the directory (tests). Presets: "tiny" (Qwen2, about 3M parameters), "small" (Qwen2, about 24M),
"tiny-qwen3" (Qwen3, about 3M) and "tiny-qwen3-moe" (Qwen3-MoE, 8 experts, 2 per token). The Qwen3 presets
carry a chat template with Qwen3's thinking switch (QWEN3_CHAT_TEMPLATE). `random_model` writes a random
model of a published shape (SHAPES: Qwen2.5-0.5B, Qwen3-0.6B) with a tiny tokenizer, for GPU checks.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from memrl.errors import UserError
from memrl.quiet import hf_progress_off

# Bump when the synthetic corpus, tokenizer recipe or presets change, so cached models are rebuilt.
FORMAT_VERSION = 1

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen2.5-style ChatML, without the default system message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# ChatML that renders `tools=` compactly: the system message ends with "tools: search prune_context"
# (the tool names only). For tiny models trained from scratch (the MemAct CPU task): the Hermes block of
# JSON schemas that memrl.tools.calls appends for templates without tools support is ~300 tokens.
CHAT_TEMPLATE_COMPACT_TOOLS = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{%- if loop.first and tools and message['role'] == 'system' %}"
    "{{- '\\ntools:' }}{%- for t in tools %}{{- ' ' + t['function']['name'] }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Qwen3-style ChatML with the thinking switch (memrl's own Jinja, written to behave as Qwen3's template does):
# - add_generation_prompt with enable_thinking=false adds an empty think block ("<think>\n\n</think>\n\n");
#   enable_thinking undefined or true adds nothing (the model opens <think> itself);
# - an assistant message whose content holds "</think>" is split into reasoning (between "<think>" and the
#   first "</think>") and answer (after the last "</think>"), or reads message.reasoning_content; turns before
#   the last user message are rendered without their think block; turns after it keep it (the last
#   message always gets one, empty if need be, so it matches the non-thinking generation prompt);
# - tool messages become one user turn of <tool_response> blocks; assistant tool_calls are Hermes JSON.
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
QWEN3_CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m['content'] if m['content'] is string else '' %}"
    "{%- if m['role'] == 'assistant' %}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}"
    "{%- if m.reasoning_content is not string and '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_user and (loop.last or reasoning) %}"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- content }}"
    "{%- for call in m.tool_calls or [] %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{{- ('\\n' if content or not loop.first else '') + '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": '"
    " + (f.arguments if f.arguments is string else f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Plain (not special) added tokens, as in Qwen3's tokenizer: decoding with skip_special_tokens keeps them.
QWEN3_ADDED_TOKENS = (THINK_OPEN, THINK_CLOSE, "<tool_call>", "</tool_call>")

# Qwen2's pre-tokenizer split: digits one by one, words with one leading non-letter, punctuation runs.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


ARCHS: tuple[str, ...] = ("qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ModelPreset:
    """Shape of a preset; vocab_size is the BPE target (the model uses the trained size). `arch` picks the
    transformers class; head_dim 0 = hidden_size / num_attention_heads; the MoE fields are qwen3_moe's."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 16384
    arch: str = "qwen2"
    head_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0


def shape_problem(hidden_size: int, num_heads: int, num_kv_heads: int, prefix: str = "") -> str | None:
    """What makes a Qwen2-style attention shape unbuildable (named as `prefix`<field>), None when it is sound:
    the hidden size splits evenly over the heads, and the query heads evenly over the key/value heads
    (otherwise transformers builds projections whose matrices do not multiply). Counts below 1 are left to
    the fields' declared ranges."""
    if num_heads < 1 or num_kv_heads < 1:
        return None
    if hidden_size % num_heads:
        return (f"{prefix}hidden_size={hidden_size} is not a multiple of {prefix}num_heads={num_heads} (each head "
                "gets hidden_size / num_heads dimensions)")
    if num_heads % num_kv_heads:
        return (f"{prefix}num_heads={num_heads} is not a multiple of {prefix}num_kv_heads={num_kv_heads} (each key/value "
                "head serves num_heads / num_kv_heads query heads)")
    return None


PRESETS: dict[str, ModelPreset] = {
    # 4096*192 (tied embeddings) + 4 layers * ~0.55M = ~3.0M parameters
    "tiny": ModelPreset(4096, 192, 768, 4, 4, 2),
    # 16384*384 + 8 layers * ~2.16M = ~23.6M parameters
    "small": ModelPreset(16384, 384, 1536, 8, 6, 2),
    # tiny's shape as a Qwen3 (q/k norms, no qkv bias): ~3.0M parameters
    "tiny-qwen3": ModelPreset(4096, 192, 768, 4, 4, 2, arch="qwen3"),
    # 4 MoE layers of 8 experts (2 per token, 128 wide): 4100*192 + 4 * (~0.11M attention + 8 * 3 * 192 * 128)
    # = ~3.6M parameters
    "tiny-qwen3-moe": ModelPreset(4096, 192, 768, 4, 4, 2, arch="qwen3_moe", num_experts=8,
                                  num_experts_per_tok=2, moe_intermediate_size=128),
}

# Published shapes for random-weight GPU checks (random_model); vocab_size is the published one.
SHAPES: dict[str, ModelPreset] = {
    # Qwen2.5-0.5B: 494M parameters (tied embeddings)
    "qwen2.5-0.5b": ModelPreset(151936, 896, 4864, 24, 14, 2, max_position_embeddings=32768),
    # Qwen3-0.6B: 596M parameters (tied embeddings, head_dim 128)
    "qwen3-0.6b": ModelPreset(151936, 1024, 3072, 28, 16, 8, max_position_embeddings=40960, arch="qwen3",
                              head_dim=128),
}


# ---------------------------------------------------------------------------------------------------
# Synthetic text: English-like prose, numbers, documents and the prompt tags the workflows use.
# ---------------------------------------------------------------------------------------------------

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will more can who its than "
    "about after other into two what some time only could may first then do any like over also new such "
    "these most years where well made did between back through many before must being three used under "
    "world city river year film album band team game party state school book people war history part "
    "country called known born during including several later since became found played released based "
    "located north south east west family company president member season series town village church "
    "university village population district region county island station music record single director "
    "written published directed founded served elected won award national american british french german "
    "question answer memory section document problem evidence relevant detail information previous "
    "update recall thinking because therefore however although answer final reading long context chunk"
).split()

_SYLLABLES = (
    "ka lo mi ra ten vor al is an el ber gen ston ham ley ton wood field mar cus ia ric ard son bel la "
    "fer gus dor an ny vil le mont ro sa gar cia lin da mor gan tor res wal ker ash by nor th ox en ford "
    "chi ca go ber lin pa ris lon don ma dri zu ri ch kyo to ne vada al ber ta que bec vic to ria"
).split()

_PUNCT_END = (".", ".", ".", "!", "?", ";")
_TAG_LINES = (
    "<problem>\n{q}\n</problem>",
    "<memory>\n{s}\n</memory>",
    "<section>\n{s}\n</section>",
    "<thinking>{s}</thinking>",
    "<update>{s}</update>",
    "<recall>{q}</recall>",
    "<recalled_memory>\n{s}\n</recalled_memory>",
    "The answer is \\boxed{{{a}}}.",
    "\\boxed{{{a}}}",
    "No previous memory",
    "No memory was recalled.",
)


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return str(rng.randint(1700, 2030))
    if kind < 0.7:
        return str(rng.randint(0, 999))
    if kind < 0.85:
        return f"{rng.randint(1, 99)}.{rng.randint(0, 99)}"
    return f"{rng.randint(1, 999)},{rng.randint(0, 999):03d}"


def _sentence(rng: random.Random, names: Sequence[str]) -> str:
    words = []
    for _ in range(rng.randint(5, 18)):
        r = rng.random()
        if r < 0.12:
            words.append(rng.choice(names))
        elif r < 0.2:
            words.append(_number(rng))
        elif r < 0.25:
            words.append(rng.choice(_WORDS) + ",")
        elif r < 0.27:
            words.append(f"({rng.choice(_WORDS)})")
        elif r < 0.29:
            words.append(f'"{rng.choice(_WORDS)}"')
        else:
            words.append(rng.choice(_WORDS))
    words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words) + rng.choice(_PUNCT_END)


def _paragraph(rng: random.Random, names: Sequence[str]) -> str:
    return " ".join(_sentence(rng, names) for _ in range(rng.randint(2, 6)))


def _question(rng: random.Random, names: Sequence[str]) -> str:
    head = rng.choice(("Who", "What", "When", "Where", "Which", "How many", "In which year"))
    return f"{head} {_sentence(rng, names)[:-1].lower()}?"


# The prompt templates mixed into the tokenizer corpus, in the order the tiny models were first built with.
# A fixed list: adding a template (MemAct's) or a filesystem that lists a folder in another order must not
# change the tiny models (their tokens are pinned by golden tests and by the demo's measured results).
CORPUS_TEMPLATES = ("memagent_final.txt", "rememr1_memory.txt", "rememr1_final.txt", "memagent_memory.txt")


def _packaged_templates() -> list[str]:
    out = []
    try:
        folder = resources.files("memrl").joinpath("templates")
        for name in CORPUS_TEMPLATES:
            out.append(folder.joinpath(name).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ModuleNotFoundError):
        pass
    return out


def synthetic_corpus(seed: int = 0, num_blocks: int = 6000, num_names: int = 20000) -> Iterator[str]:
    """Deterministic English-like text blocks: prose, "Document i:" listings, tagged prompts, boxed answers."""
    rng = random.Random(seed)
    names = [_name(rng) for _ in range(num_names)]
    templates = _packaged_templates()
    for b in range(num_blocks):
        kind = b % 4
        if kind == 0:
            yield _paragraph(rng, names)
        elif kind == 1:
            docs = [
                f"Document {i + 1}:\n{rng.choice(names)} {rng.choice(names)}\n{_paragraph(rng, names)}"
                for i in range(rng.randint(1, 4))
            ]
            yield "\n\n".join(docs)
        elif kind == 2:
            q, s, a = _question(rng, names), _paragraph(rng, names), rng.choice(names)
            parts = [line.format(q=q, s=s, a=a) for line in rng.sample(_TAG_LINES, k=rng.randint(2, 5))]
            yield "\n\n".join(parts)
        else:
            if templates and rng.random() < 0.5:
                tpl = rng.choice(templates)
                for key in ("{problem}", "{memory}", "{chunk}", "{recalled_memory}"):
                    tpl = tpl.replace(key, _paragraph(rng, names) if key != "{problem}" else _question(rng, names))
                yield tpl
            else:
                yield (
                    f"{IM_START}user\n{_question(rng, names)}{IM_END}\n{IM_START}assistant\n"
                    f"{_paragraph(rng, names)} \\boxed{{{_number(rng)}}}{IM_END}\n"
                )


# ---------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------


def _text_blocks(corpus: Sequence[str | os.PathLike] | None, seed: int) -> Iterator[str]:
    if not corpus:
        yield from synthetic_corpus(seed)
        return
    for path in corpus:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise FileNotFoundError(f"corpus file {p}: cannot read ({e.strerror or e})") from e
        for i in range(0, len(text), 4096):
            yield text[i : i + 4096]


def train_tokenizer(corpus: Sequence[str | os.PathLike] | None = None, vocab_size: int = 4096, seed: int = 0,
                    arch: str = "qwen2"):
    """Byte-level BPE (Qwen2 pre-tokenizer split) with ChatML special tokens, as a PreTrainedTokenizerFast.

    eos = <|im_end|>, pad = <|endoftext|>, no BOS; the chat template is ChatML with add_generation_prompt.
    arch qwen3 / qwen3_moe: QWEN3_CHAT_TEMPLATE, and <think>, </think>, <tool_call>, </tool_call> as plain
    added tokens (one id each, kept by decode(skip_special_tokens=True)), as Qwen3's tokenizer has them.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise UserError(f"vocab_size must be > {256 + len(SPECIAL_TOKENS)} (256 bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_text_blocks(corpus, seed), trainer=trainer)
    qwen3 = arch in ("qwen3", "qwen3_moe")
    if qwen3:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        chat_template=QWEN3_CHAT_TEMPLATE if qwen3 else CHAT_TEMPLATE,
        model_max_length=PRESETS["tiny"].max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def qwen2_config(preset: str | ModelPreset, vocab_size: int, eos_token_id: int, pad_token_id: int):
    """A Qwen2Config for a preset with the tokenizer's actual vocabulary size (tied embeddings)."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        max_position_embeddings=p.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def model_config(shape: ModelPreset, vocab_size: int, eos_token_id: int, pad_token_id: int,
                 tie_word_embeddings: bool = True):
    """The transformers config of `shape` (its `arch`) with the given vocabulary size."""
    if shape.arch not in ARCHS:
        raise ValueError(f"unknown model arch {shape.arch!r}; known: {', '.join(ARCHS)}")
    if shape.arch == "qwen2":
        return qwen2_config(shape, vocab_size, eos_token_id, pad_token_id)
    common = dict(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, max_position_embeddings=shape.max_position_embeddings,
        head_dim=shape.head_dim or shape.hidden_size // shape.num_attention_heads,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
    )
    if shape.arch == "qwen3":
        return Qwen3Config(**common)
    return Qwen3MoeConfig(**common, num_experts=shape.num_experts, num_experts_per_tok=shape.num_experts_per_tok,
                          moe_intermediate_size=shape.moe_intermediate_size, norm_topk_prob=True)


_MODEL_CLASSES = {"qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}


def init_tiny_model(
    out_dir: str | os.PathLike,
    preset: str = "tiny",
    corpus: Sequence[str | os.PathLike] | None = None,
    seed: int = 0,
    vocab_size: int | None = None,
) -> Path:
    """Train a tokenizer and write a seeded, randomly initialized causal LM of the preset's arch to `out_dir`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size or p.vocab_size, seed, arch=p.arch)
    tokenizer.model_max_length = p.max_position_embeddings
    tokenizer.save_pretrained(out)

    config = model_config(p, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[p.arch](config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None

    with hf_progress_off():
        model.save_pretrained(out, safe_serialization=True)
    info = {
        "preset": preset,
        "seed": seed,
        "format_version": FORMAT_VERSION,
        "num_parameters": sum(t.numel() for t in model.parameters()),
        "vocab_size": len(tokenizer),
        "corpus": [str(c) for c in corpus] if corpus else "synthetic",
        "shape": asdict(p),
    }
    (out / "memrl_model.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


def random_model(out_dir: str | os.PathLike, shape: str | ModelPreset, dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0, cache_dir: str | os.PathLike | None = None) -> Path:
    """A randomly initialized model of a published shape (SHAPES name or a ModelPreset) written to `out_dir`
    with the tiny tokenizer of its arch family (tiny / tiny-qwen3); the embedding keeps the shape's
    vocab_size (ids past the tokenizer's are never produced by it). For GPU checks: no hub access."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}")
        shape = SHAPES[shape]
    tok_preset = "tiny" if shape.arch == "qwen2" else "tiny-qwen3"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(cached_tiny_model(tok_preset, cache_dir))
    if shape.vocab_size < len(tokenizer):
        raise ValueError(f"shape vocab_size {shape.vocab_size} is below the tokenizer's {len(tokenizer)}")
    config = model_config(shape, shape.vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[shape.arch](config).to(dtype)
    out = Path(out_dir)
    with hf_progress_off():
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def default_cache_dir() -> Path:
    return Path(os.environ.get("MEMRL_CACHE", Path.home() / ".cache" / "memrl")) / "models"


def cached_tiny_model(preset: str = "tiny", cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """Path of a model built by `init_tiny_model(preset, seed)`, built into `cache_dir` on first use only.

    Safe against concurrent builders: each builds in a temporary directory and renames it into place.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"{preset}-seed{seed}-v{FORMAT_VERSION}"
    if (target / "memrl_model.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        init_tiny_model(tmp, preset=preset, seed=seed)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "memrl_model.json").is_file():  # lost the race to a broken dir: replace it
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
