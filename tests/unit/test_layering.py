"""The layering contract of relay/ (docs/architecture.md): each driver behind its seam, and
each folder importing only what it may. Reads every import statement, top level or not."""

from __future__ import annotations

import ast
from pathlib import Path

RELAY = Path(__file__).resolve().parents[2] / "relay"

# A driver's modules may be imported only inside its folders. The consumer's inbox
# (relay/inbox/) is a library of its own for consumers: both drivers, nothing else of relay/.
DRIVERS = {
    "asyncpg": ("pg", "inbox"),
    "aio_pika": ("amqp", "inbox"),
    "aiormq": ("amqp",),
    "pamqp": ("amqp",),
    "pyspark": ("spark",),
    "rstream": ("streams",),
    # Imported only when tracing is on, and only there (relay/tracing/__init__.py).
    "opentelemetry": ("tracing",),
}

# What a folder of relay/ must not import (modules of relay/ by dotted prefix). The protocols a
# folder implements for another live in relay/interfaces.py, which every folder may import.
FORBIDDEN = {
    "loop": ("relay.pg", "relay.amqp", "relay.ops", "relay.spark", "relay.app", "relay.cli"),
    "pg": ("relay.amqp", "relay.ops", "relay.spark", "relay.app", "relay.cli", "relay.loop"),
    "amqp": ("relay.pg", "relay.loop", "relay.ops", "relay.spark", "relay.app", "relay.cli"),
    "ops": ("relay.pg", "relay.amqp", "relay.loop", "relay.spark", "relay.app", "relay.cli"),
    "spark": ("relay.amqp", "relay.loop", "relay.ops", "relay.app", "relay.cli"),
    "tracing": ("relay.pg", "relay.amqp", "relay.loop", "relay.ops", "relay.spark", "relay.app",
                "relay.cli"),
    "streams": ("relay.amqp", "relay.loop", "relay.ops", "relay.spark", "relay.app", "relay.cli"),
}


def _imports(path: Path) -> list[str]:
    """Every module `path` imports (absolute names; relative imports resolved)."""
    package = ".".join(path.relative_to(RELAY.parent).with_suffix("").parts[:-1])
    return _read_imports(path.read_text(), package)


def _read_imports(source: str, package: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append(module)
            # `from relay.pg import store` imports relay.pg.store
            found += [f"{module}.{alias.name}" for alias in node.names
                      if module.startswith("relay")]
    return found


def _modules() -> list[tuple[str, Path]]:
    """(folder under relay/, or "" at its top) and path of every module of relay/."""
    out = []
    for path in sorted(RELAY.rglob("*.py")):
        parts = path.relative_to(RELAY).parts
        out.append((parts[0] if len(parts) > 1 else "", path))
    return out


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_every_driver_is_imported_only_behind_its_seam() -> None:
    crossings = []
    for folder, path in _modules():
        for module in _imports(path):
            top = module.split(".")[0]
            if top in DRIVERS and folder not in DRIVERS[top]:
                crossings.append(f"{path.relative_to(RELAY.parent)} imports {module}")
    assert crossings == []


def test_every_folder_imports_only_what_it_may() -> None:
    crossings = []
    for folder, path in _modules():
        for module in _imports(path):
            if any(_within(module, f) for f in FORBIDDEN.get(folder, ())):
                crossings.append(f"{path.relative_to(RELAY.parent)} imports {module}")
    assert crossings == []


# What the inbox may import of relay/: itself, the SQL loader and the socket tuning (standard
# library and asyncpg only), so a consumer needs aio-pika and asyncpg and nothing else of the
# relay's dependencies.
INBOX_MAY_IMPORT = ("relay.inbox", "relay.pg.queries", "relay.pg.compat")


def test_the_inbox_imports_nothing_of_the_relay_but_the_sql_loader_and_the_socket_tuning() -> None:
    crossings = [f"{path.relative_to(RELAY.parent)} imports {module}"
                 for folder, path in _modules() if folder == "inbox"
                 for module in _imports(path)
                 if module.startswith("relay") and module != "relay"
                 and not any(_within(module, m) for m in INBOX_MAY_IMPORT)]
    assert crossings == []


def test_importing_the_inbox_loads_none_of_the_relays_other_dependencies() -> None:
    import subprocess
    import sys

    code = ("import sys, relay.inbox; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'pydantic', 'pydantic_settings', 'structlog', 'prometheus_client', 'cronsim', "
            "'uvloop', 'opentelemetry'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_the_contract_reads_imports_inside_functions_too() -> None:
    """The reader itself: a late import counts like any other."""
    code = "def f():\n    import asyncpg\n    from relay.pg import store\n    from ..pg import x\n"
    found = _read_imports(code, "relay.loop")
    assert "asyncpg" in found
    assert "relay.pg.store" in found
    assert "relay.pg.x" in found


def test_cli__commands_open_the_database_through_pg_never_a_connection_of_their_own() -> None:
    """A command file asks pg/ for what it works on (a session, a status reader, the dead
    letters); connecting is pg/connection.py's business."""
    opened = [(path.name, name) for folder, path in _modules() if folder == "cli"
              for name in _imports(path)
              if name in ("relay.pg.connection.connect", "relay.pg.connection.connect_when_up")]
    assert opened == []


# The doors: where the settings are read and turned into the small typed configs the rest take
# (relay/pg/config.py's DatabaseConfig, the worker's WorkerConfig, ...). relay/spark/config.py
# is the door of the Spark writer, a library users call from their own jobs.
SETTINGS_DOORS = ("app.py", "cli/", "spark/config.py")


def test_only_the_doors_read_the_settings() -> None:
    readers = []
    for _, path in _modules():
        rel = path.relative_to(RELAY).as_posix()
        if rel == "settings.py" or any(
                rel == d or (d.endswith("/") and rel.startswith(d)) for d in SETTINGS_DOORS):
            continue
        if "relay.settings.Settings" in _imports(path):
            readers.append(rel)
    assert readers == []
