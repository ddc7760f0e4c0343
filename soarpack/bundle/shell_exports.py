"""The variables a shell script exports when sourced, read without running it (`soarpack inspect --steps`).

A bundle may be someone else's: inspect never executes it, not even in a sandbox (a sourced script can reach any
absolute path, and no sandbox an unprivileged process can build here stops that). So the script is read the way
bash reads it, as far as a reader can: bash's quoting (single, double, $'...', joined quotes, backslashes, line
continuations), comments, here-documents (their bodies are data, never commands), operators (`;`, `&&`, `||`, `|`,
`&`, subshells), and several assignments on one line. Then each simple command is read for what it exports:
`export`, `declare -x` / `typeset -x`, an assignment to a name already exported, and a sourced bundle.env (read in
place). Every command is read as if it ran (both branches of an `if`, every function body), so a name exported on
several paths lists each value.

What a reader cannot know is never guessed: `eval`, `source` of another file, `set -a`, `read`/`printf -v`/`mapfile`
into a variable, an `export` whose name is computed, `export -n` and `unset` of an exported name are returned as
lines it could not read, with the reason. Values the script computes at run time ($(...), `...`, $((...)), a
variable nobody set) stay as the script writes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
OPERATORS = ("&&", "||", ";;", ";&", "|&", ";", "&", "|", "(", ")", "\n")
REDIRECTS = ("<<<", "<<-", "<<", ">>", "<&", ">&", "&>>", "&>", "<>", ">|", "<", ">")
RESERVED = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "in", "case", "esac", "!",
            "{", "}", "select", "time", "function"}
_ANSI_C = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "v": "\v",
           "\\": "\\", "'": "'", '"': '"', "?": "?"}


@dataclass
class Word:
    """One shell word: segments of ("lit", text), ("var", NAME, default-or-None, raw) or ("dyn", raw)."""

    segments: List[tuple] = field(default_factory=list)
    raw: str = ""

    def literal(self) -> Optional[str]:
        """The word's text when it holds no expansion at all."""
        if all(s[0] == "lit" for s in self.segments):
            return "".join(s[1] for s in self.segments)
        return None

    def value(self, scope: Dict[str, str]) -> Tuple[str, bool]:
        """(its value with the variables the scope knows resolved, whether it is computed at run time)."""
        out, dynamic = [], False
        for seg in self.segments:
            if seg[0] == "lit":
                out.append(seg[1])
            elif seg[0] == "var":
                if seg[1] in scope:
                    out.append(scope[seg[1]])
                else:
                    out.append(seg[3])
                    dynamic = True
            else:
                out.append(seg[1])
                dynamic = True
        return "".join(out), dynamic


@dataclass
class Command:
    line: int
    words: List[Word]
    text: str  # the command as written (for the lines it could not read)
    subshell: bool = False  # in ( ... ) or a pipeline: its exports do not reach the sourcing shell


@dataclass
class Unread:
    line: int
    text: str
    why: str


