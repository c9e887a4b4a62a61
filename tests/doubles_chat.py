"""A chat template with tools support, for tests: the tiny models' ChatML ignores `tools=` and tool calls.

`TOOLS_CHAT_TEMPLATE` renders like Qwen2.5's (the template the published MemAct models use), reduced to
what the tests need: with `tools`, a system block holding the system message, then "# Tools" and one
JSON schema per line inside <tools></tools>; assistant messages as ChatML with each tool call appended as
`\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; consecutive tool messages merged into
one user turn of <tool_response> blocks. `tools_tokenizer_dir(dst)` saves the tiny tokenizer with it.
"""

from __future__ import annotations

from pathlib import Path

TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}"
    "{{ messages[0].content + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n<tools>' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{ '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{%- if m.tool_calls %}{% for tc in m.tool_calls %}{{ '\\n<tool_call>\\n{\"name\": \"' + tc.function.name"
    " + '\", \"arguments\": ' + (tc.function.arguments | tojson) + '}\\n</tool_call>' }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{% if loop.first or loop.previtem.role != 'tool' %}{{ '<|im_start|>user' }}"
    "{% endif %}{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or loop.nextitem.role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tools_tokenizer_dir(dst: str | Path, model: str = "tiny") -> Path:
    """The tiny model's tokenizer with TOOLS_CHAT_TEMPLATE, saved to `dst` (its weights linked beside it, so
    `dst` is a model directory too)."""
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    src = Path(cached_tiny_model(model))
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name in ("config.json", "generation_config.json") or f.suffix == ".safetensors":
            target = dst / f.name
            if not target.exists():
                target.symlink_to(f.resolve())
    tok = AutoTokenizer.from_pretrained(src)
    tok.chat_template = TOOLS_CHAT_TEMPLATE
    tok.save_pretrained(dst)
    return dst
