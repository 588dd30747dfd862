"""A tokenizer for MariaDB/MySQL statements, enough to read DDL.

Handles backquoted identifiers (with doubled backquotes), single- and double-quoted strings
(with doubled quotes and backslash escapes), character set introducers (``_utf8mb4'x'``),
numbers, ``--``/``#``/``/* */`` comments, and executable comments (``/*!50100 ...*/``,
``/*M!100100 ...*/``), whose contents are kept as SQL the way the server reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<line_comment>(?:--(?=\s|$)|\#)[^\n]*)
  | (?P<exec_open>/\*M?!\d*)
  | (?P<comment>/\*.*?\*/)
  | (?P<exec_close>\*/)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>_[A-Za-z0-9]+'(?:[^'\\]|\\.|'')*'|'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)
  | (?P<word>[A-Za-z0-9_$\u0080-\uffff]+)
  | (?P<symbol><=>|<=|>=|<>|!=|:=|\|\||&&|[(),.;=@+\-*/%<>!~^&|?:{}\[\]])
    """,
    re.S | re.X,
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "word", "ident" (backquoted), "string", "number", "symbol"
    text: str  # for ident/string: the unquoted value
    start: int = field(default=-1, compare=False)  # its offset in the statement

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.text.upper() in words

    def is_symbol(self, symbol: str) -> bool:
        return self.kind == "symbol" and self.text == symbol


class SqlSyntaxError(ValueError):
    pass


_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}


def _unquote_string(raw: str) -> str:
    if raw.startswith("_"):
        raw = raw[raw.index("'"):]
    quote, body = raw[0], raw[1:-1]
    body = body.replace(quote * 2, quote)
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), body)


def tokenize(sql: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    in_executable_comment = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise SqlSyntaxError(f"unexpected character {sql[pos]!r} at offset {pos}")
        pos = m.end()
        kind = m.lastgroup
        text = m.group()
        if kind in ("space", "line_comment", "comment"):
            continue
        if kind == "exec_open":
            in_executable_comment += 1
            continue
        if kind == "exec_close":
            if not in_executable_comment:
                raise SqlSyntaxError(f"unmatched */ at offset {m.start()}")
            in_executable_comment -= 1
            continue
        if kind == "quoted":
            tokens.append(Token("ident", text[1:-1].replace("``", "`"), m.start()))
        elif kind == "string":
            tokens.append(Token("string", _unquote_string(text), m.start()))
        else:
            tokens.append(Token(kind or "symbol", text, m.start()))
    return tokens


class TokenStream:
    """A cursor over tokens with the small vocabulary a recursive-descent reader needs."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self, offset: int = 0) -> Token | None:
        index = self.pos + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def next(self) -> Token:
        token = self.peek()
        if token is None:
            raise SqlSyntaxError("unexpected end of statement")
        self.pos += 1
        return token

    def at_end(self) -> bool:
        token = self.peek()
        return token is None or token.is_symbol(";")

    def accept_word(self, *words: str) -> bool:
        token = self.peek()
        if token is not None and token.is_word(*words):
            self.pos += 1
            return True
        return False

    def accept_words(self, *sequence: str) -> bool:
        """Consume the words in order if all of them are next."""
        for i, word in enumerate(sequence):
            token = self.peek(i)
            if token is None or not token.is_word(word):
                return False
        self.pos += len(sequence)
        return True

    def expect_word(self, *words: str) -> str:
        token = self.next()
        if not token.is_word(*words):
            raise SqlSyntaxError(f"expected {' or '.join(words)}, found {token.text!r}")
        return token.text.upper()

    def accept_symbol(self, symbol: str) -> bool:
        token = self.peek()
        if token is not None and token.is_symbol(symbol):
            self.pos += 1
            return True
        return False

    def expect_symbol(self, symbol: str) -> None:
        token = self.next()
        if not token.is_symbol(symbol):
            raise SqlSyntaxError(f"expected {symbol!r}, found {token.text!r}")

    def identifier(self) -> str:
        token = self.next()
        if token.kind not in ("word", "ident", "string"):
            raise SqlSyntaxError(f"expected a name, found {token.text!r}")
        return token.text

    def skip_balanced(self) -> list[Token]:
        """After an opening parenthesis: the tokens up to the matching closing one."""
        depth, start = 1, self.pos
        while True:
            token = self.next()
            if token.is_symbol("("):
                depth += 1
            elif token.is_symbol(")"):
                depth -= 1
                if depth == 0:
                    return self.tokens[start : self.pos - 1]

    def until_top_level(self, *stops: str) -> list[Token]:
        """Tokens up to (not including) a top-level symbol in ``stops`` or the end."""
        start, depth = self.pos, 0
        while (token := self.peek()) is not None:
            if token.is_symbol("("):
                depth += 1
            elif token.is_symbol(")"):
                if depth == 0 and ")" in stops:
                    break
                depth -= 1
            elif depth == 0 and token.kind == "symbol" and token.text in stops:
                break
            self.pos += 1
        return self.tokens[start : self.pos]