class _Lexer:
    def __init__(self, text: str):
        self.s, self.i, self.line = text, 0, 1
        self.heredocs: List[Tuple[str, bool]] = []  # delimiters whose bodies start after the current line

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def take(self, n: int = 1) -> str:
        out = self.s[self.i:self.i + n]
        self.line += out.count("\n")
        self.i += n
        return out

    def skip_heredoc_bodies(self) -> None:
        """After a newline: skip the bodies of the here-documents opened on the line just ended."""
        for delimiter, strip_tabs in self.heredocs:
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                body_line = self.s[self.i:end]
                self.take(end - self.i + (1 if end < len(self.s) else 0))
                if (body_line.lstrip("\t") if strip_tabs else body_line) == delimiter:
                    break
        self.heredocs = []

    def matching(self, opener: str, closer: str) -> str:
        """The text up to the `closer` that matches an `opener` already taken (quotes and nesting respected)."""
        depth, start = 1, self.i
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\":
                self.take(2)
            elif c == "'":
                self.take()
                while self.i < len(self.s) and self.peek() != "'":
                    self.take()
                self.take()
            elif c == '"':
                self.take()
                while self.i < len(self.s) and self.peek() != '"':
                    self.take(2 if self.peek() == "\\" else 1)
                self.take()
            elif self.s.startswith(opener, self.i):
                depth += 1
                self.take(len(opener))
            elif self.s.startswith(closer, self.i):
                depth -= 1
                self.take(len(closer))
                if depth == 0:
                    return self.s[start:self.i - len(closer)]
            else:
                self.take()
        raise ValueError(f"no closing {closer!r}")

    def dollar(self, word: Word) -> None:
        """A `$` expansion at the cursor (the `$` not yet taken)."""
        start = self.i
        self.take()
        if self.peek(2) == "((":
            self.take(2)
            self.matching("((", "))")
            word.segments.append(("dyn", self.s[start:self.i]))
        elif self.peek() == "(":
            self.take()
            self.matching("(", ")")
            word.segments.append(("dyn", self.s[start:self.i]))
        elif self.peek() == "{":
            self.take()
            inner = self.matching("{", "}")
            raw = self.s[start:self.i]
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?", inner, re.S)
            if m and (m.group(2) is None or ("$" not in m.group(3) and "`" not in m.group(3))):
                word.segments.append(("var", m.group(1), m.group(3), raw))
            else:
                word.segments.append(("dyn", raw))
        elif self.peek() == "'":  # $'...': ANSI-C quoting
            self.take()
            out = []
            while self.i < len(self.s) and self.peek() != "'":
                c = self.take()
                if c == "\\" and self.i < len(self.s):
                    e = self.take()
                    if e == "x":
                        digits = re.match(r"[0-9A-Fa-f]{1,2}", self.s[self.i:])
                        out.append(chr(int(self.take(len(digits.group())), 16)) if digits else "\\x")
                    else:
                        out.append(_ANSI_C.get(e, "\\" + e))
                else:
                    out.append(c)
            self.take()
            word.segments.append(("lit", "".join(out)))
        else:
            m = _NAME.match(self.s, self.i) or re.compile(r"[0-9@*#?$!-]").match(self.s, self.i)
            if m:
                self.take(len(m.group()))
                raw = self.s[start:self.i]
                word.segments.append(("var", m.group(), None, raw) if _NAME.fullmatch(m.group()) else ("dyn", raw))
            else:
                word.segments.append(("lit", "$"))

    def double_quoted(self, word: Word) -> None:
        self.take()  # the opening quote
        buf = []
        while True:
            if self.i >= len(self.s):
                raise ValueError("no closing '\"'")
            c = self.peek()
            if c == '"':
                self.take()
                break
            if c == "\\" and self.peek(2)[1:] in ("$", "`", '"', "\\", "\n"):
                self.take()
                e = self.take()
                if e != "\n":
                    buf.append(e)
            elif c == "$":
                if buf:
                    word.segments.append(("lit", "".join(buf)))
                    buf = []
                self.dollar(word)
            elif c == "`":
                start = self.i
                self.take()
                self._backtick()
                if buf:
                    word.segments.append(("lit", "".join(buf)))
                    buf = []
                word.segments.append(("dyn", self.s[start:self.i]))
            else:
                buf.append(self.take())
        if buf:
            word.segments.append(("lit", "".join(buf)))
        if not word.segments:
            word.segments.append(("lit", ""))

    def _backtick(self) -> None:
        while self.i < len(self.s) and self.peek() != "`":
            self.take(2 if self.peek() == "\\" else 1)
        if self.i >= len(self.s):
            raise ValueError("no closing '`'")
        self.take()

    def tokens(self):
        """(kind, value, line): kind "word" (a Word), "op" (an operator or a newline), "redirect"."""
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t":
                self.take()
            elif c == "\\" and self.peek(2) == "\\\n":
                self.take(2)
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.take()
            elif c == "\n":
                line = self.line
                self.take()
                yield "op", "\n", line
                self.skip_heredoc_bodies()
            else:
                op = next((o for o in REDIRECTS if self.s.startswith(o, self.i)), None)
                if op:
                    line = self.line
                    self.take(len(op))
                    yield "redirect", op, line
                    continue
                op = next((o for o in OPERATORS if self.s.startswith(o, self.i)), None)
                if op:
                    line = self.line
                    self.take(len(op))
                    yield "op", op, line
                    continue
                line = self.line
                yield "word", self.word(), line

    def word(self) -> Word:
        w = Word()
        start = self.i
        buf: List[str] = []

        def flush():
            if buf:
                w.segments.append(("lit", "".join(buf)))
                buf.clear()
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t\n" or any(self.s.startswith(o, self.i) for o in OPERATORS + REDIRECTS):
                break
            if c == "\\":
                self.take()
                e = self.take()
                if e != "\n":
                    buf.append(e)
            elif c == "'":
                flush()
                self.take()
                end = self.s.find("'", self.i)
                if end < 0:
                    raise ValueError("no closing \"'\"")
                w.segments.append(("lit", self.take(end - self.i)))
                self.take()
            elif c == '"':
                flush()
                self.double_quoted(w)
            elif c == "$":
                flush()
                self.dollar(w)
            elif c == "`":
                flush()
                bstart = self.i
                self.take()
                self._backtick()
                w.segments.append(("dyn", self.s[bstart:self.i]))
            else:
                buf.append(self.take())
        flush()
        w.raw = self.s[start:self.i]
        return w


