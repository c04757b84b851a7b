"""The database under the pool and the results store: one Store/Txn interface on SQLite and PostgreSQL,
the wake-ups of waiters, and the migrations of every table (the pool's and the results')."""
