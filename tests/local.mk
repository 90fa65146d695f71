# tests/: model, trainer and end-to-end tests (other areas list their own
# tests in their local.mk).  EXTRA_DIST carries the shared test helpers.
EXTRA_DIST += tests/mal_test.h

check_PROGRAMS += tests/test_model_grad tests/test_train
TESTS += tests/test_model_grad tests/test_train
dist_check_SCRIPTS += tests/test_cli.sh
TESTS += tests/test_cli.sh
