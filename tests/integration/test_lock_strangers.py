"""A session that is not a relay holding a relay role's lock is seen: advisory locks need no
privilege, so any login on the database can take the single-active leader lock (nothing is
published, yet every relay looked ready) or the wake-up sleeper role (producers stop
notifying). `relay run` says so in /readyz, a metric and a log line (query lock_strangers)."""

from __future__ import annotations

from relay.pg.queries import LEADER_LOCK_CLASS, WAKEUP_LOCK_CLASS, Queries, TableNames
from tests.helpers import Env, pg_session, wait_until
from tests.integration.test_http import http_get, probe, samples
from tests.kit.ports import free_port


async def test_lock_strangers__a_squatted_leader_lock_is_reported_and_readiness_fails(
    env: Env, start_relay
) -> None:
    async with pg_session(env.pg_dsn, server_settings={"application_name": "report-job"}) as s:
        oid = await s.fetchval("SELECT 'queue_message'::regclass::oid::int")
        assert await s.fetchval("SELECT pg_try_advisory_lock($1, $2)", LEADER_LOCK_CLASS, oid)
        pid = await s.fetchval("SELECT pg_backend_pid()")
        port = free_port()
        relay = start_relay(mode="single-active", http_port=port, backlog_poll_interval_s=0.5,
                            leader_poll_interval_s=0.5)

        async def unready_for_locks() -> bool:
            status, body = await probe(port, "/readyz")
            return status == 503 and not body.get("checks", {}).get("locks", {"ok": 1})["ok"]

        await wait_until(unready_for_locks, timeout_s=30, interval_s=0.2,
                         what="/readyz 503 naming the leader lock's holder")
        _, body = await probe(port, "/readyz")
        detail = body["checks"]["locks"]["detail"]
        assert f"leader by pid {pid} ('report-job')" in detail
        _, text = await http_get(port, "/metrics")
        assert samples(text)[("relay_lock_strangers", (("role", "leader"),))] == 1
        await wait_until(lambda: "relay_lock_held_by_stranger" in relay.log_text(),
                         timeout_s=10, what="the log line naming the holder")
        assert "report-job" in relay.log_text()

        # The stranger lets go: the relay leads, and readiness no longer fails for the locks.
        await s.execute("SELECT pg_advisory_unlock_all()")

        async def ready() -> bool:
            return (await probe(port, "/readyz"))[0] == 200

        await wait_until(ready, timeout_s=30, interval_s=0.2, what="/readyz 200 once released")
        _, text = await http_get(port, "/metrics")
        assert samples(text)[("relay_lock_strangers", (("role", "leader"),))] == 0


async def test_lock_strangers__the_query_names_only_sessions_that_are_not_relays(
    env: Env,
) -> None:
    """Both roles' locks, each held once by a relay-named session and once not."""
    query = Queries(TableNames(None, "queue_message", "queue_message_notify"))["lock_strangers"]
    relay_like = {"application_name": "outbox-relay gate host 1"}
    async with pg_session(env.pg_dsn, server_settings=relay_like) as ours, \
            pg_session(env.pg_dsn, server_settings={"application_name": "x"}) as theirs:
        oid = await ours.fetchval("SELECT 'queue_message'::regclass::oid::int")
        assert await ours.fetchval("SELECT pg_try_advisory_lock($1, $2)",
                                   WAKEUP_LOCK_CLASS + 1, oid)
        assert await theirs.fetchval("SELECT pg_try_advisory_lock($1, $2)",
                                     LEADER_LOCK_CLASS, oid)
        # Another table's lock of the same class is not this table's.
        assert await theirs.fetchval("SELECT pg_try_advisory_lock($1, $2)",
                                     WAKEUP_LOCK_CLASS + 1, oid + 1)
        rows = await ours.fetch(query)
        theirs_pid = await theirs.fetchval("SELECT pg_backend_pid()")
        assert [(r["role"], r["pid"], r["application_name"]) for r in rows] == [
            ("leader", theirs_pid, "x")]
