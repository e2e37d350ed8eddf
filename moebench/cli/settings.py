"""Settings declared once: a dataclass field is its flag (its argparse options, how the parsed flags give
its value, how it goes back into a command line), so `--help`, the repro command and sweeps follow one
declaration."""
from __future__ import annotations

import argparse
import dataclasses


def setting(value=None, flag: str | None = None, *, help: str = "", read=None, write=None, extra=(), **argparse_kw):
    """A dataclass field (default `value`) that is a command-line flag: its argparse options (`default`
    there is the flag's, else `value`), how the parsed flags give the field's value (`read(args, ctx)`;
    default: the flag's own value) and how the field goes back into a command line (`write(value) ->
    tokens`; default: `flag value` unless it is the field's default, `flag` for a switch). `extra`: more
    (flag, argparse options) pairs that feed the same field. A new flag is one such field (and the code
    that reads it)."""
    if flag and "default" not in argparse_kw and argparse_kw.get("action") not in ("store_true", "append"):
        argparse_kw["default"] = value
    meta = {"flag": flag, "help": help, "argparse": argparse_kw, "read": read, "write": write, "extra": tuple(extra)}
    if isinstance(value, (dict, list, set)):
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=value, metadata=meta)


def add_settings(p: argparse.ArgumentParser, cls) -> None:
    """Every flag declared by `cls`'s fields (in field order)."""
    for f in dataclasses.fields(cls):
        m = f.metadata
        if m.get("flag"):
            p.add_argument(m["flag"], help=m["help"], **m["argparse"])
        for flag, kw in m.get("extra", ()):
            p.add_argument(flag, **kw)


def read_settings(cls, args, ctx: dict | None = None, skip: tuple[str, ...] = ()) -> dict:
    """{field: value} of `cls`'s flag fields from parsed `args` (each field's `read`, else the flag's value)."""
    out = {}
    for f in dataclasses.fields(cls):
        m = f.metadata
        if f.name in skip or not (m.get("flag") or m.get("read")):
            continue
        out[f.name] = m["read"](args, ctx or {}) if m.get("read") else getattr(args, _dest(m["flag"]))
    return out


def write_settings(obj) -> list[str]:
    """The command-line tokens that give back `obj`'s flag fields."""
    argv: list = []
    for f in dataclasses.fields(obj):
        m, v = f.metadata, getattr(obj, f.name)
        if m.get("write"):
            argv += m["write"](v)
        elif m.get("flag"):
            if m["argparse"].get("action") == "store_true":
                argv += [m["flag"]] if v else []
            elif v is not None and v != f.default:
                argv += [m["flag"], v]
    return [str(a) for a in argv]


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
