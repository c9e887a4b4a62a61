"""Tool calls: parse `<tool_call>` blocks in one of two formats, render schemas.

- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3, MemAct);
- xml: `<tool_call><function=NAME><parameter=ARG>value</parameter>...</function></tool_call>` (the format
  of qwen3-coder-style chat templates), each value converted by the tool's JSON schema (`xml_value`).
`detect_call_format` picks one from a chat template (it names `<function=` only in the xml format).

Parsing never raises. Each block is sanitized for what small models really emit (a BOM, zero-width
characters or bidirectional marks, a ```json / ```xml code fence, text before or after the JSON object or
the <function=...> block, `arguments` given as a JSON string, a missing </function>); a block that still
is not one call, or a `<tool_call>` that never closes, becomes a `ParseResult.errors` entry that the
workflow answers with an error tool message (or, with workflow.unparsable_tool_calls=end, skips).

Tool schemas are OpenAI-style JSON schema, rendered through the tokenizer's chat template (`tools=`).
Templates without tools support (they render the same text with and without `tools=`, e.g. the tiny
models' ChatML template and the tests' character tokenizer) get the schemas appended to the system prompt
instead, in the Hermes wording (`# Tools`, `<tools>...</tools>`, the call format): see `render_system`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
# BOM, zero-width space / non-joiner / joiner, word joiner, the other invisible format characters, and the
# bidirectional marks and embeddings U+200E, U+200F, U+202A-U+202E (the public sanitizer strips those too:
# MemAct's verl/experimental/agent_loop/tool_parser.py, HermesToolParser._sanitize_json_block).
_INVISIBLE = re.compile("[\ufeff\u200b\u200c\u200d\u200e\u200f\u202a-\u202e\u2060\u180e\u00ad]")
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its arguments object."""

    name: str
    arguments: dict[str, Any]


def published_call_text(call: ToolCall) -> str:
    """The call as the published MemAct loop writes it back to find it in a reply (mem_agent_loop.py,
    MemAgentLoop.restore_as_text, over the HermesToolParser's arguments string): the open tag and a newline,
    the name and the arguments serialized with json.dumps' default separators (non-ASCII kept), a newline,
    the close tag and a newline. A call the model wrote otherwise (other spacing, no newline after it, as the
    reply's last call usually is) does not match it."""
    args = json.dumps(call.arguments, ensure_ascii=False)
    return f'{OPEN}\n{{"name": "{call.name}", "arguments": {args}}}\n{CLOSE}\n'


@dataclass
class ParseResult:
    """The calls of one assistant turn, in order, and what could not be used.

    `errors` has one message per malformed block; `dropped` counts well-formed calls past the cap;
    `sanitized` counts blocks that parsed only after cleaning; `attempted` is whether the text holds
    any `<tool_call>` at all (a turn without one is the answer).
    """

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dropped: int = 0
    sanitized: int = 0
    attempted: bool = False
    valid: list[bool] = field(default_factory=list)
    """Per block in the order written (an unclosed one last): whether it parsed into a call."""


def sanitize(block: str) -> str:
    """The JSON object inside a block: invisible characters removed, code fence and surrounding text cut."""
    text = _INVISIBLE.sub("", block).strip()
    m = _FENCE.match(text)
    if m:
        text = m.group(1).strip()
    start = text.find("{")
    if start < 0:
        return text
    try:  # the first complete JSON value from the first '{': trailing text is dropped
        _, end = json.JSONDecoder().raw_decode(text, start)
        return text[start:end]
    except json.JSONDecodeError:
        end = text.rfind("}")
        return text[start : end + 1] if end > start else text[start:]


def parse_block(block: str) -> tuple[ToolCall | None, str | None, bool]:
    """(call, error, sanitized) for the text between `<tool_call>` and `</tool_call>`."""
    raw = block.strip()
    cleaned = sanitize(block)
    was_sanitized = cleaned != raw
    try:
        obj = json.loads(cleaned)
    except json.JSONDecodeError as e:
        return None, f"the tool call is not valid JSON ({e.msg} at character {e.pos})", was_sanitized
    if not isinstance(obj, dict):
        return None, f"the tool call must be a JSON object, got {type(obj).__name__}", was_sanitized
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, "the tool call has no \"name\" string", was_sanitized
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(_INVISIBLE.sub("", args) or "{}")
            was_sanitized = True
        except json.JSONDecodeError:
            return None, f"the arguments of {name!r} are a string that is not a JSON object", was_sanitized
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}", was_sanitized
    return ToolCall(name.strip(), args), None, was_sanitized


