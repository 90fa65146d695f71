# src/plan.mk: plan files (schema, validation, uniform plans).
libmalleus_a_SOURCES += src/plan.h src/plan.c

check_PROGRAMS += tests/test_plan
TESTS += tests/test_plan
