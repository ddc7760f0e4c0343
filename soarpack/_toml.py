"""TOML reading on Python 3.10 (tomli) and 3.11+ (tomllib), with a bound on nesting.

The parsers recurse once per level of arrays and inline tables (a few thousand levels end in RecursionError), and
a dotted key of N parts costs them O(N²) memory (a 4 MiB line of `a.a.a...` takes tens of GB). No recipe, profile,
mix or catalogue nests more than a few levels, so text nested deeper than MAX_DEPTH is refused before it is parsed,
as not valid TOML: `TOMLDecodeError` here is raised for both.
"""

import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised by the 3.10 CI leg
    import tomli as tomllib

MAX_DEPTH = 64  # tables, arrays, inline tables and dotted-key parts, counted together


class TOMLDecodeError(ValueError):
    """Not valid TOML (the parser's message), or nested deeper than MAX_DEPTH."""


# Strings and comments (skipped whole: their brackets and dots are text), then the characters that open, close or
# separate a level. Multi-line strings first, so `"""` is not read as an empty string and a quote.
_TOKEN = re.compile(r'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""|\'\'\'.*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
                    r"|'[^'\n]*'|#[^\n]*|[\[\]{}.=,\n]", re.S)


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep the tables `text` defines nest (headers' and keys' dotted parts, arrays, inline tables), counted
    without parsing; stops counting once past `limit`. Text that is not valid TOML gets some number: the parser
    says what is wrong with it."""
    deepest = 0
    header = 1  # parts of the current [table] header
    stack: list = []  # open arrays and inline tables: [kind, depth, in_key, key_parts]
    mode, parts = "key", 1  # at the top level: reading a key, a [header], or a value
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if len(tok) > 1 or tok[0] in "\"'#":
            continue  # a string or a comment
        if not stack:
            if mode == "key":
                if tok == "[":
                    mode, header = "header", 1
                elif tok == ".":
                    parts += 1
                elif tok == "=":
                    mode, depth = "value", header + parts
                    deepest = max(deepest, depth)
                elif tok == "\n":
                    parts = 1
            elif mode == "header":
                if tok == ".":
                    header += 1
                elif tok == "[":
                    header += 1  # [[array of tables]]: one level more
                elif tok == "]":
                    mode = "after"
                    deepest = max(deepest, header)
            elif mode == "value":
                if tok == "[":
                    stack.append(["array", depth + 1, False, 1])
                elif tok == "{":
                    stack.append(["table", depth + 1, True, 1])
                elif tok == "\n":
                    mode, parts = "key", 1
            elif tok == "\n":  # after a header
                mode, parts = "key", 1
        else:
            frame = stack[-1]
            kind, level = frame[0], frame[1]
            if kind == "table" and frame[2]:  # reading an inline table's key
                if tok == ".":
                    frame[3] += 1
                elif tok == "=":
                    frame[2] = False
                    deepest = max(deepest, level + frame[3])
                elif tok == "}":
                    stack.pop()
                continue
            value_level = level + (frame[3] if kind == "table" else 0)
            if tok == "[":
                stack.append(["array", value_level + 1, False, 1])
            elif tok == "{":
                stack.append(["table", value_level + 1, True, 1])
            elif tok in "]}":
                stack.pop()
            elif tok == "," and kind == "table":
                frame[2], frame[3] = True, 1
        if stack:
            deepest = max(deepest, stack[-1][1])
        if deepest > limit:
            return deepest
    return deepest


def loads(text: str) -> dict:
    """tomllib.loads, refusing text nested deeper than MAX_DEPTH (TOMLDecodeError for that and for bad TOML)."""
    if not isinstance(text, str):
        raise TypeError(f"TOML text must be str, not {type(text).__name__}")
    if nesting_depth(text) > MAX_DEPTH:
        raise TOMLDecodeError(f"nested more than {MAX_DEPTH} levels deep (tables, arrays and dotted keys together)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TOMLDecodeError(str(exc)) from None
    except RecursionError:  # what the depth count did not foresee
        raise TOMLDecodeError("nested too deep for the parser") from None


def load(fh) -> dict:
    """loads of a binary file object's UTF-8 text, as tomllib.load reads it."""
    return loads(fh.read().decode("utf-8"))
