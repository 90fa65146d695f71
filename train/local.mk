# train/: the trainer layer -- the step loop and its parts, the 1F1B
# pipeline schedule, the straggler monitor, the online plan change,
# snapshot glue (synchronous and background), evaluation, the memory
# check, profile measurement, resume checks, stop requests by signal and
# the command line of malleus-train.

libmalleus_a_SOURCES += train/train.h train/train_internal.h train/train.c \
	train/part.h train/part.c train/pipeline.h train/pipeline.c \
	train/monitor.h train/monitor.c train/online.h train/online.c \
	train/change.h train/change.c train/progress.h train/progress.c \
	train/ckpt.h train/ckpt.c train/ckpt_start.h train/ckpt_start.c \
	train/ckpt_async.h train/ckpt_async.c \
	train/ckpt_job.h train/ckpt_job.c train/eval.h train/eval.c train/train_memory.c \
	train/profile_measure.c train/train_cli.h train/train_cli.c \
	train/resume.h train/resume.c train/preempt.h train/preempt.c \
	train/init_from.h train/init_from.c \
	train/linkprobe.h train/linkprobe.c

# The step line, plan generations and ids, plan change lines, --profile
# under mpiexec.
dist_check_SCRIPTS += tests/test_progress.sh
TESTS += tests/test_progress.sh
