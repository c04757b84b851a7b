import signal

# Shared fixtures live in tests/support/, one module per area, so that each stays small.
pytest_plugins = [
    "tests.support.bundle",
    "tests.support.pool",
    "tests.support.virtual",
]

# Many tests interrupt their own children with SIGINT and expect exit 130. A test run started as a
# background job of a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, and an ignored
# signal stays ignored across exec: every child would shrug the interrupt off. Restore the default
# here (before xdist starts its workers); a handled signal reverts to the default in exec'd children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
