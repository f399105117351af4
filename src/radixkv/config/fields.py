"""Declaring a configuration field once: its default, its flag, its help, its checks.

Every section of the chain (radixkv.config.sections) is a frozen dataclass whose fields are made
with `opt(...)`. The metadata carried by each field drives all four uses of the section, so the
flag, the check and the printout can never drift apart:

- `Section.add_args(parser)` registers one argparse group per section (flag name, type, default,
  choices and help all come from the field);
- `Section.from_args(args)` builds the section back from the parsed namespace (a parser that did
  not register a section's flags leaves that section at its defaults);
- `Section.problems()` checks choices and bounds generically, then the section's own rules;
- `Section.describe()` lists the values as plain data (secrets masked) for the start-up printout
  and the `/config` route.

No torch here: `radixkv --help` and the server process import this cheaply.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

S = TypeVar("S", bound="Section")
Choices = Sequence[Any] | Callable[[], Sequence[Any]]
MASK = "***"  # what a set secret shows as


def opt(
    default: Any,
    help: str,
    *,
    flag: str | None = "",
    type: Callable[[str], Any] | None = None,
    choices: Choices | None = None,
    min: float | None = None,
    max: float | None = None,
    positive: bool = False,
    unit: int = 1,
    group: str | None = None,
    secret: bool = False,
    negatable: bool = False,
) -> Any:
    """A section field. `flag=""` derives `--field-name`; `flag=None` gives no flag (API only).
    `unit` scales the flag's value into the field (--kv-cache-mb 512 → 512 * 2**20 bytes).
    `min`/`max` are inclusive bounds and `positive` means > 0 (None values are never checked).
    `group` names a second argparse group of the section; `secret` masks the value in printouts;
    `negatable` gives a bool both --x and --no-x (otherwise a False default is a plain switch)."""
    meta = {
        "help": help,
        "flag": flag,
        "type": type,
        "choices": choices,
        "min": min,
        "max": max,
        "positive": positive,
        "unit": unit,
        "group": group,
        "secret": secret,
        "negatable": negatable,
    }
    return dataclasses.field(default=default, metadata=meta, repr=not secret)


def flag_of(f: dataclasses.Field[Any]) -> str | None:
    """The command-line flag of a field (None: settable from the API only)."""
    flag = f.metadata.get("flag", None)
    if flag == "":
        return "--" + f.name.replace("_", "-")
    return flag if isinstance(flag, str) else None


def _choices(f: dataclasses.Field[Any]) -> list[Any] | None:
    c = f.metadata.get("choices")
    if c is None:
        return None
    return list(c() if callable(c) else c)


class Section:
    """Behaviour shared by the sections (each a frozen dataclass using `opt` fields)."""

    title: ClassVar[str]  # the section's name in the chain and its argparse group

    @classmethod
    def fields(cls) -> Iterator[dataclasses.Field[Any]]:
        yield from dataclasses.fields(cls)  # type: ignore[arg-type]

    @classmethod
    def add_args(
        cls,
        parser: argparse.ArgumentParser,
        only: Sequence[str] | None = None,
        **defaults: Any,
    ) -> None:
        """Register this section's flags (one group per `group`), or only those of the fields
        named in `only`; `defaults` overrides the flag default of a field by name (e.g.
        `compile=True` to turn --compile on by default)."""
        groups: dict[str, Any] = {}
        for f in cls.fields():
            flag = flag_of(f)
            if flag is None or (only is not None and f.name not in only):
                continue
            title = f.metadata.get("group") or cls.title
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            default = defaults.get(f.name, f.default)
            groups[title].add_argument(flag, **_argparse_kwargs(f, default))

    @classmethod
    def from_args(cls: type[S], args: argparse.Namespace) -> S:
        """The section the parsed flags describe (flags the parser lacks keep their default)."""
        values: dict[str, Any] = {}
        for f in cls.fields():
            flag = flag_of(f)
            if flag is None:
                continue
            dest = flag.removeprefix("--").replace("-", "_")
            if hasattr(args, dest):
                v = getattr(args, dest)
                unit = int(f.metadata.get("unit", 1))
                values[f.name] = int(v * unit) if unit != 1 and v is not None else v
        return cls(**values)

    def problems(self) -> list[tuple[str, str]]:
        """(field name, what is wrong) for every invalid value; empty when the section is valid."""
        out: list[tuple[str, str]] = []
        for f in self.fields():
            v = getattr(self, f.name)
            if v is None or isinstance(v, bool):
                continue
            choices, m = _choices(f), f.metadata
            if choices is not None and v not in choices:
                out.append((f.name, f"{v!r} is not one of {', '.join(map(str, choices))}"))
            if m.get("min") is not None and v < m["min"]:
                out.append((f.name, f"must be >= {m['min']:g} (got {v!r})"))
            if m.get("max") is not None and v > m["max"]:
                out.append((f.name, f"must be <= {m['max']:g} (got {v!r})"))
            if m.get("positive") and v <= 0:
                out.append((f.name, f"must be > 0 (got {v!r})"))
        out.extend(self.check())
        return out

    def check(self) -> list[tuple[str, str]]:
        """Rules beyond one field's choices and bounds (overridden by the sections that have
        them)."""
        return []

    def describe(self) -> dict[str, Any]:
        """Field → value as plain data, secrets masked (a set secret shows as MASK)."""
        out: dict[str, Any] = {}
        for f in self.fields():
            v = getattr(self, f.name)
            out[f.name] = MASK if f.metadata.get("secret") and v is not None else v
        return out

    def changed(self) -> set[str]:
        """Names of the fields that differ from their default."""
        return {f.name for f in self.fields() if getattr(self, f.name) != f.default}


def _argparse_kwargs(f: dataclasses.Field[Any], default: Any) -> dict[str, Any]:
    m = f.metadata
    kw: dict[str, Any] = {"help": m["help"]}
    if isinstance(f.default, bool):
        if f.default or default or m.get("negatable"):  # --x / --no-x
            kw.update(action=argparse.BooleanOptionalAction, default=bool(default))
            kw["help"] += " (default: %(default)s)"
        else:
            kw.update(action="store_true", default=False)
        return kw
    unit = int(m.get("unit", 1))
    typ = m.get("type") or (type(f.default) if f.default is not None else str)
    if unit != 1:
        typ = float
        default = default / unit if default is not None else None
    kw.update(type=typ, default=default)
    choices = _choices(f)
    if choices is not None:
        kw["choices"] = choices
    if default is not None and "default" not in kw["help"]:
        kw["help"] += " (default: %(default)s)"
    return kw
