"""Scripts the Makefile runs over the repository (`make docs`); not part of the package."""
