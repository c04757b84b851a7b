# Shared fixtures live in tests/support/, one module per area, so that each stays small.
pytest_plugins = [
    "tests.support.bundle",
    "tests.support.pool",
    "tests.support.virtual",
]