# The public parser's cleaning (MemAct's verl/experimental/agent_loop/tool_parser.py,
# HermesToolParser._sanitize_json_block): fewer invisible characters, a fence only when the block starts and
# ends with one, then everything from the first "{" to the last "}".
_PUBLISHED_INVISIBLE = re.compile("[\u200b-\u200f\ufeff\u202a-\u202e]")
PARSERS = ("memrl", "published")


def published_sanitize(block: str) -> str:
    """The public parser's cleaning of one block (see the comment above)."""
    s = _PUBLISHED_INVISIBLE.sub("", block.strip().lstrip("\ufeff"))
    if s.startswith("```") and s.endswith("```"):
        s = s.strip("`")
        if s.lower().startswith("json"):
            s = s[4:].lstrip()
    start, end = s.find("{"), s.rfind("}")
    return s[start:end + 1] if start != -1 and end != -1 and end > start else s


def parse_block_published(block: str) -> tuple[ToolCall | None, str | None, bool]:
    """(call, error, sanitized) under the public parser's rules (HermesToolParser.extract_tool_calls): the
    published cleaning, then a JSON object with a "name" string (used as written) and an "arguments" key
    (no "parameters" alias, no default). Its arguments must be an object here: the public parser accepts
    any JSON value and the call then fails when it runs (a search ends the trajectory, a prune fails);
    memrl counts it as malformed."""
    raw = block.strip()
    cleaned = published_sanitize(block)
    try:
        obj = json.loads(cleaned)
    except json.JSONDecodeError as e:
        return None, f"the tool call is not valid JSON ({e.msg} at character {e.pos})", cleaned != raw
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None, 'the tool call needs a "name" string and an "arguments" object', cleaned != raw
    if not isinstance(obj["arguments"], dict):
        kind = type(obj["arguments"]).__name__
        return None, f"the arguments of {obj['name']!r} must be a JSON object, got {kind}", cleaned != raw
    return ToolCall(obj["name"], obj["arguments"]), None, cleaned != raw


# ---- the xml format (qwen3-coder-style templates) ----

CALL_FORMATS = ("hermes", "xml")
_FUNCTION = re.compile(r"<function=([^>]*)>")
_PARAMETER = re.compile(r"<parameter=([^>]*)>")
_XML_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def xml_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's value: the text between the tags without the one newline the template writes on each
    side, converted by the parameter's JSON-schema type (integer, number, boolean, array / object as
    JSON; text that does not convert stays a string, for the tool to refuse by name); string or no
    schema: the text, except that text starting with "[" or "{" that is JSON becomes that value."""
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    kind = (schema or {}).get("type")
    value = text.strip()
    if kind == "string":
        return text
    if kind in ("integer", "number"):
        try:
            return int(value) if kind == "integer" or re.fullmatch(r"-?\d+", value) else float(value)
        except ValueError:
            return text
    if kind == "boolean" and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if kind in ("array", "object") or (kind is None and value[:1] in ("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return text
    return text


def parse_xml_block(block: str, schemas: dict[str, dict[str, Any]] | None = None
                    ) -> tuple[ToolCall | None, str | None, bool]:
    """(call, error, sanitized) for the text between `<tool_call>` and `</tool_call>` in the xml format.
    `schemas`: tool name -> its parameters' JSON schemas ({"query": {"type": "string"}, ...})."""
    raw = block.strip()
    text = _INVISIBLE.sub("", block).strip()
    m = _XML_FENCE.match(text)
    if m:
        text = m.group(1).strip()
    funcs = list(_FUNCTION.finditer(text))
    if not funcs:
        return None, "the tool call has no <function=NAME> block", text != raw
    if len(funcs) > 1:
        return None, f"the tool call holds {len(funcs)} <function=...> blocks; write one per <tool_call>", text != raw
    name = funcs[0].group(1).strip()
    if not name:
        return None, "the tool call has an empty function name", text != raw
    body, closed, after = text[funcs[0].end():].partition("</function>")
    marks = list(_PARAMETER.finditer(body))
    lead = body[:marks[0].start()] if marks else body
    # cleaned away: invisible characters, a fence, text around the function or before its first parameter,
    # a missing </function>, spaces around the name
    cleaned = (text != raw or not closed or bool(text[:funcs[0].start()].strip() or after.strip() or lead.strip())
               or funcs[0].group(1) != name)
    params = (schemas or {}).get(name, {})
    args: dict[str, Any] = {}
    for i, p in enumerate(marks):
        key = p.group(1).strip()
        chunk = body[p.end():marks[i + 1].start() if i + 1 < len(marks) else len(body)]
        value, shut, rest = chunk.partition("</parameter>")
        if not shut:
            return None, f"parameter {key!r} of {name!r} is not closed with </parameter>", cleaned
        if not key:
            return None, f"a parameter of {name!r} has an empty name", cleaned
        if key in args:
            return None, f"parameter {key!r} of {name!r} is given twice", cleaned
        cleaned = cleaned or bool(rest.strip()) or p.group(1) != key
        args[key] = xml_value(value, params.get(key))
    return ToolCall(name, args), None, cleaned


