"""Shard patterns as webdataset users write them: brace lists and ranges, then `*`/`?`/`**` wildcards.

`braceexpand("crawl/{00000..00002}.tar")` yields crawl/00000.tar, crawl/00001.tar, crawl/00002.tar
(a range keeps the zero padding of its start), `{a,b}` yields both, braces nest. Expansion is lazy:
`{00000..99999}` is a generator, never a list of 10^5 names.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
_WILD = re.compile(r"[*?\[]")


def _closing(pattern: str, start: int) -> int:
    """Index of the `}` that closes the `{` at `start`, or -1."""
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top(body: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in body:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def _alternatives(body: str, pattern: str) -> Iterator[str]:
    m = _RANGE.match(body)
    if m:
        a, b, step = int(m[1]), int(m[2]), int(m[3] or 1)
        if step == 0:
            raise ValueError(f"{pattern!r}: a brace range's step must not be 0")
        width = len(m[1].lstrip("-")) if m[1].lstrip("-").startswith("0") else 0
        sign = 1 if b >= a else -1
        for n in range(a, b + sign, sign * step):
            yield f"{n:0{width}d}" if width else str(n)
        return
    parts = _split_top(body)
    if len(parts) == 1:  # "{x}" is not a brace expression (as in bash): keep it literally
        yield "{" + body + "}"
        return
    yield from parts


def braceexpand(pattern: str) -> Iterator[str]:
    """Expand `{a,b}` lists and `{00000..09999}` ranges (left to right, nested), lazily."""
    start = pattern.find("{")
    if start < 0:
        yield pattern
        return
    end = _closing(pattern, start)
    if end < 0:
        raise ValueError(f"{pattern!r}: unbalanced '{{' at character {start}; "
                         "write brace ranges as {00000..09999} and lists as {a,b}")
    head, body, tail = pattern[:start], pattern[start + 1:end], pattern[end + 1:]
    literal = _split_top(body) == [body] and not _RANGE.match(body)
    for alt in _alternatives(body, pattern):
        for inner in ([alt] if literal else braceexpand(alt)):
            for rest in braceexpand(tail):
                yield head + inner + rest


def has_wildcard(pattern: str) -> bool:
    return bool(_WILD.search(pattern))


def literal_prefix(pattern: str) -> str:
    """The part before the first wildcard: the key prefix an object-store listing starts from."""
    m = _WILD.search(pattern)
    return pattern if m is None else pattern[:m.start()]


def wildcard_regex(pattern: str) -> re.Pattern:
    """`*` and `?` stay within one path segment, `**` crosses `/` (as fsspec's and bash's globstar)."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                raise ValueError(f"{pattern!r}: unbalanced '[' at character {i}")
            cls = pattern[i + 1:j].replace("\\", "\\\\")
            neg = cls.startswith("!")
            cls = cls[1:] if neg else cls
            out.append("[" + ("^" if neg else "") + ("\\" + cls if cls.startswith("^") else cls) + "]")
            i = j + 1
            continue
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out) + r"\Z")
