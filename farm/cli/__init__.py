"""The ``farm`` command line. Depends on the library; the library never imports it."""
