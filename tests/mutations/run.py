"""Deliberately broken relays: each mutation breaks one promise of README's "What it promises",
and one named test must fail on it. Exit status 0 only when every mutation was caught.

Each mutation is applied to a temporary copy of the working tree (never to the tree itself),
then only its catching test runs there, with `-x`, against the real servers: the relay
processes the test starts import the mutated copy (PYTHONPATH). A mutation whose pattern no
longer matches the code fails the run loudly, so that a refactoring can never make it pass
vacuously: update the pattern to the new code instead.

    .venv/bin/python tests/mutations/run.py            # all
    .venv/bin/python tests/mutations/run.py --list
    .venv/bin/python tests/mutations/run.py --only no-final-sweep
    .venv/bin/python tests/mutations/run.py --check     # patterns only, no test
    .venv/bin/python tests/mutations/run.py --jobs 1    # one at a time (default: 2)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_TIMEOUT_S = 400


@dataclass(frozen=True)
class Edit:
    """One regex substitution in one file; `pattern` must match exactly once."""

    path: str
    pattern: str
    replacement: str


@dataclass(frozen=True)
class Mutation:
    """A deliberate break, the edits that make it, and the test that must catch it."""

    name: str
    promise: str
    edits: tuple[Edit, ...]
    test: str


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        name="delete-before-publish",
        promise="No loss: a row leaves the outbox only after the broker confirmed it",
        edits=(Edit(
            "relay/pg/store.py",
            r"(?P<i>[ \t]+)(records, more_due = await claim_records\([^)]*\)\n)",
            r"\g<i>\2"
            r"\g<i>await conn.execute(self.q['delete_published'], [r.id for r in records])\n"
            r"\g<i>await conn.execute('COMMIT')\n"
            r"\g<i>await conn.execute('BEGIN')\n",
        ),),
        # Deterministic: a row the broker returns must still be in the outbox, retried (a
        # kill -9 between the early delete and the publish caught it only sometimes).
        test="tests/integration/test_verdicts.py"
             "::test_forged_outbox_header_on_an_unroutable_row__is_held_not_deleted_as_published",
    ),
    Mutation(
        name="no-final-sweep",
        promise="Nothing waits on polling: the relay sweeps once more before it sleeps",
        # The lock's check saw rows due once the sleep lock was held (producers that met an
        # awake relay skipped their NOTIFY): the relay must drain or sweep them; the mutant
        # sleeps.
        edits=(
            Edit("relay/loop/sleep.py", r"if awake:", "if False:"),
            Edit("relay/loop/sleep.py", r"if due:", "if False:"),
            Edit("relay/loop/sleep.py", r"elif self\._producers_hold_the_lock\(state\):",
                 "elif False:"),
        ),
        test="tests/integration/test_conditional_notify.py"
             "::test_conditional__race_straddling_sleep_delivers_every_row_within_bound",
    ),
    Mutation(
        name="returned-as-confirmed",
        promise="Bad rows: an unroutable (returned) message is not deleted as delivered",
        edits=(Edit(
            "relay/amqp/pipeline.py",
            r"if status == acked and returned is None:",
            "if status == acked:",
        ),),
        test="tests/chaos/test_bad_rows.py",
    ),
    Mutation(
        name="confirm-timeout-as-confirmed",
        promise="No loss: a confirm that never comes is not a confirm",
        edits=(Edit(
            "relay/amqp/pipeline.py",
            r"(?P<i>[ \t]+)(returned = sent\.returned\.get\(m\.id\)\n)",
            r"\g<i>if status == timeout:\n"
            r"\g<i>    result.confirmed.append(m.id)\n"
            r"\g<i>    continue\n"
            r"\g<i>\2",
        ),),
        test="tests/chaos/test_black_hole.py"
             "::test_black_hole_to_rabbitmq__batches_sent_into_it_time_out_and_are_delivered_later",
    ),
    Mutation(
        name="refusal-on-the-shared-channel",
        promise="A refusal the encoder cannot foresee costs no other message: no duplicate, "
                "no good row blamed",
        # The first message to a new exchange no longer goes alone on the probe channel: an
        # internal exchange closes the shared channel under every lane's messages.
        edits=(Edit("relay/amqp/pipeline.py", r"if pending and self\.probe is not None:",
                    "if False:"),),
        test="tests/integration/test_broker_refusals.py",
    ),
    Mutation(
        name="late-confirm-charged",
        promise="A confirm that comes late is not the row's fault: no attempt counted",
        edits=(Edit(
            "relay/amqp/pipeline.py",
            r"result\.unsent\[m\.id\] = Reason\.DEADLINE  # a slow link, a busy queue\n",
            "result.failed[m.id] = Fault(Reason.CONFIRM_TIMEOUT, 'late')\n",
        ),),
        test="tests/unit/test_pipeline.py"
             "::test_publish__a_late_confirm_while_the_broker_confirms_others_is_not_the_rows_fault",
    ),
    Mutation(
        name="confirmed-thrown-away-at-deadline",
        promise="A slow link makes progress: what the broker confirmed before a deadline is "
                "kept, and no shared channel is closed for a deadline",
        edits=(Edit(
            "relay/amqp/transports.py",
            r"(?P<i>[ \t]+)channel\.tracker\.trim\(tags, written\)\n",
            r"\g<i>channel.tracker.discard(tags)\n"
            r"\g<i>await channel.closing.close()\n"
            r"\g<i>return Sent([Confirm.LOST] * len(messages))\n",
        ),),
        test="tests/unit/test_pipeline.py"
             "::test_bulk_send__a_deadline_between_writes_keeps_what_was_confirmed_and_the_channel",
    ),
    Mutation(
        name="returns-from-a-reopened-channel",
        promise="No loss: a returned message is never deleted as published, also when another "
                "lane reopened the channel meanwhile",
        edits=(Edit(
            "relay/amqp/transports.py",
            r"return Sent\(status, channel\.returns\.take\(",
            "return Sent(status, self._confirm.returns.take(",
        ),),
        test="tests/unit/test_pipeline.py"
             "::test_bulk_send__returns_are_read_from_the_channel_the_pass_went_on",
    ),
    Mutation(
        name="broker-loss-deletes-unsent",
        promise="No loss: rows whose publish a broker loss cut off stay in the outbox",
        edits=(Edit(
            "relay/amqp/pipeline.py",
            r"(?P<i>[ \t]+)result\.unsent\[m\.id\] = cause\n",
            r"\g<i>if cause is Reason.BROKER_LOST:\n"
            r"\g<i>    result.confirmed.append(m.id)\n"
            r"\g<i>else:\n"
            r"\g<i>    result.unsent[m.id] = cause\n",
        ),),
        # Messages written into a black hole never reach the broker: deleting them as
        # published loses them (a link reset after the write would not show it, the broker
        # having routed them already).
        test="tests/chaos/test_black_hole.py"
             "::test_black_hole_to_rabbitmq__batches_sent_into_it_time_out_and_are_delivered_later",
    ),
)


class PatternMissing(RuntimeError):
    """A mutation's pattern does not match the code (exactly once): update the mutation."""


