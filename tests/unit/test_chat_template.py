"""Prompts counted as vLLM counts them: the chat template and the BOS token (issue 32, item 14).

vLLM's chat endpoint renders the model's chat template and tokenizes it without adding
special tokens (the template writes the BOS); its completions endpoint tokenizes with
``add_special_tokens=True`` (Llama 3's post-processor adds the BOS). The expected texts
here are written out by hand from each template, not rendered by the code under test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gpuhost.hub_standin import BOS, EOS, preset_config, preset_repo, tokenizer_json
from tuner.search.config import load_config
from tuner.search.context import resolve
from tuner.search.edge import worst_case, worst_case_schedule
from workloads.build import build_schedule
from workloads.prompts import (
    TokenizerPromptBuilder,
    chat_template_note,
    completion_text,
    prompt_builder_for,
)
from workloads.schedule import Api
from workloads.spec import WorkloadError, load_workload

tokenizers = pytest.importorskip("tokenizers")

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
HEADER = ("<|start_header_id|>", "<|end_header_id|>")
EOT = "<|eot_id|>"
# In the manner of Llama 3.1's template (written here, not copied): the BOS, a system
# block that is always there ("Cutting Knowledge Date", today's date from strftime_now),
# a trimmed content per message, raise_exception on a role it does not take, and the
# assistant header as the generation prompt.
LLAMA_STYLE_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    '    {%- set date_string = strftime_now("%d %b %Y") %}\n'
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] | trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    '    {%- set system_message = "" %}\n'
    "{%- endif %}\n"
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
    '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
    "{{- system_message }}\n"
    '{{- "<|eot_id|>" }}\n'
    "{%- for message in messages %}\n"
    "    {%- if message['role'] not in ['user', 'assistant'] %}\n"
    "        {{- raise_exception('Only user and assistant roles follow the system message') }}\n"
    "    {%- endif %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)


def llama_style_text(messages: Sequence[Mapping[str, str]]) -> str:
    """What LLAMA_STYLE_TEMPLATE renders, written out."""
    date = datetime.now().strftime("%d %b %Y")
    system, rest = "", list(messages)
    if rest and rest[0]["role"] == "system":
        system, rest = rest[0]["content"], rest[1:]
    text = (
        f"{BOS}{HEADER[0]}system{HEADER[1]}\n\nCutting Knowledge Date: December 2023\n"
        f"Today Date: {date}\n\n{system}{EOT}"
    )
    for m in rest:
        text += f"{HEADER[0]}{m['role']}{HEADER[1]}\n\n{m['content']}{EOT}"
    return text + f"{HEADER[0]}assistant{HEADER[1]}\n\n"


def standin_text(messages: Sequence[Mapping[str, str]]) -> str:
    """What the stand-in hub's CHAT_TEMPLATE renders, written out."""
    body = "".join(f"<|{m['role']}|>\n{m['content']}{EOS}\n" for m in messages)
    return f"{BOS}{body}<|assistant|>\n"


def _write(directory: Path, files: Mapping[str, bytes | str | dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, dict):
            content = json.dumps(content, indent=2)
        if isinstance(content, str):
            content = content.encode()
        (directory / name).write_bytes(content)
    return directory


def llama_style_tokenizer() -> Any:
    """The stand-in hub's byte-level BPE with Llama 3's header tokens and its
    post-processor, which puts the BOS before every sequence it encodes with specials."""
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json().decode())
    tokenizer.add_special_tokens([*HEADER, EOT])
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    return tokenizer


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-3.1-style model directory: config (a 1024-token context), tokenizer with a
    BOS post-processor, tokenizer_config with the bos/eos tokens and the chat template."""
    directory = tmp_path_factory.mktemp("llama-style")
    config = dict(preset_config(LLAMA), max_position_embeddings=1024)
    _write(
        directory,
        {
            "config.json": config,
            "tokenizer.json": llama_style_tokenizer().to_str(),
            "tokenizer_config.json": {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOT,
                "chat_template": LLAMA_STYLE_TEMPLATE,
            },
        },
    )
    return directory


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in hub's Llama 3.1 repository's tokenizer files, as fetched."""
    files = preset_repo(LLAMA).files
    wanted = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    return _write(tmp_path_factory.mktemp("standin"), {n: files[n] for n in wanted})


def _tokens(directory: Path, text: str, *, special: bool) -> int:
    raw = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    return len(raw.encode(text, add_special_tokens=special).ids)


