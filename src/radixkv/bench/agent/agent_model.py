"""The checkpoint `radixkv bench agent` serves, and a view of it whose chat template renders tools.

Small chat models often ship a template that ignores `tools` (SmolLM2's is plain ChatML), and our
server refuses `tools` such a template cannot show. For a ChatML model the benchmark can serve a
VIEW of the checkpoint instead: a folder of links to its files with a Hermes-style ChatML template
(tools listed in the system turn as JSON, calls as `<tool_call>` JSON, results as
`<tool_response>` user turns: the format of Qwen2.5 and NousResearch's Hermes models), which both
engines then serve, so both render the same prompt and parse calls with their `hermes` parser.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Written the way Hugging Face templates are (environments trim block tags' newlines): every
# character of output comes from an expression. Arguments given as a JSON string are shown as is.
HERMES_CHATML = r"""{%- if messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = 'You are a helpful assistant.' %}
    {%- set rest = messages %}
{%- endif %}
{{- '<|im_start|>system\n' + system }}
{%- if tools %}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in rest %}
    {%- if message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content }}
        {{- '\n</tool_response><|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + (message.content or '') }}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function or call %}
            {{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {%- if fn.arguments is string %}
                {{- fn.arguments }}
            {%- else %}
                {{- fn.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def model_dir(name: str) -> Path:
    """`default` → the embedded model's converted checkpoint; a seeded name of
    `radixkv.bench.tiny_model` (`tiny`, `tiny-32k`, `1b`) → built on first use; an embedded short
    name (`gemma3-270m`) → its converted checkpoint; anything else: a checkpoint directory."""
    from radixkv.bench.tiny_model import MODELS, resolve_model
    from radixkv.model.checkpoints.default import default_model_path

    if name == "default":
        return Path(default_model_path())
    if name in MODELS:
        return Path(str(resolve_model(name)))
    from radixkv.model.checkpoints.embedded import resolve_model as resolve_embedded

    return Path(resolve_embedded(name))


def chat_template(path: Path) -> str:
    """The checkpoint's chat template source ('' when it has none)."""
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    try:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return ""
    tpl = cfg.get("chat_template")
    return tpl if isinstance(tpl, str) else ""


def renders_tools(path: Path) -> bool:
    """Whether the checkpoint's own template shows a `tools` list."""
    return "tools" in chat_template(path)


def is_chatml(path: Path) -> bool:
    return "<|im_start|>" in chat_template(path)


def hermes_view(path: Path, out: Path) -> Path:
    """A folder in `out` of links to `path`'s files, with the Hermes ChatML template instead of
    the checkpoint's own (in chat_template.jinja and tokenizer_config.json). Rebuilt each call."""
    if not is_chatml(path):
        raise ValueError(f"{path.name}: not a ChatML model; use --tools-mode system")
    view = out / f"{path.name}-hermes-tools"
    view.mkdir(parents=True, exist_ok=True)
    for item in view.iterdir():
        item.unlink()
    for item in path.iterdir():
        if item.name in ("chat_template.jinja", "tokenizer_config.json") or item.is_dir():
            continue
        os.symlink(item.resolve(), view / item.name)
    cfg = {}
    if (path / "tokenizer_config.json").exists():
        cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = HERMES_CHATML
    (view / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    (view / "chat_template.jinja").write_text(HERMES_CHATML)
    return view


def max_positions(path: Path) -> int | None:
    """The checkpoint's context length from its config (text_config included), if it says."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    n = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get(
        "max_position_embeddings"
    )
    return int(n) if n else None
