"""The tests' free ports: outside the kernel's ephemeral range, never handed out twice."""

from __future__ import annotations

import socket

import pytest

from tests.kit import ports


def test_free_port__below_the_ephemeral_range_free_and_never_repeated() -> None:
    handed = [ports.free_port() for _ in range(200)]
    assert len(set(handed)) == len(handed)
    assert all(ports.LOWEST <= port <= ports._highest() for port in handed)
    for port in handed[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free: nothing was left bound


def test_free_port__skips_a_port_something_listens_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports.free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        picks = iter([taken, taken, taken + 1])
        monkeypatch.setattr(ports.random, "randint", lambda low, high: next(picks))
        assert ports.free_port() == taken + 1


@pytest.mark.parametrize("worker", [0, 1, 2])
def test_free_port__each_worker_of_a_parallel_run_has_ports_of_its_own(
    monkeypatch: pytest.MonkeyPatch, worker: int
) -> None:
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    handed = [ports.free_port() for _ in range(100)]
    assert {port % 3 for port in handed} == {worker}
    assert all(ports.LOWEST <= port <= ports._highest() for port in handed)
