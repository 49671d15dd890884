"""Planted mistakes: one genuine slip in a working program, whose error message names the fix.

Each ``Mistake`` turns a program into a broken one and says, in one sentence, what the single
edit back is. The corpus checks every planted mistake in the sandbox: it must fail with
``error_kind`` and the tool text must contain the mistake's ``hint`` (the part of Python's
message that names the fix — ``Did you mean: 'print'?``, ``'(' was never closed``,
``expected ':'``); otherwise the transcript is dropped and counted.

==================  =====================  =================================================
mistake             error                  message names
==================  =====================  =================================================
name_typo           NameError              ``Did you mean: 'sorted'?`` (a misspelt built-in)
var_typo            NameError              ``Did you mean: 'xs'?`` (a misspelt variable)
attr_typo           AttributeError         ``Did you mean: 'gcd'?`` (``math.gcdd``)
missing_import      NameError              ``name 'math' is not defined``
missing_paren       SyntaxError            ``'(' was never closed``
missing_colon       SyntaxError            ``expected ':'``
indent              IndentationError       ``expected an indented block after 'for' ...``
str_concat          TypeError              ``can only concatenate str (not "int") to str``
iterate_int         TypeError              ``'int' object is not iterable``
keyword_typo        TypeError              ``'reverce' is an invalid keyword argument``
no_init             NameError              ``name 'total' is not defined``
==================  =====================  =================================================

Simplifies: one mistake per broken call; the mistake is chosen uniformly among those that
apply to the program. Python 3.11's "Did you mean" needs the interpreter's own error display,
which the sandbox executor uses.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

BUILTINS = ["print", "sorted", "sum", "len", "range", "max", "divmod", "str"]
Broken = tuple[str, str, str]
"""(broken code, the fix sentence, the hint the error message must contain)."""


@dataclass(frozen=True)
class Mistake:
    name: str
    error_kind: str
    make: Callable[[str, random.Random], Broken | None]
    """``make(code, rng)``: the broken program, or ``None`` when the mistake does not apply."""


MISTAKES: dict[str, Mistake] = {}


def mistake(name: str, error_kind: str):
    def deco(fn: Callable[[str, random.Random], Broken | None]):
        MISTAKES[name] = Mistake(name, error_kind, fn)
        return fn

    return deco


def typo(word: str, r: random.Random) -> str:
    """A misspelling Python still recognises: the last letter doubled, or an inner letter dropped."""
    if len(word) <= 3 or r.random() < 0.5:
        return word + word[-1]
    i = r.randint(1, len(word) - 2)
    return word[:i] + word[i + 1 :]


def _sub_one(code: str, pattern: str, repl: str, r: random.Random) -> str | None:
    """``code`` with one randomly chosen match of ``pattern`` replaced (``None`` when there is none)."""
    hits = list(re.finditer(pattern, code))
    if not hits:
        return None
    m = r.choice(hits)
    return code[: m.start()] + m.expand(repl) + code[m.end() :]


@mistake("name_typo", "NameError")
def name_typo(code: str, r: random.Random) -> Broken | None:
    used = [b for b in BUILTINS if re.search(rf"(?<![\w.]){b}\(", code)]
    if not used:
        return None
    name = r.choice(used)
    bad = typo(name, r)
    broken = _sub_one(code, rf"(?<![\w.]){name}\(", bad + "(", r)
    return broken, f"The error says {bad} is not defined; it should be {name}.", f"Did you mean: '{name}'?"


def _use_sites(code: str, name: str) -> list[re.Match]:
    """Occurrences of variable ``name`` that read it (not ``for name in``, not an assignment target)."""
    out = []
    for m in re.finditer(rf"(?<![\w.'\"]){re.escape(name)}(?![\w(])", code):
        before, after = code[: m.start()], code[m.end() :]
        if before.endswith("for ") or re.match(r" =[^=]|, \w+ =[^=]", after):
            continue
        if re.search(r"(^|\n)\s*\w+, $", before) and re.match(r" =[^=]", after):
            continue
        out.append(m)
    return out


def _variables(code: str, bound: tuple[str, ...]) -> list[str]:
    assigned = re.findall(r"^\s*(\w+)(?:, (\w+))? =", code, re.M) + [(n, "") for n in re.findall(r"for (\w+) in", code)]
    names = {n for pair in assigned for n in pair if n and n != "_"} | set(bound)
    return sorted(n for n in names if _use_sites(code, n))


@mistake("var_typo", "NameError")
def var_typo(code: str, r: random.Random, bound: tuple[str, ...] = ()) -> Broken | None:
    names = _variables(code, bound)
    if not names:
        return None
    name = r.choice(names)
    bad = typo(name, r)
    m = r.choice(_use_sites(code, name))
    broken = code[: m.start()] + bad + code[m.end() :]
    return broken, f"{bad} is not defined; the variable is called {name}.", f"Did you mean: '{name}'?"


@mistake("attr_typo", "AttributeError")
def attr_typo(code: str, r: random.Random) -> Broken | None:
    hits = re.findall(r"\b(?:math|heapq)\.(\w+)\(", code)
    if not hits:
        return None
    attr = r.choice(hits)
    bad = attr + attr[-1]
    return (_sub_one(code, rf"\.{attr}\(", f".{bad}(", r),
            f"The module has no attribute {bad}; the function is {attr}.", f"Did you mean: '{attr}'?")


@mistake("missing_import", "NameError")
def missing_import(code: str, r: random.Random) -> Broken | None:
    m = re.match(r"import (\w+)\n", code)
    if m is None:
        return None
    mod = m.group(1)
    return code[m.end() :], f"{mod} is not defined: I forgot to import {mod}.", f"name '{mod}' is not defined"


@mistake("missing_paren", "SyntaxError")
def missing_paren(code: str, r: random.Random) -> Broken | None:
    if not code.endswith(")"):
        return None
    return code[:-1], "A parenthesis was never closed; I add the missing ) at the end.", "'(' was never closed"


@mistake("missing_colon", "SyntaxError")
def missing_colon(code: str, r: random.Random) -> Broken | None:
    hits = list(re.finditer(r"^(\s*(?:for|while|if) .*):$", code, re.M))
    if not hits:
        return None
    m = r.choice(hits)
    word = m.group(1).split()[0]
    broken = code[: m.start()] + m.group(1) + code[m.end() :]
    return broken, f"The {word} line needs a colon at its end.", "expected ':'"


@mistake("indent", "IndentationError")
def indent(code: str, r: random.Random) -> Broken | None:
    lines = code.split("\n")
    heads = [i for i, ln in enumerate(lines[:-1]) if re.match(r"\s*(for|while|if) .*:$", ln)]
    if not heads:
        return None
    i = r.choice(heads)
    word = lines[i].split()[0]
    lines[i + 1] = lines[i + 1][4:]
    return "\n".join(lines), f"The body of the {word} statement must be indented.", "expected an indented block"


@mistake("str_concat", "TypeError")
def str_concat(code: str, r: random.Random) -> Broken | None:
    m = re.search(r"print\((.+)\)$", code)
    if m is None:
        return None
    label = r.choice(["The answer is ", "Answer: ", "Result: "])
    broken = code[: m.start()] + f'print("{label}" + {m.group(1)})'
    return broken, "I cannot add a str and an int; I print the number alone.", 'can only concatenate str (not "int") to str'


@mistake("iterate_int", "TypeError")
def iterate_int(code: str, r: random.Random) -> Broken | None:
    hits = list(re.finditer(r"for (\w+) in (range|str)\((\w+)\)", code))
    hits = [h for h in hits if h.group(2) == "str" or h.group(3).isidentifier()]
    if not hits:
        return None
    h = r.choice(hits)
    fixed = f"{h.group(2)}({h.group(3)})"
    broken = code[: h.start()] + f"for {h.group(1)} in {h.group(3)}" + code[h.end() :]
    return broken, f"An int is not iterable; I loop over {fixed} instead.", "'int' object is not iterable"


@mistake("keyword_typo", "TypeError")
def keyword_typo(code: str, r: random.Random) -> Broken | None:
    if "reverse=True" not in code:
        return None
    bad = r.choice(["reverce", "reversed", "revers"])
    return (code.replace("reverse=True", f"{bad}=True", 1), f"sorted has no keyword {bad}; it is reverse.",
            f"'{bad}' is an invalid keyword argument")


@mistake("no_init", "NameError")
def no_init(code: str, r: random.Random) -> Broken | None:
    m = re.match(r"(\w+) = 0\n", code)
    if m is None:
        return None
    name = m.group(1)
    return code[m.end() :], f"{name} is not defined: I must set {name} = 0 before the loop.", f"name '{name}' is not defined"


def applicable(code: str, bound: tuple[str, ...]) -> list[str]:
    """Names of the mistakes that can be planted in ``code`` (deterministic probe)."""
    probe = random.Random(0)
    return [m.name for m in MISTAKES.values() if plant(m.name, code, probe, bound) is not None]


def plant(name: str, code: str, r: random.Random, bound: tuple[str, ...] = ()) -> Broken | None:
    """Plant mistake ``name`` in ``code`` (``bound``: the names set by the problem's setup)."""
    if name == "var_typo":
        return var_typo(code, r, bound)
    return MISTAKES[name].make(code, r)
