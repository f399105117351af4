"""What the tool-calling end-to-end tests share: a Hermes-style tool chat template (so the server
picks the `hermes` parser) for the tiny seeded Llama, the tool schemas its forced calls must
validate against, and the engine they run on."""

from __future__ import annotations

import shutil
from pathlib import Path

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": NAME, "arguments": ARGUMENTS}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
{%- if message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
BOOK = {
    "type": "object",
    "properties": {
        "guests": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "vip": {"type": "boolean"},
        "when": {
            "type": "object",
            "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
            "required": ["hour"],
            "additionalProperties": False,
        },
    },
    "required": ["guests", "vip", "when"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "book_table": BOOK}


def tool_engine(path: Path) -> Engine:
    cfg = {"num_slots": 8192, "max_model_len": 1024, "seed": 0, "page_size": 16, "max_n": 8}
    return Engine(str(path), EngineConfig(**cfg))


def with_tool_template(model_dir: Path, out: Path) -> Path:
    """A copy of `model_dir` whose chat template is TEMPLATE."""
    shutil.copytree(model_dir, out)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out
