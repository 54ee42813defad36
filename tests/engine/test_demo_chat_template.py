"""The demo model's converted chat template: tool-less conversations render exactly what
the GGUF's own ChatML template renders; tools, calls and results render in the
Hermes/Qwen convention."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engine.demo_model.tokenizer_files import chat_template
from engine.text.chat_template import render_chat_template

# SmolLM2-135M-Instruct's template as its GGUF stores it
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
           "%}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
           "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' "
           "+ message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
           "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
NEW = chat_template(SimpleNamespace(chat_template=SMOLLM2))
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "2+2?"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "x"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("gen", [True, False])
def test_tool_less_conversations_render_as_the_gguf_template(messages, gen):
    assert render_chat_template(NEW, messages, gen) == render_chat_template(SMOLLM2, messages,
                                                                            gen)


def test_tools_calls_and_results_render_in_the_hermes_convention():
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
    ]
    text = render_chat_template(NEW, messages, True, tools=TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in system
    call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n'
            '</tool_call>')
    assert ("<|im_start|>assistant\n" + call % "Paris" + "\n" + call % "Rome" + "<|im_end|>"
            in text)
    assert "<|im_start|>tool\n<tool_response>\n18C\n</tool_response><|im_end|>" in text
    assert text.endswith("25C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_already_knows_tools_is_kept():
    own = "{% if tools %}T{% endif %}{{ messages[0]['content'] }}"
    assert chat_template(SimpleNamespace(chat_template=own)) == own
