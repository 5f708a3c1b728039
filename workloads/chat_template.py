"""A model's chat template, rendered as vLLM's chat endpoint renders it.

vLLM's ``/v1/chat/completions`` turns the messages into one prompt with the model's
chat template (``transformers``' ``apply_chat_template``, ``tokenize=False``), then
tokenizes that text with ``add_special_tokens=False`` (``ChatCompletionRequest``'s
default: the template writes the BOS token itself, so it is not added twice). Its
``/v1/completions`` tokenizes the prompt with ``add_special_tokens=True``: the
tokenizer's post-processor adds what it adds (Llama 3's BOS; nothing for Qwen 2.5).

This module renders the template without ``transformers`` (not installed beside the
tuner), with ``jinja2`` set up as ``transformers`` sets it up: a sandboxed environment
with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
``{% generation %}`` block that renders its body, ``tojson`` without ASCII escapes, the
globals ``raise_exception`` and ``strftime_now``, and as variables ``messages``,
``tools``/``documents`` (none), ``add_generation_prompt`` and the tokenizer's special
tokens (``bos_token``, ``eos_token``, ...).

Where the template comes from, in the order vLLM's ``resolve_hf_chat_template`` and
``transformers`` find it: ``chat_template.jinja``, ``chat_template.json``
(``{"chat_template": ...}``, a processor's), then ``tokenizer_config.json``'s
``chat_template`` (a string, or named templates of which ``default`` is taken). A model
without one has no chat template: vLLM then answers every chat request 400 ("As of
transformers v4.44, default chat template is no longer allowed, so you must provide a
chat template if the tokenizer does not define one.") unless the server is given one
(``vllm serve --chat-template``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from workloads.spec import WorkloadError

# transformers' special tokens, passed to the template under these names
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
NO_TEMPLATE_ERROR = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one."
)  # vLLM's 400 answer to a chat request (vllm/entrypoints/openai/.../protocol.py)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a model directory's file; {} where the file is absent."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{str(path)!r} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise WorkloadError(f"{str(path)!r} is not a JSON object")
    return data


def token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def special_tokens(model_dir: Path) -> dict[str, Any]:
    """The special tokens the template sees, as ``tokenizer.special_tokens_map`` holds them."""
    config = read_json(model_dir / "tokenizer_config.json")
    fallback = read_json(model_dir / "special_tokens_map.json")
    tokens: dict[str, Any] = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = token_text(config.get(name, fallback.get(name)))
        if text is not None:
            tokens[name] = text
    extra = config.get("additional_special_tokens", fallback.get("additional_special_tokens"))
    if isinstance(extra, list):
        texts = [t for t in (token_text(e) for e in extra) if t is not None]
        if texts:
            tokens["additional_special_tokens"] = texts
    return tokens


def template_source(model_dir: Path) -> tuple[str, str] | None:
    """The chat template's text and the file it came from; None where the model has none."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), jinja.name
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{str(jinja)!r} cannot be read: {exc}") from exc
    for name in ("chat_template.json", "tokenizer_config.json"):
        template = _named_default(read_json(model_dir / name).get("chat_template"), name)
        if template is not None:
            return template, name
    return None


def _named_default(value: object, where: str) -> str | None:
    """A template string, or the ``default`` of named templates (as transformers picks it
    for a request without tools)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list):
        named = {str(t.get("name")): t.get("template") for t in value if isinstance(t, Mapping)}
        default = named.get("default")
        if isinstance(default, str):
            return default
        if named:
            raise WorkloadError(
                f"{where} has chat templates {', '.join(sorted(named))} and no 'default' one; "
                "accepted: a template named 'default' (the one vLLM uses without tools)"
            )
    return None


class ChatTemplate:
    """One model's chat template, compiled once."""

    def __init__(self, source: str, *, tokens: Mapping[str, Any], origin: str) -> None:
        self.origin = origin
        self._tokens = dict(tokens)
        self._template = _compile(source, origin)
        self._parts = _iterates_content(source)  # vLLM's "openai" content format

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ChatTemplate | None:
        found = template_source(model_dir)
        if found is None:
            return None
        source, origin = found
        return cls(source, tokens=special_tokens(model_dir), origin=origin)

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text vLLM's chat endpoint makes of these messages (with the
        generation prompt, as ``add_generation_prompt`` defaults to true there)."""
        conversation: list[dict[str, Any]] = [
            {"role": m["role"], "content": _content(m["content"], self._parts)} for m in messages
        ]
        jinja2 = _import_jinja2()
        try:
            text: str = self._template.render(
                messages=conversation,
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self._tokens,
            )
        except jinja2.TemplateError as exc:
            roles = ", ".join(m["role"] for m in messages)
            raise WorkloadError(
                f"the model's chat template ({self.origin}) refuses a conversation of roles "
                f"{roles}: {exc}; vLLM would answer these chat requests 400"
            ) from exc
        return text


def _content(text: str, parts: bool) -> str | list[dict[str, str]]:
    """A message's content as vLLM hands it to the template: the string, or (a template
    that loops over the content) one text part."""
    return [{"type": "text", "text": text}] if parts else text


def _import_jinja2() -> Any:
    try:
        return importlib.import_module("jinja2")
    except ImportError as exc:
        raise WorkloadError(
            "rendering a model's chat template needs the 'jinja2' package, which is not "
            "installed; install it (pip install jinja2)"
        ) from exc


def _compile(source: str, origin: str) -> Any:
    """The template compiled in an environment like transformers' ``_compile_jinja_template``."""
    jinja2 = _import_jinja2()
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant masks): its body as is."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it so)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_render_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _render_body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise WorkloadError(
            f"the model's chat template ({origin}) is not valid Jinja: {exc}"
        ) from exc


def _iterates_content(source: str) -> bool:
    """Whether the template loops over a message's content (vLLM's ``_detect_content_format``
    then hands it a list of parts, "openai"; else the string)."""
    jinja2 = _import_jinja2()
    from jinja2 import nodes

    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateError:
        return False  # the sandbox's own parse (with its generation tag) is the judge
    for loop in tree.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Filter) and it.node is not None:
            it = it.node
        if (
            isinstance(it, nodes.Getitem)
            and isinstance(it.arg, nodes.Const)
            and it.arg.value == "content"
        ):
            return True
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return True
    return False
