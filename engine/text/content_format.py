"""Which shape of message ``content`` a chat template expects, read once from its source
(the rule vLLM applies): a template that loops over a message's content renders lists
of parts ("openai"); any other prints the content as text ("string").

    detect_content_format(source) -> "string" | "openai"

engine/text/chat_template.normalize_messages shapes every message for that format."""

from __future__ import annotations

import jinja2
from jinja2 import nodes
from jinja2.ext import loopcontrols

CONTENT_FORMATS = ("string", "openai")


def _is_content(node: nodes.Node, aliases: set[str]) -> bool:
    """``x.content`` / ``x['content']`` (through any filters, e.g. ``| selectattr``), or a
    name assigned from one."""
    while isinstance(node, nodes.Filter | nodes.Test) and node.node is not None:
        node = node.node
    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    return isinstance(node, nodes.Name) and node.name in aliases


def detect_content_format(source: str | None) -> str:
    """"openai" when a ``{% for %}`` iterates a message's content, else "string" (also
    for no template or one that does not parse: rendering reports that error)."""
    if not source:
        return "string"
    try:
        tree = jinja2.Environment(extensions=[loopcontrols]).parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    aliases: set[str] = set()
    for assign in tree.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name) and _is_content(assign.node, aliases):
            aliases.add(assign.target.name)
    loops = tree.find_all(nodes.For)
    return "openai" if any(_is_content(f.iter, aliases) for f in loops) else "string"
