"""Configuration that catches mistakes: unknown RELAY_* names, and the effective settings.

A misspelt variable (RELAY_BATCHSIZE) would otherwise be ignored in silence and the default
used; here it stops start-up with the closest known name.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from relay.dsn import redact
from relay.errors import ConfigError
from relay.settings import SECRET_FIELDS, Settings

PREFIX = "RELAY_"
# Read outside Settings: the folder of secret files (relay/cli/main.py).
EXTRA_VARIABLES = {"RELAY_SECRETS_DIR"}
# The test suite's own variables (tests/services.py), never read by the relay.
RESERVED_PREFIXES = ("RELAY_TEST_",)


def env_names(field_name: str) -> list[str]:
    """The variables one field reads, canonical name first (RELAY_<FIELD>, then aliases)."""
    names = [f"{PREFIX}{field_name.upper()}"]
    alias = Settings.model_fields[field_name].validation_alias
    for choice in getattr(alias, "choices", []):
        if isinstance(choice, str) and choice.upper() not in names:
            names.append(choice.upper())
    return names


def known_variables() -> set[str]:
    """Every RELAY_* variable the relay reads."""
    names = set(EXTRA_VARIABLES)
    for field_name in Settings.model_fields:
        names.update(env_names(field_name))
    return names


def unknown_variables(names: Iterable[str]) -> list[str]:
    """One message per RELAY_* name the relay does not read, with the closest known name."""
    known = sorted(known_variables())
    problems = []
    for raw in sorted(set(names)):
        name = raw.upper()
        if not name.startswith(PREFIX) or name in known or name.startswith(RESERVED_PREFIXES):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(f"{raw}{hint}")
    return problems


def dotenv_names(path: Path = Path(".env")) -> list[str]:
    """Keys of the .env file Settings reads (none when it does not exist)."""
    if not path.is_file():
        return []
    return [k for k in dotenv_values(path) if k]


def check_variables(environ: Mapping[str, str] | None = None,
                    env_file: Path = Path(".env")) -> None:
    """Raise ConfigError naming every unknown RELAY_* variable of the environment and .env."""
    env = os.environ if environ is None else environ
    problems = [f"{p} in the environment" for p in unknown_variables(env)]
    problems += [f"{p} in {env_file}" for p in unknown_variables(dotenv_names(env_file))]
    if problems:
        raise ConfigError("unknown setting: " + "; ".join(problems)
                          + " (`relay --help` lists every setting)")


def _shown(field_name: str, value: Any) -> str:
    if value is None:
        return "" if field_name != "pg_dsn" else "<libpq defaults>"
    if field_name == "admin_token":
        return "<set, not shown>"
    if field_name in SECRET_FIELDS:
        return redact(str(value))
    return str(getattr(value, "value", value))


def effective(settings: Settings, environ: Mapping[str, str] | None = None,
              env_file: Path = Path(".env")) -> list[dict[str, str]]:
    """Each setting's variable, value (secrets redacted) and where it came from."""
    env = {k.upper() for k in (os.environ if environ is None else environ)}
    dotenv = {k.upper() for k in dotenv_names(env_file)}
    rows = []
    for field_name in Settings.model_fields:
        names = env_names(field_name)
        if field_name not in settings.model_fields_set:
            source = "default"
        elif env & set(names):
            source = "environment"
        elif dotenv & set(names):
            source = str(env_file)
        else:
            source = "secret file"
        rows.append({"variable": names[0], "value": _shown(field_name, getattr(settings,
                                                                                 field_name)),
                     "source": source})
    return rows