def parse_commands(script: str) -> Tuple[List[Command], List[Unread]]:
    """The script's simple commands, in order; a script that does not lex (an unclosed quote) is one unread line."""
    lexer = _Lexer(script)
    commands: List[Command] = []
    unread: List[Unread] = []
    lines = script.splitlines()
    state = {"words": [], "line": 1, "depth": 0, "piped": False, "fn": False, "pattern": False, "array": None}
    heredoc_op: Optional[str] = None
    expect_target = False

    def end(op: str) -> None:
        words = state["words"]
        state["words"] = []
        in_pipe = op in ("|", "|&")
        if words:
            first = words[0].literal()
            if first == "case":  # `case WORD in`: a pattern and `)` come next
                state["pattern"] = True
            elif first != "esac":
                text = lines[state["line"] - 1].strip() if state["line"] - 1 < len(lines) else ""
                commands.append(Command(state["line"], words, text, state["depth"] > 0 or state["piped"] or in_pipe))
        state["piped"] = in_pipe
        if op in (";;", ";&"):
            state["pattern"] = True

    try:
        for kind, value, line in lexer.tokens():
            if kind == "redirect":
                expect_target = True
                heredoc_op = value if value in ("<<", "<<-") else None
                continue
            if kind == "word":
                if expect_target:
                    expect_target = False
                    if heredoc_op:
                        delimiter = "".join(s[1] for s in value.segments if s[0] == "lit") or value.raw
                        lexer.heredocs.append((delimiter, heredoc_op == "<<-"))
                        heredoc_op = None
                    continue
                if state["array"] is not None:  # NAME=( a b c ): the array's elements
                    continue
                if not state["words"]:
                    state["line"] = line
                state["words"].append(value)
                continue
            words = state["words"]
            if state["array"] is not None:
                if value == ")":
                    state["array"].segments.append(("dyn", "(...)"))
                    state["array"].raw += "(...)"
                    state["array"] = None
                continue
            if value == "(" and words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=", words[-1].raw):
                state["array"] = words[-1]
            elif value == "(" and len(words) == 1 and _NAME.fullmatch(words[0].raw or ""):
                state["fn"], state["words"] = True, []  # NAME ( ): a function definition's header
            elif value == ")" and state["fn"]:
                state["fn"] = False
            elif value == "|" and (state["pattern"] or (words and words[0].literal() == "case")):
                continue  # `a|b)`: one case pattern's alternatives
            elif value == ")" and (state["pattern"] or (words and words[0].literal() == "case")):
                state["words"], state["pattern"], state["piped"] = [], False, False  # a case pattern, not a command
            elif value == "(":
                end(";")
                state["depth"] += 1
            elif value == ")":
                end(";")
                state["depth"] = max(0, state["depth"] - 1)
            else:
                if value == "\n" and state["pattern"] and not words:
                    continue
                end(value)
        end(";")
    except ValueError as exc:
        unread.append(Unread(lexer.line, lines[lexer.line - 1].strip() if lexer.line - 1 < len(lines) else "",
                             f"cannot be read as shell ({exc}): nothing after it was read"))
    return commands, unread


@dataclass
class Exports:
    values: Dict[str, List[str]] = field(default_factory=dict)  # NAME -> every value it may be exported with
    unread: List[Unread] = field(default_factory=list)


_DYNAMIC_TO_SCOPE = ("read", "mapfile", "readarray", "let", "getopts")


