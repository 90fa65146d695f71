# base/: the lowest layer -- common definitions and errors (mal.h, error.c),
# the counter-based RNG, option parsing helpers, bounded file input and
# atomic-or-direct file output.  Nothing here includes another folder.

libmalleus_a_SOURCES += base/mal.h base/error.c base/rng.h base/opts.h base/opts.c \
	base/fileio.h base/fileio.c

# fileio: atomic-or-direct outputs, bounded inputs; every command's outputs
# against a device node.
check_PROGRAMS += tests/test_fileio
TESTS += tests/test_fileio
dist_check_SCRIPTS += tests/test_outputs.sh
TESTS += tests/test_outputs.sh

# registry: backends by name (the kernel and comm registries' shared part).
libmalleus_a_SOURCES += base/registry.h base/registry.c

# json: JSON files and buffers read with a bound, Jansson's errors converted.
libmalleus_a_SOURCES += base/json.h base/json.c
