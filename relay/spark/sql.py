"""The Spark section of sql/queries.sql, rendered for one outbox table and staging table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relay.pg.queries import TableNames, quote_ident, raw_queries


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class StageShape:
    """The columns a staging table holds: the written outbox columns (with their catalog
    types), extra sort columns, and the merge's sort order."""

    #: column -> PostgreSQL type, in write order; `id` first when the table draws it.
    defs: Mapping[str, str]
    #: outbox columns the merge inserts (always including id)
    columns: Sequence[str]
    order_by: Sequence[str] = ()

    def column_defs(self) -> str:
        """`"col" type, ...` for CREATE TABLE (types come from pg_attribute, not from users)."""
        return ", ".join(f"{quote_ident(c)} {t}" for c, t in self.defs.items())

    def order_clause(self) -> str:
        """ORDER BY ordering_key (when written), then the order_by columns; or nothing."""
        if not self.order_by:
            return ""
        cols = (["ordering_key"] if "ordering_key" in self.columns else []) + list(self.order_by)
        return "ORDER BY " + ", ".join(f"s.{quote_ident(c)}" for c in cols)


@dataclass(frozen=True)
class SparkSql:
    """Renders `spark_*` statements: table placeholders, plus the staging ones."""

    names: TableNames

    def render(
        self,
        name: str,
        *,
        stage: str | None = None,
        stage_name: str | None = None,
        shape: StageShape | None = None,
        columns: Sequence[str] = (),
    ) -> str:
        """Statement `name` with {stage} (quoted, maybe qualified), {stage_literal} (the bare
        name as a literal) and the shape's {columns}, {column_defs}, {others}, {order}
        (`columns` alone: a shape of those columns, unordered)."""
        sql = self.names.render(raw_queries()[name])
        if shape is None and columns:
            shape = StageShape(defs={}, columns=columns)
        extra = {"{stage}": stage or "", "{stage_literal}": quote_literal(stage_name or "")}
        if shape is not None:
            extra |= {
                "{columns}": ", ".join(quote_ident(c) for c in shape.columns),
                "{column_defs}": shape.column_defs(),
                "{others}": ", ".join(
                    f"s.{quote_ident(c)}" for c in shape.columns if c != "id"
                ) or "s.id",
                "{order}": shape.order_clause(),
            }
        for key, value in extra.items():
            sql = sql.replace(key, value)
        return sql
