# replan/: the planner (cost model, lp_solve programs, search, 1F1B simulator,
# re-plan trigger policy) behind malleus-replan.  Included by Makefile.am.
libmalleus_a_SOURCES += replan/replan.h replan/cluster.c replan/profile.c replan/rates.c \
	replan/cost.c replan/lp.c replan/search.h replan/options.c replan/layers.c replan/eval.c \
	replan/planner.c replan/explain.c replan/sim.h replan/sim.c replan/links.c replan/place.c \
	replan/policy.h replan/policy.c replan/tool.h replan/tool.c

check_PROGRAMS += tests/test_replan tests/test_replan_sim tests/test_replan_policy
TESTS += tests/test_replan tests/test_replan_sim tests/test_replan_policy
dist_check_SCRIPTS += tests/test_replan_cli.sh
TESTS += tests/test_replan_cli.sh
# The policy in a real run: noise makes no change, a straggler one that pays.
dist_check_SCRIPTS += tests/test_policy_run.sh
TESTS += tests/test_policy_run.sh
# Time and memory bounded at 131,072 and 2^20 ranks (--time-limit).
dist_check_SCRIPTS += tests/test_replan_limits.sh
TESTS += tests/test_replan_limits.sh
# --explain's memory terms per stage exist and add up.
dist_check_SCRIPTS += tests/test_replan_memory.sh
TESTS += tests/test_replan_memory.sh

EXTRA_DIST += replan/README.md bench/replan/run.sh bench/replan/gen.py bench/replan/scale.sh \
	bench/replan/corpus.sh

# Hostile planner inputs: refusals naming the field, no overflow.
check_PROGRAMS += tests/test_replan_inputs
TESTS += tests/test_replan_inputs

# The planner's objective against an independent exact enumeration.
check_PROGRAMS += tests/test_replan_exact
TESTS += tests/test_replan_exact
EXTRA_DIST += tests/replan_ref.h

# Slow links and mixed hardware: terms, placement, warm-up, exact reference.
check_PROGRAMS += tests/test_replan_links
TESTS += tests/test_replan_links

# Mixed hardware: each device type's memory and profile in the search.
check_PROGRAMS += tests/test_replan_types
TESTS += tests/test_replan_types

# Activation recomputation: memory and time per mode, plans it forces,
# the refusal when nothing fits even with full recomputation.
check_PROGRAMS += tests/test_replan_recompute
TESTS += tests/test_replan_recompute
