"""The farm testing itself: the fault matrix (`farm chaos`), each fault injected for real in a lab of
virtual devices, and the stand-ins (a runner that misbehaves on purpose, a TCP proxy) it shares with
the project's tests."""
