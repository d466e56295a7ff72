"""The relay's version, for `relay version`, logs and the relay_build_info metric."""

from __future__ import annotations

import platform
from importlib import metadata


def version() -> str:
    """The installed package's version."""
    try:
        return metadata.version("outbox-relay")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without install
        return "0+unknown"


def build_labels() -> dict[str, str]:
    """Labels of the relay_build_info metric."""
    return {"version": version(), "python": platform.python_version()}
