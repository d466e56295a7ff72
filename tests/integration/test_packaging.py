"""The container's runtime environment, built as far as it goes without a Docker engine.

The Dockerfile's deps and build stages copy a few files, make a fresh venv and run a plain
(non-editable) `pip install .`; this copies the same folders (read from the Dockerfile's COPY
lines), does the same install, and then uses `relay` the way the image does: `--help`,
`migrate` (which reads the SQL files shipped inside the wheel), and `status`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import venv
from pathlib import Path

import yaml

from tests.helpers import pg_session
from tests.kit.producer import insert_rows

ROOT = Path(__file__).resolve().parents[2]


def docker_build_context(dest: Path) -> Path:
    """Copy what the Dockerfile's deps and build stages COPY (and nothing else) into `dest`.

    Symlinks stay symlinks, as `COPY` keeps them (relay/sql -> ../sql).
    """
    text = (ROOT / "Dockerfile").read_text()
    # The deps stage copies what the dependencies come from, the build stage the package.
    stages = [text.split(f" AS {name}\n", 1)[1].split("\nFROM ")[0] for name in ("deps", "build")]
    dest.mkdir()
    copies = [c for stage in stages
              for c in re.findall(r"^COPY (?!--from)(.+)$", stage, re.MULTILINE)]
    assert copies
    for line in copies:
        *sources, _target = line.split()
        for source in sources:
            path = ROOT / source.rstrip("/")
            if path.is_dir():
                shutil.copytree(path, dest / path.name, symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(path, dest / path.name)
    return dest


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600,
                          **kwargs)  # type: ignore[call-overload]


async def test_packaging__fresh_venv_install_runs_help_migrate_and_status(
    tmp_path: Path, empty_db: str
) -> None:
    """Over a minute in a loaded CI run (78 s): a fresh virtual environment and a plain `pip
    install .` of the project and its dependencies, as the Dockerfile does."""
    context = docker_build_context(tmp_path / "src")
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    only_binary = re.search(r"--only-binary=(\S+)", (ROOT / "Dockerfile").read_text())
    assert only_binary is not None
    pip = run([str(target / "bin" / "python"), "-m", "pip", "install", "--no-input",
               "--disable-pip-version-check", "--quiet", only_binary.group(0), "."],
              cwd=context)
    assert pip.returncode == 0, pip.stderr[-3000:]
    site = run([str(target / "bin" / "python"), "-c", "import relay, sys; print(relay.__file__)"],
               cwd=tmp_path)
    assert site.stdout.strip().startswith(str(target)), "relay must come from the new venv"
    relay = str(target / "bin" / "relay")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "PYTHON"))}
    env.update(RELAY_PG_DSN=empty_db, RELAY_LOG_FORMAT="json")

    help_ = run([relay, "--help"], env=env, cwd=tmp_path)
    assert help_.returncode == 0
    assert "RELAY_HTTP_PORT" in help_.stdout

    tag = secrets.token_hex(3)
    producer, relay_role = f"pkg_producer_{tag}", f"pkg_relay_{tag}"
    migrate = run([relay, "migrate", "--roles", "--producer-role", producer,
                   "--relay-role", relay_role], env=env, cwd=tmp_path)
    assert migrate.returncode == 0, migrate.stderr
    assert "0001_outbox" in migrate.stdout

    status = run([relay, "status", "--json"], env=env, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["due"] == 0

    # The KEDA scaler's query (deploy/k8s) runs on the migrated table and counts due rows.
    scaled = next(d for d in yaml.safe_load_all(
        (ROOT / "deploy/k8s/keda-scaledobject.yaml").read_text()) if d["kind"] == "ScaledObject")
    async with pg_session(empty_db) as conn:
        await insert_rows(conn, "x", "k", [{}] * 3)
        await insert_rows(conn, "x", "k", [{}], delay_s=3600)
        assert await conn.fetchval(scaled["spec"]["triggers"][0]["metadata"]["query"]) == 3
        for role in (producer, relay_role):
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
