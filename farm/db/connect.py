"""Open the database of a URL: ``sqlite:///path`` or ``postgresql://...``, connected and migrated."""

from __future__ import annotations

from farm.db.base import Store, redact_url
from farm.db.sqlite import SqliteStore
from farm.errors import UsageError


def open_store(url: str, *, connect_timeout_s: float = 10.0, lock_timeout_s: float = 30.0) -> Store:
    """The backend for ``url`` (``sqlite:///path`` or ``postgresql://...``), connected and migrated."""
    if not isinstance(url, str) or "://" not in url:
        raise UsageError(f"pool url {url!r}: expected sqlite:///PATH or postgresql://USER@HOST/DB")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        store: Store = SqliteStore(url, lock_timeout_s=lock_timeout_s)
    elif scheme in ("postgresql", "postgres"):
        from farm.db.postgres import PostgresStore  # psycopg: ~50 ms an xdist worker on SQLite skips

        store = PostgresStore(url, connect_timeout_s=connect_timeout_s, lock_timeout_s=lock_timeout_s)
    else:
        raise UsageError(f"pool url {redact_url(url)!r}: unknown scheme '{scheme}' "
                         f"(expected sqlite or postgresql)")
    try:
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store
