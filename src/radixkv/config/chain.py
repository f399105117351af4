"""The configuration chain: one frozen EngineConfig made of model / cache / scheduler / server
sections, shared by the CLI, the Engine API and the server.

    cfg = EngineConfig(page_size=16, num_slots=4096)          # flat keywords, mapped to sections
    cfg = EngineConfig(cache=CacheConfig(page_size=16))       # or whole sections
    cfg.cache.page_size, cfg.scheduler.max_running_requests  # section access
    cfg = cfg.override(eviction_policy="s3fifo")              # a copy with some fields changed
    cfg.validate()                                            # every error at once (ConfigError)
    print(cfg.format())                                       # the start-up printout
    cfg.describe()                                            # the same as plain data (/config)

Every flat keyword is a section field's name (see FLAT_ALIASES for the two that are not);
`flat_names()` lists them. Use `override`, not `dataclasses.replace`, for flat keywords: replace
passes every section along, so replace(cfg, cache="blockhash") would rebuild the cache section
from its defaults; that call is refused with a TypeError that says so.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from radixkv.config.fields import MASK, Section, flag_of
from radixkv.config.sections import CacheConfig, ModelConfig, SchedulerConfig, ServerConfig

SECTIONS: dict[str, type[Section]] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "server": ServerConfig,
}
# Flat names that differ from the field name (kept from the flat EngineConfig and its flags).
FLAT_ALIASES: dict[str, tuple[str, str]] = {"model": ("model", "path"), "cache": ("cache", "kind")}


def _flat_map() -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for sname, cls in SECTIONS.items():
        for f in cls.fields():
            assert f.name not in out, f"field {f.name} is in two sections"
            out[f.name] = (sname, f.name)
    for alias, target in FLAT_ALIASES.items():
        out.pop(target[1], None)
        out[alias] = target
    return out


_FLAT = _flat_map()


class ConfigError(ValueError):
    """An invalid configuration; `errors` lists every problem, each naming its flag."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(errors))
        self.errors = errors


@dataclass(frozen=True, init=False)
class EngineConfig:
    """The whole configuration: `model`, `cache`, `scheduler` and `server` sections."""

    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    server: ServerConfig

    def __init__(
        self,
        model: ModelConfig | str | None = None,
        cache: CacheConfig | str | None = None,
        scheduler: SchedulerConfig | None = None,
        server: ServerConfig | None = None,
        **flat: Any,
    ) -> None:
        """Sections given whole, and/or flat keywords applied on top of them. `model` and
        `cache` may also be the flat values (checkpoint path, cache kind)."""
        given = {"model": model, "cache": cache, "scheduler": scheduler, "server": server}
        sections: dict[str, Any] = {}
        for name, value in given.items():
            if isinstance(value, SECTIONS[name]):
                sections[name] = value
                continue
            if value is not None and not (name in FLAT_ALIASES and isinstance(value, str)):
                raise TypeError(f"EngineConfig: {name} must be a {SECTIONS[name].__name__}")
            if isinstance(value, str):
                others = [n for n in SECTIONS if n != name]
                if all(isinstance(given[n], SECTIONS[n]) for n in others):
                    raise TypeError(
                        f"dataclasses.replace(config, {name}=...) would reset the {name} "
                        f"section; use config.override({name}=...)"
                    )
                flat[name] = value
            sections[name] = SECTIONS[name]()
        self._set(sections, flat)

    def _set(self, sections: dict[str, Any], flat: dict[str, Any]) -> None:
        for name, value in _apply(sections, flat).items():
            object.__setattr__(self, name, value)

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def add_args(
        cls, parser: argparse.ArgumentParser, *, server: bool = False, **defaults: Any
    ) -> argparse.ArgumentParser:
        """Register the flags of the model, cache and scheduler sections (and of the server
        section with `server=True`), one argparse group each; `defaults` override flag defaults
        by flat name."""
        per_section: dict[str, dict[str, Any]] = {n: {} for n in SECTIONS}
        for key, value in defaults.items():
            if key not in _FLAT:
                raise TypeError(f"no flag for {key!r}")
            sname, fname = _FLAT[key]
            per_section[sname][fname] = value
        for sname, section in SECTIONS.items():
            if sname != "server" or server:
                section.add_args(parser, **per_section[sname])
        return parser

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """The configuration parsed flags describe (absent flags keep their defaults)."""
        sections: dict[str, Any] = {n: c.from_args(args) for n, c in SECTIONS.items()}
        return cls(**sections)

    def override(self, **changes: Any) -> EngineConfig:
        """A copy with some fields changed: flat names (page_size=16, cache="blockhash") and/or
        whole sections (scheduler=SchedulerConfig(...), applied first)."""
        sections: dict[str, Any] = {n: getattr(self, n) for n in SECTIONS}
        flat: dict[str, Any] = {}
        for key, value in changes.items():
            if key in SECTIONS and isinstance(value, SECTIONS[key]):
                sections[key] = value
            else:
                flat[key] = value
        out = object.__new__(EngineConfig)
        out._set(sections, flat)
        return out

    @staticmethod
    def flat_names() -> list[str]:
        """Every keyword EngineConfig(...), override(...) and Engine(**overrides) accept."""
        return sorted(_FLAT)

    # -- derived values ------------------------------------------------------------------------
    @property
    def tiers_enabled(self) -> bool:
        return self.cache.tiers_enabled

    @property
    def prefix_cache_enabled(self) -> bool:
        return self.cache.prefix_cache_enabled

    # -- checking and showing ------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every problem of every section, as "--flag (section.field): what is wrong"."""
        out: list[str] = []
        for sname in SECTIONS:
            section: Section = getattr(self, sname)
            fields = {f.name: f for f in section.fields()}
            for fname, msg in section.problems():
                flag = flag_of(fields[fname]) if fname in fields else None
                where = f"{sname}.{fname}"
                out.append(f"{flag} ({where}): {msg}" if flag else f"{where}: {msg}")
        return out

    def validate(self) -> EngineConfig:
        """Raise ConfigError listing every problem; returns self when the configuration is valid.
        The one place the configuration is checked (the engine and the CLI both call it)."""
        errors = self.problems()
        if errors:
            raise ConfigError(errors)
        return self

    def describe(self) -> dict[str, dict[str, Any]]:
        """Section → field → value as plain data (JSON-ready), secrets masked."""
        return {n: getattr(self, n).describe() for n in SECTIONS}

    def format(self, sections: tuple[str, ...] = tuple(SECTIONS)) -> str:
        """The printout `radixkv serve` logs at start-up: one line per field with its flag,
        `*` marking values that differ from the default, secrets masked."""
        lines = ["configuration (* = not the default):"]
        for sname in sections:
            section: Section = getattr(self, sname)
            changed, values = section.changed(), section.describe()
            lines.append(f"  [{sname}]")
            for f in section.fields():
                mark = "*" if f.name in changed else " "
                value = values[f.name]
                shown = value if value == MASK else repr(value)
                flag = flag_of(f) or "(API only)"
                lines.append(f"  {mark} {f.name:<34} {shown:<24} {flag}")
        return "\n".join(lines)


def _apply(sections: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """`sections` with the flat keywords applied to the section each belongs to."""
    per_section: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if key not in _FLAT:
            raise TypeError(f"EngineConfig got an unexpected keyword argument {key!r}")
        sname, fname = _FLAT[key]
        per_section.setdefault(sname, {})[fname] = value
    out = dict(sections)
    for sname, changes in per_section.items():
        out[sname] = dataclasses.replace(out[sname], **changes)
    return out
