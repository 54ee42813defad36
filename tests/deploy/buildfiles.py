"""Readers for the container build files, enough to check them without a container engine.

    instrs = parse_dockerfile(text)      # list[Instruction], continuation lines joined
    ignore = DockerIgnore.from_text(text)
    ignore.excluded("ext/csrc/ops.cpp")  # False: the file is in the build context
    read_toml(path)                      # dict (tomllib, or tomli before Python 3.11)

``DockerIgnore`` follows Docker's (moby patternmatcher) rules: ``*`` and ``?`` never match
``/``, ``**`` matches any number of path segments, a pattern excludes a path when it
matches the path or one of its parent directories, ``!`` re-includes, and the last
matching pattern wins. Paths are relative to the build context, ``/``-separated.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def read_toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


@dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction: ``KEYWORD --flag=v ... args`` in build stage ``stage``."""

    stage: str
    keyword: str  # upper case: FROM, RUN, COPY, ...
    flags: dict[str, str]
    args: str  # the rest of the instruction, continuation lines joined with spaces
    line: int  # 1-based line of the keyword

    def words(self) -> list[str]:
        """The arguments as a list: the JSON (exec) form as written, else shell words."""
        if self.args.startswith("["):
            return list(json.loads(self.args))
        return shlex.split(self.args)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        if not buf:
            start = n
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        out.append((start, " ".join(p for p in buf if p)))
        buf = []
    if buf:
        out.append((start, " ".join(buf)))
    return out


def parse_dockerfile(text: str) -> list[Instruction]:
    instrs: list[Instruction] = []
    stage = ""
    for n, line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, str] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            stage = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(instrs))
        instrs.append(Instruction(stage, keyword, flags, rest, n))
    return instrs


def env_of(instr: Instruction) -> dict[str, str]:
    """``ENV A=1 B="x y"`` (or the legacy ``ENV A 1``) as a dict."""
    words = shlex.split(instr.args)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


def arg_of(instr: Instruction) -> tuple[str, str | None]:
    """``ARG NAME=default`` -> (NAME, default); ``ARG NAME`` -> (NAME, None)."""
    name, eq, default = instr.args.partition("=")
    return name.strip(), (default.strip().strip('"') if eq else None)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1:end] + "]")  # Go syntax: [^...] negates
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True, slots=True)
class _Rule:
    regex: re.Pattern[str]
    include: bool  # a `!pattern` line


@dataclass(frozen=True, slots=True)
class DockerIgnore:
    rules: tuple[_Rule, ...] = field(default_factory=tuple)

    @classmethod
    def from_text(cls, text: str) -> DockerIgnore:
        rules = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            include = line.startswith("!")
            pattern = posixpath.normpath(line[1:].strip() if include else line).lstrip("/")
            rules.append(_Rule(_pattern_regex(pattern), include))
        return cls(tuple(rules))

    def excluded(self, path: str) -> bool:
        parts = path.strip("/").split("/")
        prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        result = False
        for rule in self.rules:
            if any(rule.regex.match(p) for p in prefixes):
                result = not rule.include
        return result
