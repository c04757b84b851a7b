"""The farm testing itself: the fault matrix (`farm chaos`, farm.selftest.chaos), each fault injected
for real in a lab of virtual devices, and the stand-ins it shares with the project's tests: hand-made
bundles with a runner that misbehaves on purpose (bundles), upstream-named folders staged from a
reference export for `farm bundle create` (upstream: ci/qualify.sh's third run), a TCP proxy that can
be cut off (proxy), the test PostgreSQL server's URLs (postgres) and the files a pytest run is given
(pytest_files)."""
