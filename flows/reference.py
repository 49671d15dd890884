"""Reference pages generated from the code, so they cannot drift: every config key and every ``cleaner`` command.

``config_reference()`` walks the pydantic tree of ``flows.config.RunConfig`` (each field's path, type, default and
docstring); ``cli_reference()`` walks the Typer app of ``flows.cli`` (each command's help, arguments and options).
The docs site builds both pages on every build (``infra/docs_hooks.py``); to read one in a terminal::

    python -m flows.reference config | less
    python -m flows.reference cli | less
"""

from __future__ import annotations

import re
import sys
import typing
from collections.abc import Iterator
from pathlib import PurePath

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def _type_name(annotation: object) -> str:
    """A field's type as a reader writes it (``int | None``, ``list[str]``, ``Literal['a', 'b']``)."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return repr(value)


def _nested(annotation: object) -> type[BaseModel] | None:
    """The config section a field holds (also an optional one, ``EnvConfig | None``), or None."""
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def config_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str, bool]]:
    """(dotted path, type, default, docstring, is a section) of every field of ``model``, depth first."""
    for name, field in model.model_fields.items():
        path, sub = f"{prefix}{name}", _nested(field.annotation)
        doc = " ".join((field.description or "").split())
        if sub is not None:
            yield path, _type_name(field.annotation) if sub is not field.annotation else sub.__name__, "(section)", doc, True
            yield from config_fields(sub, f"{path}.")
        else:
            yield path, _type_name(field.annotation), _default(field), doc, False


CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
"""A Markdown code span (a run of backticks, its text, the same run)."""


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: a ``|`` outside code spans is escaped; inside one it is left as it is —
    the table extension does not split a cell at a pipe in a code span, and a backslash there would be shown
    literally (``str \\| None``)."""
    text, out, pos = text.replace("\n", " "), [], 0
    for span in CODE_SPAN.finditer(text):
        out += [text[pos:span.start()].replace("|", "\\|"), span.group(0)]
        pos = span.end()
    return "".join([*out, text[pos:].replace("|", "\\|")])


def config_reference() -> str:
    """Markdown: one table per top-level section of ``RunConfig``, every key with its type, default and docstring."""
    from flows.config import RunConfig

    out = ["# Config reference", "",
           "Every key of the run config (`flows/config.py::RunConfig`), generated from the pydantic tree on each docs "
           "build. Set a key in a YAML file (`configs/*.yaml`) or on the command line with "
           "`--set section.key=value`.", ""]
    top = [("", "RunConfig", "", "Top-level keys.", True)]
    sections: dict[str, list[tuple[str, str, str, str, bool]]] = {"": []}
    for row in config_fields(RunConfig):
        head = row[0].split(".")[0]
        if row[4] and "." not in row[0]:
            top.append(row)
            sections[head] = []
        else:
            sections["" if "." not in row[0] else head].append(row)
    for path, type_name, _, doc, _ in top:
        out += [f"## `{path or 'top level'}`" + (f" ({type_name})" if path else ""), "", _cell(doc), "",
                "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{p}` | {_cell(f'`{t}`')} | {_cell(f'`{d}`')} | {_cell(doc_)} |"
                for p, t, d, doc_, is_section in sections[path] if not is_section or "." in p]
        out.append("")
    return "\n".join(out)


def _commands(command, prefix: str) -> Iterator[tuple[str, object]]:
    yield prefix, command
    if hasattr(command, "commands"):  # a group (Typer's own click classes, not ``click.Group`` subclasses)
        for name in sorted(command.commands):
            yield from _commands(command.commands[name], f"{prefix} {name}")


def _param_row(param) -> str:
    """One table row: an argument (upper case) or an option (its flags), its help and its default."""
    help_text = _cell(" ".join((getattr(param, "help", "") or "").split()))
    if param.param_type_name == "argument":
        names = f"`{param.name.upper()}`" + (" (required)" if param.required else "")
    else:
        names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    value = param.default
    shown = str(value) if isinstance(value, PurePath) else repr(value)
    default = "" if value is None or param.required else _cell(f"`{shown}`")
    return f"| {names} | {help_text} | {default} |"


def cli_reference() -> str:
    """Markdown: every ``cleaner`` command and sub-command with its help text, arguments and options."""
    import typer

    from flows.cli import app

    out = ["# CLI reference", "",
           "Every `cleaner` command, generated from the Typer app (`flows/cli.py`) on each docs build; "
           "`cleaner COMMAND --help` prints the same.", ""]
    for path, command in _commands(typer.main.get_command(app), "cleaner"):
        out += [f"## `{path}`", "", _cell(" ".join((command.help or "").split())), ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            out += ["| name | meaning | default |", "| --- | --- | --- |", *map(_param_row, params), ""]
    return "\n".join(out)


PAGES = {"config": config_reference, "cli": cli_reference}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PAGES:
        sys.exit(f"usage: python -m flows.reference {{{'|'.join(PAGES)}}}")
    print(PAGES[sys.argv[1]]())
