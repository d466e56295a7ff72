"""The relay's own settings, read by Spark jobs so one configuration serves daemon and jobs."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from relay.errors import ConfigError
from relay.settings import Settings


def load_settings(**overrides: Any) -> Settings:
    """Settings from RELAY_* variables and .env (keyword overrides win, e.g. table=...); a bad
    value raises ConfigError naming it."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = [
            f"RELAY_{str(err['loc'][0]).upper() if err['loc'] else '?'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError("invalid setting: " + "; ".join(problems)) from None
