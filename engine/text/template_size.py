"""What a chat template may build (engine/text/template_sandbox.py): each operation that
makes a new string, list or number from others is checked before it runs, by the size of
what it would make. A value's size is the length of its text (a list's: its items',
counted as often as they occur, as ``str`` and ``join`` write them); past MAX_RENDER_CHARS
(or MAX_POWER_BITS for a number) the operation raises ChatTemplateBoundError."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import jinja2
from jinja2.utils import Namespace

MAX_RENDER_CHARS = 16 * 2**20  # far past any prompt max_model_len holds
MAX_POWER_BITS = 4096
_NUMBERS = re.compile(r"\d+")


class ChatTemplateBoundError(jinja2.TemplateError):
    """A template went past a bound (the caller reports it as a ChatTemplateError)."""


def size(value: Any) -> int:
    """About the characters of ``value``'s text: exact for strings, at least it for
    containers (each shared item counted once per place it holds, computed once)."""
    return _size(value, {})


def _size(value: Any, seen: dict[int, int]) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 1
    if isinstance(value, Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")
    if not isinstance(value, (list, tuple, set, frozenset, Mapping)):
        return 8
    key = id(value)
    if key in seen:
        return seen[key]
    seen[key] = 2  # a cycle (a namespace holding itself) counts its brackets
    items = value.items() if isinstance(value, Mapping) else ((v, "") for v in value)
    total = 2
    for k, v in items:
        total += 2 + _size(k, seen) + _size(v, seen)
        if total > MAX_RENDER_CHARS:
            break
    seen[key] = total
    return total


def check(n: int, what: str) -> None:
    if n > MAX_RENDER_CHARS:
        raise ChatTemplateBoundError(f"{what} of {n} characters is past the "
                                     f"{MAX_RENDER_CHARS} a template may build")


def _ints(values: Any) -> int:
    return sum(max(v, 0) for v in values if isinstance(v, int) and not isinstance(v, bool))


def _widths(fmt: str) -> int:
    """The widths and precisions a format string may pad to (an upper bound: every
    number in it)."""
    return sum(int(d) if len(d) < 12 else MAX_RENDER_CHARS + 1 for d in _NUMBERS.findall(fmt))


def formatted(fmt: str, args: Any) -> int:
    """An upper bound of ``fmt % args`` or ``fmt.format(*args)``'s length."""
    values = list(args.values()) if isinstance(args, Mapping) else (
        list(args) if isinstance(args, (list, tuple)) else [args])
    return len(fmt) + _widths(fmt) + sum(size(v) for v in values) + _ints(values)


def check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "+" and not (isinstance(left, int) and isinstance(right, int)):
        check(size(left) + size(right), "a sum")
    elif operator == "%" and isinstance(left, str):
        check(formatted(left, right), "a formatted string")
    elif operator == "*" and isinstance(left, int) and isinstance(right, int) and (
            left.bit_length() + right.bit_length() > MAX_POWER_BITS):
        raise ChatTemplateBoundError(f"a product past the {MAX_POWER_BITS} bits a "
                                     "template may build")
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(n, int) and not isinstance(seq, (int, float)):
                check(size(seq) * max(n, 0), "a repetition")


def check_output(value: Any) -> Any:
    """Jinja's finalize: a value written out is checked before it becomes text."""
    if not isinstance(value, str):
        check(size(value), "an output")
    return value


def bounded_concat(parts: tuple[Any, ...]) -> str:
    """``a ~ b ~ ...``."""
    check(sum(size(p) for p in parts), "a concatenation")
    return "".join(str(p) for p in parts)


def _replaced(text: str, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(text)
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(len(new) - len(old), 0)


def _joined(items: Any, sep: Any = "") -> int:
    n = len(items) if isinstance(items, (list, tuple, set, frozenset, Mapping, str)) else 0
    return size(items) + max(n - 1, 0) * (len(sep) if isinstance(sep, str) else 8)


def _str_method(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """An upper bound of the result of ``text.<name>(*args, **kwargs)``."""
    if name in ("format", "format_map"):
        values = [*args, *kwargs.values()]
        return formatted(text, values[0] if name == "format_map" and values else values)
    if name == "replace":
        return _replaced(text, *args[:3], **kwargs)
    if name == "join":
        return _joined(args[0], text) if args else 0
    if name == "expandtabs":
        return len(text) + text.count("\t") * _ints([*args, *kwargs.values(), 8])
    return len(text) + _ints([*args, *kwargs.values()])  # ljust, center, zfill, ...


def bound_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A call from the template: a str method is checked by what it would make."""
    func = getattr(func, "__wrapped__", func)  # the sandbox's wrapper of str.format
    owner = getattr(func, "__self__", None)
    if isinstance(owner, str):
        check(_str_method(owner, func.__name__, args, kwargs), "a string")


def _texts(values: Any) -> int:
    """The characters of the strings among ``values`` (and in their lists)."""
    return sum(size(v) for v in values if isinstance(v, (str, list, tuple)))


def _indent_size(text: Any, width: Any = 4, *args: Any, **kwargs: Any) -> int:
    lines = str(text).count("\n") + 1 if isinstance(text, str) else 1
    pad = len(width) if isinstance(width, str) else _ints([width])
    return size(text) + lines * pad


# filter -> an upper bound of its result's size, from its arguments
_FILTER_SIZES: dict[str, Callable[..., int]] = {
    "center": lambda v, width=80, *a, **k: size(v) + _ints([width]),
    "indent": _indent_size,
    "format": lambda v, *a, **k: formatted(str(v), [*a, *k.values()] if k else a),
    "join": lambda v, d="", *a, **k: _joined(v, d),
    "replace": lambda v, old="", new="", count=None, *a, **k: _replaced(
        str(v), old, new, -1 if count is None else count) if isinstance(v, str) else size(v),
    "string": lambda v, *a, **k: size(v),
    "pprint": lambda v, *a, **k: 2 * size(v),
    "wordwrap": lambda v, width=79, brk=True, wrapstring=None, *a, **k: size(v) * (
        1 + (len(wrapstring) if isinstance(wrapstring, str) else 1)),
    # each item may get the indent and the separators (and an urlize link its attributes)
    "tojson": lambda v, *a, **k: size(v) * (2 + _ints([*a, *k.values()])
                                            + _texts([*a, *k.values()])),
    "urlize": lambda v, *a, **k: size(v) * (1 + _texts([*a, *k.values()])),
    "batch": lambda v, n=1, *a, **k: _ints([n]),
    "slice": lambda v, n=1, *a, **k: _ints([n]),
}


def bound_filters(filters: MutableMapping[str, Any]) -> None:
    """Each filter of _FILTER_SIZES checks its result's size before it runs."""
    for name in _FILTER_SIZES:
        if name in filters:
            filters[name] = bounded_filter(name, filters[name])


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, the filter ``name``, checking its result's size first."""
    estimate = _FILTER_SIZES[name]
    passed = getattr(func, "jinja_pass_arg", None)  # an environment or context first

    def run(*args: Any, **kwargs: Any) -> Any:
        check(estimate(*(args[1:] if passed else args), **kwargs),
              f"the {name} filter's result")
        return func(*args, **kwargs)

    if passed is not None:
        run.jinja_pass_arg = passed  # type: ignore[attr-defined]
    return run
