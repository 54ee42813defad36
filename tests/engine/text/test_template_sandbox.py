"""engine/text/template_sandbox.py: the bounds a chat template cannot pass (a request's
own template under --trust-request-chat-template could allocate gigabytes or run for
ever on a worker thread)."""

from __future__ import annotations

import time

import pytest

from engine.text.chat_template import ChatTemplateError, render_chat_template

MSGS = [{"role": "user", "content": "x" * 1000}]


@pytest.mark.parametrize("source, words", [
    ('{{ "x" * 300000000 }}', "repetition"),  # was folded (300 MB) as it compiled
    ("{{ [1] * 300000000 }}", "repetition"),
    ("{{ 10 ** 100000 }}", "power"),
    ("{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}", "renders more"),
])
def test_what_a_template_may_build_is_bounded(source, words):
    with pytest.raises(ChatTemplateError, match=words):
        render_chat_template(source, MSGS)


def test_a_request_template_has_a_deadline():
    source = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
              "{% endfor %}done")
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="took longer than 0.5 s"):
        render_chat_template(source, MSGS, deadline_s=0.5)
    assert time.monotonic() - t0 < 5


def test_ordinary_templates_render_as_before():
    source = ("{% for m in messages %}<{{ m.role }}>{{ m.content[:3] * 2 }}{% endfor %}"
              "{{ 2 ** 10 }}")
    assert render_chat_template(source, MSGS, deadline_s=1.0) == "<user>xxxxxx1024"
    assert render_chat_template(source, MSGS) == "<user>xxxxxx1024"


S = '{% set s = "x" * 9000000 %}'  # two of it are past MAX_RENDER_CHARS


@pytest.mark.parametrize("source", [
    S + "{% set t = s ~ s %}ok",  # each step a doubling: gigabytes in a few lines
    S + "{% set t = s + s %}ok",
    S + '{% set t = "%s%s" % (s, s) %}ok',
    S + "{% set t = [s, s]|join %}ok",
    S + "{% set t = [s, s]|string %}ok",
    S + '{% set t = s.replace("x", "yy") %}ok',
    S + '{% set t = s|replace("x", "yy") %}ok',
    S + '{% set t = "{}{}".format(s, s) %}ok',
    S + "{% set t = [s] + [s] %}{% set u = t|join %}ok",
    '{% set t = "x".ljust(17000000) %}ok',
    '{% set t = "x"|center(17000000) %}ok',
    '{% set t = "%17000000d" % 1 %}ok',
    '{% set t = "%*d" % (17000000, 1) %}ok',
    '{% set t = "{:>17000000}".format(1) %}ok',
    "{% set t = [1]|tojson(indent=17000000) %}ok",
    S + "{% set t = [1, 2, 3]|tojson(separators=(s, s)) %}ok",
    S + '{% set t = "a.com b.com"|urlize(target=s) %}ok',
    "{% set t = [1]|slice(17000000)|list %}ok",
    '{% set t = ("a\n" * 100)|indent("x" * 200000) %}ok',
    "{% set n = 2 ** 2000 %}{% set n = n * n * n %}ok",  # squarings: 2**(2000 * 2**k)
])
def test_what_a_template_builds_without_output_is_bounded(source):
    """Values a template builds but never writes out were only bounded for ``*``: a few
    concatenations or a width argument allocated gigabytes before any output."""
    with pytest.raises(ChatTemplateError, match="past the"):
        render_chat_template(source, MSGS)
