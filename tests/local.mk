# tests/: model, trainer and end-to-end tests (other areas list their own
# tests in their local.mk).  EXTRA_DIST carries the shared test helpers.
EXTRA_DIST += tests/mal_test.h