def read_exports(script: str, known: Dict[str, str], *,
                 sourced: Optional[Callable[[str], Optional[str]]] = None, _depth: int = 0,
                 _state: Optional[tuple] = None) -> Exports:
    """What sourcing `script` exports, read (never run); `known`: the values the platform or the bundle give
    (a run-time assignment does not hide one); `sourced(path)`: the text of a file the script sources that the
    reader may read in place (bundle.env), else None."""
    scope, exported, out = _state or (dict(known), set(), Exports())
    commands, unread = parse_commands(script)
    out.unread += unread

    def export(name: str, value: str) -> None:
        exported.add(name)
        if value not in out.values.setdefault(name, []):
            out.values[name].append(value)

    def assign(name: str, word: Optional[Word], append: bool = False) -> Tuple[str, bool]:
        value, dynamic = word.value(scope) if word is not None else ("", False)
        if append:
            value = scope.get(name, "") + value
        if not (dynamic and name in known):  # a run-time value does not hide what the platform or bundle sets
            scope[name] = value
        return scope.get(name, value), dynamic

    for cmd in commands:
        words = list(cmd.words)
        while words and words[0].literal() in RESERVED:
            words.pop(0)
        if not words:
            continue
        assignments = []
        while words and _ASSIGN.match(words[0].raw):
            assignments.append(words.pop(0))
        if not words:  # NAME=VALUE ...: shell assignments
            if cmd.subshell:
                continue
            for w in assignments:
                name, append, rest = _split_assignment(w)
                value, _ = assign(name, rest, append)
                if name in exported:
                    export(name, value)
            continue
        head = words[0].literal()
        args = words[1:]
        if head is None:  # a program chosen at run time: only a builtin it may name could export, with NAME=...
            if any(_ASSIGN.match(a.raw) for a in args):
                out.unread.append(Unread(cmd.line, cmd.text, "the command's name is computed at run time"))
            continue
        if cmd.subshell and head in ("export", "declare", "typeset", "source", ".", "eval"):
            continue  # a subshell's (or a pipeline part's) exports do not reach the sourcing shell
        if head in ("export", "declare", "typeset", "local", "readonly"):
            flags = "".join(a.literal()[1:] for a in args if (a.literal() or "").startswith("-"))
            names = [a for a in args if not (a.literal() or "").startswith("-")]
            # local -x exports only while its function runs; readonly and a plain declare do not export
            exporting = head == "export" or ("x" in flags and head in ("declare", "typeset"))
            if head == "export" and "n" in flags:
                out.unread.append(Unread(cmd.line, cmd.text, "export -n takes the export away on some path"))
                continue
            if "f" in flags or ("p" in flags and not names):
                continue
            for a in names:
                if _ASSIGN.match(a.raw):
                    name, append, rest = _split_assignment(a)
                    value, _ = assign(name, rest, append)
                    if exporting:
                        export(name, value)
                elif a.literal() is not None and _NAME.fullmatch(a.literal()):
                    if exporting:
                        export(a.literal(), scope.get(a.literal(), f"(${a.literal()} as it is at run time)"))
                else:
                    out.unread.append(Unread(cmd.line, cmd.text, "an exported name is computed at run time"))
            continue
        if head in ("source", "."):
            path = args[0].value(scope)[0] if args else ""
            text = sourced(path) if sourced is not None and _depth < 4 else None
            if text is None:
                out.unread.append(Unread(cmd.line, cmd.text, "it sources another file, which is not read here"))
            else:
                read_exports(text, known, sourced=sourced, _depth=_depth + 1, _state=(scope, exported, out))
            continue
        if head == "eval":
            out.unread.append(Unread(cmd.line, cmd.text, "eval runs text built at run time"))
            continue
        if head == "set" and any((a.literal() or "").startswith("-") and "a" in (a.literal() or "")[1:]
                                 or a.literal() == "allexport" for a in args):
            out.unread.append(Unread(cmd.line, cmd.text, "set -a exports every later assignment"))
            continue
        if head == "unset":
            gone = [a.literal() for a in args if a.literal() in exported]
            if gone:
                out.unread.append(Unread(cmd.line, cmd.text, f"it unsets {', '.join(gone)} on some path"))
            continue
        if head in _DYNAMIC_TO_SCOPE or (head == "printf" and any(a.literal() == "-v" for a in args)):
            targets = [a.literal() for a in args if a.literal() in exported]
            if targets:
                out.unread.append(Unread(cmd.line, cmd.text, f"it sets {', '.join(targets)} at run time"))
    return out


def _split_assignment(word: Word) -> Tuple[str, bool, Word]:
    """NAME, whether it is `+=`, and the value's Word, of an assignment word."""
    m = _ASSIGN.match(word.raw)
    name, append = m.group(1), bool(m.group(2))
    prefix = len(m.group())
    rest = Word([], word.raw[prefix:])
    consumed = 0
    for seg in word.segments:  # drop the NAME= text from the first literal segment(s)
        if consumed >= prefix:
            rest.segments.append(seg)
            continue
        if seg[0] != "lit":
            rest.segments.append(seg)
            consumed = prefix
            continue
        take = min(prefix - consumed, len(seg[1]))
        consumed += take
        if seg[1][take:]:
            rest.segments.append(("lit", seg[1][take:]))
    return name, append, rest