def schema_index(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> the JSON schemas of its parameters, from OpenAI-style tool schemas."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        props = ((fn.get("parameters") or {}).get("properties") or {}) if isinstance(fn, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def detect_call_format(tokenizer: Any) -> str:
    """The call format a tokenizer's chat template teaches: xml when it writes `<function=` (qwen3-coder
    style), else hermes."""
    tpl = getattr(tokenizer, "chat_template", None)
    texts = tpl.values() if isinstance(tpl, dict) else [tpl]
    return "xml" if any(isinstance(t, str) and "<function=" in t for t in texts) else "hermes"


def parse_tool_calls(text: str, max_calls: int = 5, parser: str = "memrl", call_format: str = "hermes",
                     schemas: dict[str, dict[str, Any]] | None = None) -> ParseResult:
    """Every `<tool_call>` block of `text`, in order; at most `max_calls` calls are kept (the rest dropped).
    parser="published": each block by `parse_block_published` (hermes only). call_format="xml": each block
    by `parse_xml_block` with `schemas` (`schema_index` of the tools offered)."""
    if parser not in PARSERS:
        raise ValueError(f"tool call parser must be one of {', '.join(PARSERS)}, got {parser!r}")
    if call_format not in CALL_FORMATS:
        raise ValueError(f"tool call format must be one of {', '.join(CALL_FORMATS)}, got {call_format!r}")
    if call_format == "xml" and parser == "published":
        raise ValueError("tool call parser 'published' reads the hermes format only, got call_format 'xml'")
    if call_format == "xml":
        def parse(block: str) -> tuple[ToolCall | None, str | None, bool]:
            return parse_xml_block(block, schemas)
    else:
        parse = parse_block_published if parser == "published" else parse_block
    res = ParseResult(attempted=OPEN in text)
    last = 0
    for m in _BLOCK.finditer(text):
        last = m.end()
        call, err, cleaned = parse(m.group(1))
        res.sanitized += int(cleaned)
        res.valid.append(err is None)
        if err is not None:
            res.errors.append(err)
        elif len(res.calls) >= max_calls:
            res.dropped += 1
        else:
            res.calls.append(call)  # type: ignore[arg-type]
    if OPEN in text[last:]:  # e.g. cut off at the turn's token budget
        res.errors.append("a <tool_call> block was not closed with </tool_call>")
        res.valid.append(False)
    return res


def format_call(call: ToolCall, call_format: str = "hermes") -> str:
    """The canonical text of a call (for scripts, docs and tests): hermes JSON, or the xml format with
    strings as they are and other values as JSON."""
    if call_format == "xml":
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
            for k, v in call.arguments.items())
        return f"{OPEN}\n<function={call.name}>\n{params}</function>\n{CLOSE}"
    return f"{OPEN}{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}{CLOSE}"


def call_example(call_format: str = "hermes") -> str:
    """How to write one call, for the error messages a workflow sends back."""
    if call_format == "xml":
        return "<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>"
    return '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    """An OpenAI-style function tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tools_fallback_text(tools: list[dict[str, Any]], call_format: str = "hermes") -> str:
    """The tools block appended to the system prompt when the chat template ignores `tools=`: the Hermes
    wording, or (xml) the same list with memrl's description of the xml call."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    if call_format == "xml":
        return (
            "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, write one <tool_call> block naming the function and giving each "
            "argument in its own <parameter> block:\n"
            "<tool_call>\n<function=FUNCTION-NAME>\n<parameter=ARGUMENT-NAME>\nvalue\n</parameter>\n</function>\n"
            "</tool_call>"
        )
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def render_system(tokenizer: Any, system: str, user: str, tools: list[dict[str, Any]],
                  template_kwargs: dict[str, Any] | None = None, call_format: str = "hermes") -> tuple[str, bool]:
    """(text of the system + user messages, without generation prompt; whether the template took `tools=`).
    `template_kwargs`: extra chat-template variables (enable_thinking); `call_format`: the fallback's."""
    kw = dict(template_kwargs or {})
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    plain = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw)
    if tools:
        try:
            with_tools = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False,
                                                       **kw)
        except Exception:  # noqa: BLE001 - a template may reject the argument; use the fallback
            with_tools = plain
        if with_tools != plain:
            return with_tools, True
        msgs[0] = {"role": "system", "content": system + tools_fallback_text(tools, call_format)}
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw), False
    return plain, False
