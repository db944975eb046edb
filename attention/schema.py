"""Strict rules for JSON that anyone can write (results files, a checkpoint's record), and escaping for what a page
shows of it.

A rule is a function `(value, where) -> [problems]`, each problem a sentence that starts with the field (`where`);
the factories below build them: a number in a range, a string of a form and a length, one of fixed values, lists and
mappings of bounded length, records with exactly their fields. `field_rules` reads them off a class whose fields are
`Annotated[type, rule, ...]`, so one definition both validates a file and documents it. `escaped` makes every string
of a value literal text for Markdown and HTML.
"""

import math
import re
import typing


def shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _typed(kind, expected, check):
    """A rule: a value of type `kind` (a bool is no number), then `check(value, where)`."""
    def rule(value, where):
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            return [f"{where}: expected {expected}, got {shown(value)}"]
        return check(value, where)
    return rule


def in_range(lowest=0.0, highest=1e15, kind=(int, float)):
    return _typed(kind, "an integer" if kind is int else "a number", lambda value, where: (
        [f"{where}: {value} is not a finite number"] if isinstance(value, float) and not math.isfinite(value) else
        [] if lowest <= value <= highest else [f"{where}: {shown(value)} is outside [{lowest}, {highest}]"]))


def integer(lowest=0, highest=2**62):
    return in_range(lowest, highest, int)


def text(pattern, what, longest=80):
    compiled = re.compile(pattern)
    return _typed(str, "a string", lambda value, where: [f"{where}: {len(value)} characters, at most {longest}"]
                  if len(value) > longest else [] if compiled.fullmatch(value) else [f"{where}: {shown(value)} is not {what}"])


def one_of(*values):
    return lambda value, where: [] if any(type(value) is type(allowed) and value == allowed for allowed in values) \
        else [f"{where}: {shown(value)} is not one of {', '.join(map(str, values))}"]


def nullable(inner):
    return lambda value, where: [] if value is None else inner(value, where)


def list_of(item, longest):
    return _typed(list, "a list", lambda value, where: [f"{where}: {len(value)} items, at most {longest}"]
                  if len(value) > longest else [p for index, element in enumerate(value) for p in item(element, f"{where}[{index}]")])


def mapping(key, item, longest):
    return _typed(dict, "an object", lambda value, where: [f"{where}: {len(value)} entries, at most {longest}"]
                  if len(value) > longest else [p for name, element in value.items()
                                                for p in key(name, f"{where} key") or item(element, f"{where}.{name}")])


def record(fields, optional=()):
    """An object with exactly `fields` ({name: rule}), those in `optional` allowed to be absent."""
    def check(value, where):
        prefix = f"{where}." if where else ""
        return ([f"{prefix}{shown(name)}: unknown field" for name in value if name not in fields]
                + [f"{prefix}{name}: missing" for name in fields if name not in value and name not in optional]
                + [p for name, rule in fields.items() if name in value for p in rule(value[name], prefix + name)])
    return _typed(dict, "an object", check)


def field_rules(annotated):
    """`{field: rule}` of a class whose fields are `Annotated[type, rule, ...]` (a row `TypedDict`, a config
    dataclass); `null` allowed where the type allows None."""
    hints = typing.get_type_hints(annotated, include_extras=True)
    return {name: nullable(hint.__metadata__[0]) if type(None) in typing.get_args(hint.__origin__)
            else hint.__metadata__[0] for name, hint in hints.items()}


def config_problems(config):
    """The problems of a config dataclass's values against its fields' rules (`field_rules`; tuples as lists)."""
    values = {name: list(value) if isinstance(value, tuple) else value
              for name, value in ((name, getattr(config, name)) for name in field_rules(type(config)))}
    return [problem for name, rule in field_rules(type(config)).items() for problem in rule(values[name], name)]


def rule_of(annotated):
    """The rule of an object holding exactly the fields of `annotated` (`field_rules`)."""
    return record(field_rules(annotated))


# Rules of fields many files share.
BOOLEAN = one_of(True, False)
NAME = text(r"[A-Za-z0-9 ()@.,_+/-]+", "a name of letters, digits, spaces and ()@.,_+/-", 100)
IDENTIFIER = text(r"[A-Za-z][A-Za-z0-9_]*", "an identifier", 40)
VERSION = text(r"\d+(\.\d+){1,3}([.+-]?[A-Za-z0-9]+){0,4}", "a version such as 2.13.0+cpu", 40)
PROSE = text(r"[A-Za-z0-9 .,:;'±×·()/-]+", "a description of letters, digits and punctuation (no brackets)", 300)
SECONDS = in_range(0, 1e7)
LOAD = nullable(list_of(in_range(0, 1e6), 3))
DATE = text(r"20\d\d-(0[1-9]|1[0-2])-([0-2]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([+-]\d\d:\d\d|Z)",
            "an ISO 8601 date and time with its offset", 40)


# Every string of a file, made literal text wherever Markdown or HTML shows it: no tag, entity, link, code span,
# table cell, attribute list or line break can come from a file (valid names are left as they are).
ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "[": "&#91;", "]": "&#93;",
                         "{": "&#123;", "}": "&#125;", "|": "&#124;", "`": "&#96;", "\\": "&#92;",
                         **{chr(code): " " for code in [*range(32), 127]}})


def escaped(value):
    """A JSON value with every string (keys too) escaped for Markdown and HTML (`ESCAPES`)."""
    if isinstance(value, str):
        return value.translate(ESCAPES)
    if isinstance(value, list):
        return [escaped(item) for item in value]
    if isinstance(value, dict):
        return {escaped(key): escaped(item) for key, item in value.items()}
    return value
