"""The Spark section of sql/queries.sql, rendered for one outbox table and staging table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.pg.queries import TableNames, quote_ident, raw_queries


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class SparkSql:
    """Renders `spark_*` statements: table placeholders, plus {stage} and {columns}."""

    names: TableNames

    def render(
        self,
        name: str,
        *,
        stage: str | None = None,
        stage_name: str | None = None,
        columns: Sequence[str] = (),
    ) -> str:
        """Statement `name` with {stage} (quoted, maybe qualified), {stage_literal} (the bare
        name as a literal) and {columns} (quoted list) filled in."""
        sql = self.names.render(raw_queries()[name])
        extra = {
            "{stage}": stage or "",
            "{stage_literal}": quote_literal(stage_name or ""),
            "{columns}": ", ".join(quote_ident(c) for c in columns),
        }
        for key, value in extra.items():
            sql = sql.replace(key, value)
        return sql
