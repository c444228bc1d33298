"""Loading a config file and applying dotted overrides; the one-line error every bad value
becomes (:class:`ConfigError`), named by its dotted config field.

A library dataclass raises ``ValueError("name=value: why; e.g. name=x")``; :func:`build_section`
re-raises it as a :class:`ConfigError` with ``name`` replaced by its config path
(``rl.lr=-1.0: must be > 0 (e.g. --config.rl.lr=1e-3)``).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import runpy

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"


class ConfigError(ValueError):
    """A config value this run cannot use. The message is one line: the dotted field, its value,
    what it must be and the fix."""


def load_config(name_or_path: str | os.PathLike, overrides: dict | None = None):
    """A config from ``configs/<name>.py`` (e.g. ``"tiny"``) or a path to a config file, with
    dotted overrides applied (``{"rl.lr": 1e-3, "mode": "baseline"}``) as ``--config.x=...``
    would. Unknown keys raise KeyError naming the key, so a typo never passes silently."""
    path = pathlib.Path(name_or_path)
    if path.suffix != ".py":
        path = CONFIG_DIR / f"{name_or_path}.py"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.py")) if CONFIG_DIR.is_dir() else []
        raise FileNotFoundError(f"no config file {str(path)!r}; known configs: {known} "
                                "(a config lives in the repository's configs/ folder)")
    return apply_overrides(runpy.run_path(str(path))["get_config"](), overrides)


def apply_overrides(config, overrides: dict | None):
    """``config`` with dotted overrides set in place (``{"rl.lr": 1e-3}``); an unknown key
    raises KeyError naming it. Returns ``config``."""
    for key, value in (overrides or {}).items():
        *parents, leaf = key.split(".")
        section = config
        for part in parents:
            if part not in section:
                raise KeyError(f"config override {key!r}: no section {part!r}")
            section = section[part]
        if leaf not in section:
            raise KeyError(f"config override {key!r}: no field {leaf!r} in "
                           f"{'.'.join(parents) or 'the top level'}")
        section[leaf] = value
    return config


def pick_fields(cls, section, **overrides):
    """The frozen dataclass ``cls`` from the config section's matching fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in dict(section).items() if k in names}
    values.update(overrides)
    return cls(**values)


# -- validation: a library dataclass's "name=value: ..." errors, named by their config fields --

def section_paths(prefix: str, cls, **renamed) -> dict[str, str]:
    """``{field: dotted config path}`` of ``cls`` under the section ``prefix`` (``renamed``:
    fields whose config key differs, e.g. ``num_steps="sampler.eval_steps"``)."""
    return {f.name: renamed.get(f.name, f"{prefix}.{f.name}") for f in dataclasses.fields(cls)}


def qualify(message: str, paths: dict[str, str]) -> str:
    """``message`` with each bare ``field=`` replaced by its dotted config path, and an example
    fix ``e.g. field=x`` by the flag that sets it (``e.g. --config.rl.lr=x``)."""
    names = "|".join(re.escape(n) for n in sorted(paths, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.\-])(e\.g\. )?({names})=")
    return pattern.sub(lambda m: (f"e.g. --config.{paths[m.group(2)]}=" if m.group(1)
                                  else f"{paths[m.group(2)]}="), message)


def build_section(paths: dict[str, str], make):
    """``make()``, its ValueError re-raised as a :class:`ConfigError` named by ``paths``."""
    try:
        return make()
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(qualify(str(e), paths)) from e
