"""Which reasoning parser ``auto`` picks for a <think> template (service/tool_calls/
select.py): ``think-open`` exactly where the template's generation prompt leaves a section
open, read from the template rendered with and without it, not from how its source
spells the tag."""

from __future__ import annotations

import pytest

from engine.text.chat_template import render_chat_template
from service.tool_calls.select import choose_parsers

TURNS = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n"
         "{% endfor %}")
# QwQ's form: the generation prompt opens the section
OPENS = (TURNS + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}"
         "{% endif %}")
# Qwen3's form: earlier turns' reasoning written as '<think>\n' + ...; the generation prompt
# opens nothing (and closes an empty section when thinking is off)
HISTORY = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n"
           "{% if m.reasoning_content %}{{ '<think>\\n' + m.reasoning_content + "
           "'\\n</think>\\n\\n' }}{% endif %}{{ m.content }}<|im_end|>\\n{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
           "{% if enable_thinking is defined and enable_thinking is false %}"
           "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}")
# DeepSeek-R1's form: the tag right after the assistant marker, in one literal
R1 = TURNS + "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}"


class TemplateTokenizer:
    """A tokenizer with a chat template and no reasoning tokens."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def token_to_id(self, token: str) -> None:
        return None

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs) -> str:
        return render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    {"bos_token": "", "eos_token": ""}, **kwargs)


@pytest.mark.parametrize("template,want", [(OPENS, "think-open"), (HISTORY, "think"),
                                           (R1, "think-open")], ids=["qwq", "qwen3", "r1"])
def test_auto_reads_the_generation_prompt(template, want):
    assert choose_parsers(TemplateTokenizer(template)).reasoning_parser == want


def test_a_template_without_think_gets_no_reasoning_parser():
    assert choose_parsers(TemplateTokenizer(TURNS)).reasoning_parser is None
