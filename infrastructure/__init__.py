"""Everything that touches SQLite or PostgreSQL: settings, schema, the event store and the run
index. This is the only package that speaks SQL."""
