-- Spark's staging tables (relay.spark, mode `staged`) live in a schema of their own,
-- <table>_stage, so that the Spark writer role needs CREATE there only, never on the outbox's
-- schema (where it could create objects that shadow or sit beside the outbox's own).
CREATE SCHEMA IF NOT EXISTS {stage_schema};
