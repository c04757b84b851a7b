"""The test PostgreSQL server, for `farm chaos` and the project's tests: its URL
(``$PTEFARM_TEST_PG_URL`` or the default ci/start-postgres.sh sets up) and URLs of a schema of its own."""

from __future__ import annotations

import os
from urllib.parse import quote

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
PG_ENV = "PTEFARM_TEST_PG_URL"


def pg_base_url() -> str | None:
    """The test server's URL; None only when the variable is explicitly empty (opt-out)."""
    value = os.environ.get(PG_ENV)
    if value is None:
        return DEFAULT_PG_URL
    return value or None


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose sessions use ``schema`` (libpq's options parameter sets search_path)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}', safe='')}"