def _short(name: str, **update: Any) -> Any:
    spec = load_workload(name)
    return spec.model_copy(update={"duration_s": 20.0, **update})


# --- a chat request counts the rendered template --------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "written_out"), [("llama_dir", llama_style_text), ("standin_dir", standin_text)]
)
def test_a_chat_requests_tokens_are_the_rendered_templates(
    request: pytest.FixtureRequest, fixture: str, written_out: Any
) -> None:
    directory: Path = request.getfixturevalue(fixture)
    spec = _short("chat")  # sessions with history, a shared system prompt on most
    schedule = build_schedule(spec, prompt_builder=prompt_builder_for(directory))
    chats = [r for r in schedule if r.messages is not None]
    assert len(chats) > 20
    assert any(r.messages[0]["role"] == "system" for r in chats if r.messages)
    assert any(r.turn > 1 for r in chats)
    for r in chats:
        assert r.messages is not None
        expected = _tokens(directory, written_out(r.messages), special=False)
        assert r.prompt_tokens == expected, r.request_id


def test_the_template_adds_what_the_contents_alone_miss(llama_dir: Path) -> None:
    builder = prompt_builder_for(llama_dir)
    assert isinstance(builder, TokenizerPromptBuilder)
    user_only = builder.chat_overhead_tokens(["user"])
    # BOS, the default system block with its knowledge and today's date, two headers
    assert user_only > 20
    assert builder.chat_overhead_tokens(["system", "user"]) == user_only  # the block is one
    assert builder.chat_overhead_tokens(["user", "assistant", "user"]) > user_only


def test_a_role_the_template_refuses_is_one_line(llama_dir: Path) -> None:
    builder = prompt_builder_for(llama_dir)
    with pytest.raises(WorkloadError, match="refuses a conversation of roles user, system: "
                       "Only user and assistant roles follow the system message"):  # fmt: skip
        builder.chat_overhead_tokens(["user", "system"])


def test_named_templates_take_the_default_and_a_jinja_file_comes_first(tmp_path: Path) -> None:
    config = {
        "bos_token": BOS,
        "eos_token": EOS,
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS {{ messages[0]['content'] }}"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
        ],
    }
    named = _write(tmp_path / "named", {"tokenizer.json": tokenizer_json(),
                                        "tokenizer_config.json": config})  # fmt: skip
    builder = TokenizerPromptBuilder.from_model_dir(named)
    assert builder.chat_template is not None
    assert builder.chat_template.render([{"role": "user", "content": "hi"}]) == f"{BOS}hi"
    _write(
        named, {"chat_template.jinja": "J{{ messages|length }}{% generation %}x{% endgeneration %}"}
    )
    jinja = TokenizerPromptBuilder.from_model_dir(named)
    assert jinja.chat_template is not None
    assert jinja.chat_template.render([{"role": "user", "content": "hi"}]) == "J1x"


def test_a_template_that_loops_over_the_content_gets_text_parts(tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}{% for part in m['content'] %}"
        "[{{ part['type'] }}:{{ part['text'] }}]{% endfor %}{% endfor %}"
    )
    directory = _write(tmp_path, {"tokenizer.json": tokenizer_json(),
                                  "tokenizer_config.json": {"chat_template": template}})  # fmt: skip
    builder = TokenizerPromptBuilder.from_model_dir(directory)
    assert builder.chat_template is not None
    assert builder.chat_template.render([{"role": "user", "content": "hi"}]) == "[text:hi]"


# --- a completion counts the BOS its tokenizer adds -----------------------------------------


def test_a_completion_counts_the_bos_the_tokenizer_adds(llama_dir: Path) -> None:
    batch = load_workload("batch")
    spec = batch.model_copy(update={"arrival": batch.arrival.model_copy(update={"requests": 40})})
    schedule = build_schedule(spec, prompt_builder=prompt_builder_for(llama_dir))
    assert schedule and all(r.api is Api.COMPLETIONS and r.prompt for r in schedule)
    for r in schedule:
        assert r.prompt is not None
        assert r.prompt_tokens == _tokens(llama_dir, r.prompt, special=True)
        assert r.prompt_tokens == _tokens(llama_dir, r.prompt, special=False) + 1


def test_completion_text_leaves_room_for_the_bos(llama_dir: Path) -> None:
    builder = prompt_builder_for(llama_dir)
    text = completion_text(builder, 77, seed=3)
    assert _tokens(llama_dir, text, special=True) == 77