def copy_tree(dest: Path) -> Path:
    """The working tree's files (tracked and new, not ignored) copied under dest."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    root = dest / "repo"
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    return root


def apply(mutation: Mutation, root: Path) -> None:
    """Apply every edit; raise PatternMissing unless each pattern matches exactly once."""
    for edit in mutation.edits:
        path = root / edit.path
        text = path.read_text()
        found = len(re.findall(edit.pattern, text))
        if found != 1:
            raise PatternMissing(
                f"{mutation.name}: pattern matches {found} times in {edit.path} (needs 1): "
                f"{edit.pattern!r}")
        mutated = re.sub(edit.pattern, edit.replacement, text)
        if path.suffix == ".py":
            # A mutation that does not even compile would be "caught" by any test.
            compile(mutated, str(path), "exec")
        path.write_text(mutated)


def run_test(mutation: Mutation, root: Path) -> tuple[bool, str, float]:
    """Run the catching test against the mutated copy; (caught, last output lines, seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["PYTHONPATH"] = str(root)  # before the editable install: relay imports from the copy
    env["COLUMNS"] = "1000"  # -rf summary lines cut at 80 columns lose " - AssertionError..."
    for key in ("RELAY_TEST_PG_DSN", "RELAY_TEST_AMQP_URL"):
        if key in os.environ:
            env[key] = os.environ[key]
    where = subprocess.run([sys.executable, "-c", "import relay; print(relay.__file__)"],
                           cwd=root, env=env, capture_output=True, text=True, check=True)
    if not where.stdout.strip().startswith(str(root)):
        raise RuntimeError(f"relay imports from {where.stdout.strip()}, not the mutated copy")
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider",
         mutation.test],
        cwd=root, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S, check=False,
    )
    elapsed = time.monotonic() - started
    tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-6:])
    # 1: tests ran and failed. Anything else (no test collected, usage error, interrupted)
    # proves nothing about the mutation.
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{mutation.name}: pytest exited {out.returncode}:\n{tail}")
    if out.returncode == 0:
        return False, tail, elapsed
    # Caught means an assertion of the test failed; a test that crashed (TypeError, a fixture
    # error...) says nothing about the mutation.
    failed = [line for line in out.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    errors = [line for line in out.stdout.splitlines() if line.startswith("E ")]
    by_assert = any("AssertionError" in e or e[1:].lstrip().startswith("assert ") for e in errors)
    if failed and not any(line.startswith("ERROR") for line in failed) and by_assert:
        return True, "\n".join(failed), elapsed
    if not failed or not all(_assertion(line) for line in failed):
        raise RuntimeError(f"{mutation.name}: the test failed, but not on an assertion:\n"
                           + "\n".join(failed or [tail]))
    return True, "\n".join(failed), elapsed


def _assertion(summary_line: str) -> bool:
    """A `-rf` summary line of a failed assertion (`- AssertionError: ...` or `- assert ...`)."""
    return summary_line.startswith("FAILED") and (
        " - AssertionError" in summary_line or " - assert " in summary_line
        or "Error: assert" in summary_line)


def main(argv: list[str] | None = None) -> int:
    """Run the selected mutations; 0 only when every one was caught."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], help="mutation name (repeat)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--jobs", type=int, default=2,
                        help="mutations tested at a time (default 2)")
    parser.add_argument("--check", action="store_true",
                        help="only check that every pattern still matches the code")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:<30} {m.test}\n{'':<30} {m.promise}")
        return 0
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {sorted(unknown)}")
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    with tempfile.TemporaryDirectory(prefix="relay-mutations-") as tmp:
        pristine = copy_tree(Path(tmp))
        for m in chosen:  # every pattern first: a stale one fails before any test runs
            scratch = Path(tmp) / f"check-{m.name}"
            shutil.copytree(pristine, scratch)
            apply(m, scratch)
            shutil.rmtree(scratch)
        if args.check:
            print(f"[mutation] {len(chosen)} patterns match")
            return 0
        missed = []

        def one(m: Mutation) -> tuple[Mutation, bool, str, float]:
            root = Path(tmp) / m.name
            shutil.copytree(pristine, root)
            try:
                apply(m, root)
                return (m, *run_test(m, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)

        # Each mutation's test has a database, an exchange and a queue of its own, like the
        # suite's on its workers: `--jobs` of them at a time.
        with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            for done in as_completed([pool.submit(one, m) for m in chosen]):
                m, caught, tail, elapsed = done.result()
                verdict = "caught" if caught else "MISSED"
                print(f"[mutation] {m.name}: {verdict} by {m.test} in {elapsed:.0f}s",
                      flush=True)
                if caught:
                    print(f"           {tail.splitlines()[0][:200]}", flush=True)
                else:
                    missed.append(m.name)
                    print(tail, flush=True)
    print(f"[mutation] {len(chosen) - len(missed)}/{len(chosen)} caught"
          + (f"; missed: {missed}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
