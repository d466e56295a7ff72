"""The example settlement job with a fault: on its first attempt, one task kills its own
executor mid-write (after some of its JDBC batches went out). A marker file makes it happen
once per marker: the retried task, on a new executor, writes the partition again.

    spark-submit ... killed_executor_job.py <marker file> <example_job arguments>
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from relay.spark.example_job import parse_args, run


def _executor_pid() -> int | None:
    """The executor JVM above this Python worker (worker -> pyspark daemon -> JVM)."""
    pid = os.getpid()
    for _ in range(3):
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
    return None


def kill_once(marker: str, partition: int, at_merchant: int) -> Any:
    """A UDF passing merchant_id through, killing the executor at one row, once."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    def check(merchant_id: int) -> int:
        ctx = TaskContext.get()
        if (ctx is not None and ctx.partitionId() == partition
                and merchant_id >= at_merchant and not os.path.exists(marker)):
            Path(marker).write_text(f"killed at merchant {merchant_id}\n")
            pid = _executor_pid()
            os.kill(pid if pid is not None else os.getpid(), signal.SIGKILL)
        return merchant_id

    return F.udf(check, "long")


def main() -> int:
    """Run the example job with the fault injected."""
    from pyspark.sql import functions as F

    marker, argv = sys.argv[1], sys.argv[2:]
    args = parse_args(argv)

    def inject(df: Any) -> Any:
        fault = kill_once(marker, partition=1, at_merchant=args.merchants // 2)
        # Sorted within the partition so some rows (and JDBC batches) precede the kill.
        return df.sortWithinPartitions("merchant_id").withColumn(
            "merchant_id", fault(F.col("merchant_id")))

    return run(args, inject)


if __name__ == "__main__":
    sys.exit(main())