def test_a_llama_tokenizer_class_follows_add_bos_token(tmp_path: Path) -> None:
    """transformers rebuilds a LlamaTokenizerFast's post-processor from tokenizer_config."""
    base = {"tokenizer.json": llama_style_tokenizer().to_str()}
    off = _write(tmp_path / "off", {**base, "tokenizer_config.json": {
        "tokenizer_class": "LlamaTokenizerFast", "bos_token": BOS, "add_bos_token": False}})  # fmt: skip
    on = _write(tmp_path / "on", {**base, "tokenizer_config.json": {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS}})  # fmt: skip
    assert TokenizerPromptBuilder.from_model_dir(off).completion_overhead_tokens == 0
    assert TokenizerPromptBuilder.from_model_dir(on).completion_overhead_tokens == 1


# --- no chat template -----------------------------------------------------------------------


def test_a_model_without_a_chat_template_is_said_and_counts_contents(tmp_path: Path) -> None:
    directory = _write(tmp_path, {"tokenizer.json": tokenizer_json(),
                                  "tokenizer_config.json": {"bos_token": BOS}})  # fmt: skip
    note = chat_template_note(directory)
    assert note is not None and "has no chat template" in note
    assert "default chat template is no longer allowed" in note and "--chat-template" in note
    builder = prompt_builder_for(directory)
    assert builder.chat_overhead_tokens(["system", "user"]) == 0


def test_a_chat_workload_on_a_model_without_a_template_has_the_note(
    standin_dir: Path, tmp_path: Path
) -> None:
    bare = _write(tmp_path / "bare", {
        "tokenizer.json": tokenizer_json(), "tokenizer_config.json": {"bos_token": BOS}})  # fmt: skip
    common = {"model": "llama-3.1-8b", "backend": "sim", "gpu": "H100-80GB", "dry_run": True}
    chat = resolve(load_config(None, {**common, "model_dir": bare, "workload": "chat",
                                      "run_dir": tmp_path / "a"}))  # fmt: skip
    assert sum("has no chat template" in n for n in chat.notes) == 1
    batch = resolve(load_config(None, {**common, "model_dir": bare, "workload": "batch",
                                       "run_dir": tmp_path / "b"}))  # fmt: skip
    assert not any("chat template" in n for n in batch.notes)  # no chat request to refuse
    templated = resolve(load_config(None, {**common, "model_dir": standin_dir,
                                           "workload": "chat", "run_dir": tmp_path / "c"}))  # fmt: skip
    assert not any("chat template" in n for n in templated.notes)


# --- the OOM edge's worst case fits the context as vLLM counts it ---------------------------


def test_the_edges_worst_case_fits_the_context_with_the_template(
    llama_dir: Path, tmp_path: Path
) -> None:
    """A chat request of 923 content tokens and 100 output tokens on a 1024-token model:
    one token a message (the word rule) said 924 + 100 fits; the template makes the
    prompt ~960, so the worst case is cut to 924 as vLLM counts it, the BOS included."""
    limit, output, content = 1024, 100, 923
    workload = tmp_path / "long-chat.yaml"
    workload.write_text(
        yaml.safe_dump(
            {
                "name": "long-chat",
                "api": "chat",
                "arrival": {"kind": "poisson", "rate_per_s": 2.0},
                "prompt_tokens": {"kind": "fixed", "value": content},
                "output_tokens": {"kind": "fixed", "value": output},
                "duration_s": 5,
                "warmup": {"duration_s": 0, "requests": 0},
                "seed": 1,
            }
        )
    )
    ctx = resolve(
        load_config(
            None,
            {
                "model": str(llama_dir), "backend": "sim", "gpu": "H100-80GB",
                "workload": str(workload), "run_dir": tmp_path / "run", "dry_run": True,
            },
        )
    )  # fmt: skip
    assert ctx.model.max_position_embeddings == limit and ctx.base.max_model_len is None
    real = max(
        _tokens(llama_dir, llama_style_text(r.messages), special=False)
        for r in build_schedule(ctx.workload, prompt_builder=prompt_builder_for(llama_dir))
        if r.messages is not None
    )
    assert real + output > limit >= content + 1 + output  # over only with the template
    case = worst_case(ctx, 3)
    assert (case.prompt_tokens, case.output_tokens) == (limit - output, output)
    for r in worst_case_schedule(case, ctx.model_dir):
        assert r.prompt is not None
        seen = _tokens(llama_dir, r.prompt, special=True)  # vLLM's completions count
        assert seen == r.prompt_tokens == case.prompt_tokens
        assert seen + r.max_tokens <= limit
