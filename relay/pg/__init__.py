"""The database side: store (claim, settle, dead-letter), queries from sql/, LISTEN session,
advisory locks, migrations. asyncpg lives only here.
"""
