"""A small Common Expression Language evaluator for admission ``matchConditions``.

kube-apiserver evaluates a webhook's ``matchConditions`` (CEL) before calling it:
https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-matchconditions
This covers the subset such conditions use: field selection, ``has()``, ``&&``,
``||``, ``!``, comparisons, ``in``, ``? :``, literals (strings, numbers, bools,
null, lists, maps), ``size()``, ``exists()``, ``all()``, ``exists_one()``,
``filter()``, ``map()``, ``startsWith()``, ``endsWith()``, ``contains()``,
``matches()``. Errors follow CEL: a missing field is an error, and ``&&`` / ``||``
absorb an error when the other side decides the result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class CelError(Exception):
    """A parse or evaluation error."""


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>\d+(\.\d+)?[uU]?)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%<>!?:.,()\[\]{}])
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str


def tokenize(text: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise CelError(f"unexpected character {text[pos]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(Tok(kind, m.group()))
    out.append(Tok("end", ""))
    return out


Node = Callable[[dict[str, Any]], Any]
_MISSING = object()


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.i = 0

    def peek(self, text: str | None = None) -> bool:
        tok = self.toks[self.i]
        return tok.text == text if text is not None else tok.kind != "end"

    def take(self, text: str | None = None) -> Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise CelError(f"expected {text!r}, got {tok.text or 'end of expression'!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.expr()
        if self.toks[self.i].kind != "end":
            raise CelError(f"unexpected {self.toks[self.i].text!r}")
        return node

    def expr(self) -> Node:
        cond = self.or_()
        if self.peek("?"):
            self.take("?")
            yes = self.expr()
            self.take(":")
            no = self.expr()
            return lambda env: yes(env) if _bool(cond(env)) else no(env)
        return cond

    def or_(self) -> Node:
        left = self.and_()
        while self.peek("||"):
            self.take()
            left = _logic(left, self.and_(), decisive=True)
        return left

    def and_(self) -> Node:
        left = self.rel()
        while self.peek("&&"):
            self.take()
            left = _logic(left, self.rel(), decisive=False)
        return left

    def rel(self) -> Node:
        left = self.add()
        ops: dict[str, Callable[[Any, Any], bool]] = {
            "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
            "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "in": lambda a, b: a in b,
        }
        tok = self.toks[self.i]
        if tok.text in ops:
            self.take()
            right = self.add()
            fn = ops[tok.text]

            def compare(env: dict[str, Any]) -> bool:
                try:
                    return bool(fn(left(env), right(env)))
                except TypeError as exc:
                    raise CelError(f"no such overload: {exc}") from exc
            return compare
        return left

    def add(self) -> Node:
        left = self.unary()
        while self.toks[self.i].text in ("+", "-"):
            op = self.take().text
            right = self.unary()
            left = _arith(left, right, op)
        return left

    def unary(self) -> Node:
        if self.peek("!"):
            self.take()
            inner = self.unary()
            return lambda env: not _bool(inner(env))
        if self.peek("-"):
            self.take()
            inner = self.unary()
            return lambda env: -inner(env)
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.peek("."):
                self.take()
                name = self.take().text
                node = self.method(node, name) if self.peek("(") else _select(node, name)
            elif self.peek("["):
                self.take()
                index = self.expr()
                self.take("]")
                node = _index(node, index)
            else:
                return node

    def args(self) -> list[Node]:
        self.take("(")
        out: list[Node] = []
        while not self.peek(")"):
            out.append(self.expr())
            if not self.peek(")"):
                self.take(",")
        self.take(")")
        return out

    def method(self, target: Node, name: str) -> Node:
        if name in ("exists", "all", "exists_one", "filter", "map"):
            self.take("(")
            var = self.take().text
            self.take(",")
            body = self.expr()
            self.take(")")
            return _macro(target, name, var, body)
        args = self.args()
        simple: dict[str, Callable[..., Any]] = {
            "size": len,
            "startsWith": lambda s, p: s.startswith(p),
            "endsWith": lambda s, p: s.endswith(p),
            "contains": lambda s, p: p in s,
            "matches": lambda s, p: re.search(p, s) is not None,
            "lowerAscii": lambda s: s.lower(),
        }
        if name not in simple:
            raise CelError(f"unsupported function {name}()")
        fn = simple[name]
        return lambda env: _call(fn, target(env), *(a(env) for a in args))

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "num":
            text = tok.text.rstrip("uU")
            value: Any = float(text) if "." in text else int(text)
            return lambda env: value
        if tok.kind == "str":
            value = bytes(tok.text[1:-1], "utf-8").decode("unicode_escape")
            return lambda env: value
        if tok.text == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if tok.text == "[":
            items: list[Node] = []
            while not self.peek("]"):
                items.append(self.expr())
                if not self.peek("]"):
                    self.take(",")
            self.take("]")
            return lambda env: [i(env) for i in items]
        if tok.text == "{":
            pairs: list[tuple[Node, Node]] = []
            while not self.peek("}"):
                key = self.expr()
                self.take(":")
                pairs.append((key, self.expr()))
                if not self.peek("}"):
                    self.take(",")
            self.take("}")
            return lambda env: {k(env): v(env) for k, v in pairs}
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                flag = tok.text == "true"
                return lambda env: flag
            if tok.text == "null":
                return lambda env: None
            if tok.text == "has" and self.peek("("):
                return self.has()
            if self.peek("("):
                args = self.args()
                funcs: dict[str, Callable[..., Any]] = {
                    "size": len, "int": int, "string": str, "double": float,
                }
                if tok.text not in funcs:
                    raise CelError(f"unsupported function {tok.text}()")
                fn = funcs[tok.text]
                return lambda env: _call(fn, *(a(env) for a in args))
            name = tok.text

            def variable(env: dict[str, Any]) -> Any:
                if name not in env:
                    raise CelError(f"undeclared reference to {name!r}")
                return env[name]
            return variable
        raise CelError(f"unexpected {tok.text or 'end of expression'!r}")

    def has(self) -> Node:
        self.take("(")
        start = self.i
        base = self.primary()
        fields: list[str] = []
        while self.peek("."):
            self.take()
            fields.append(self.take().text)
        self.take(")")
        if not fields:
            raise CelError(f"has() needs a field selection at token {start}")

        def check(env: dict[str, Any]) -> bool:
            value = base(env)
            for field in fields[:-1]:
                value = _get(value, field)
            if not isinstance(value, Mapping):
                raise CelError("has() on a non-object")
            return fields[-1] in value and value[fields[-1]] is not None
        return check


def _arith(left: Node, right: Node, op: str) -> Node:
    def run(env: dict[str, Any]) -> Any:
        a, b = left(env), right(env)
        try:
            return a + b if op == "+" else a - b
        except TypeError as exc:
            raise CelError(f"no such overload: {exc}") from exc
    return run


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"expected a bool, got {type(value).__name__}")
    return value


def _logic(left: Node, right: Node, *, decisive: bool) -> Node:
    """``||`` (decisive=True) and ``&&`` (False), absorbing errors as CEL does."""
    def run(env: dict[str, Any]) -> bool:
        error: CelError | None = None
        try:
            if _bool(left(env)) == decisive:
                return decisive
        except CelError as exc:
            error = exc
        if _bool(right(env)) == decisive:
            return decisive
        if error is not None:
            raise error
        return not decisive
    return run


def _get(value: Any, field: str) -> Any:
    if not isinstance(value, Mapping):
        raise CelError(f"cannot select {field!r} from {type(value).__name__}")
    if field not in value or value[field] is None:
        raise CelError(f"no such key: {field}")
    return value[field]


def _select(node: Node, field: str) -> Node:
    return lambda env: _get(node(env), field)


def _index(node: Node, index: Node) -> Node:
    def run(env: dict[str, Any]) -> Any:
        value, key = node(env), index(env)
        try:
            return value[key]
        except (KeyError, IndexError, TypeError) as exc:
            raise CelError(f"no such key: {key!r}") from exc
    return run


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except (TypeError, ValueError, AttributeError, re.error) as exc:
        raise CelError(f"no matching overload: {exc}") from exc


def _macro(target: Node, name: str, var: str, body: Node) -> Node:
    def run(env: dict[str, Any]) -> Any:
        items = target(env)
        if isinstance(items, Mapping):
            items = list(items)
        if not isinstance(items, list):
            raise CelError(f"{name}() needs a list or map")

        def value(item: Any) -> Any:
            return body({**env, var: item})

        if name == "map":
            return [value(i) for i in items]
        if name == "filter":
            return [i for i in items if _bool(value(i))]
        if name == "exists_one":
            return sum(1 for i in items if _bool(value(i))) == 1
        if name == "all":
            return _logic_all(items, value, decisive=False)
        return _logic_all(items, value, decisive=True)
    return run


def _logic_all(items: list[Any], value: Callable[[Any], Any], *, decisive: bool) -> bool:
    error: CelError | None = None
    for item in items:
        try:
            if _bool(value(item)) == decisive:
                return decisive
        except CelError as exc:
            error = exc
    if error is not None:
        raise error
    return not decisive


def compile(expression: str) -> Node:
    """Parse an expression; raises CelError."""
    return _Parser(expression).parse()


def evaluate(expression: str, env: dict[str, Any]) -> Any:
    return compile(expression)(env)
