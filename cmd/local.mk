# cmd/: the program mains -- each an option table and one call into the
# library (libmalleus.a), nothing else.

bin_PROGRAMS += malleus-train malleus-sample malleus-tokenize malleus-reshard malleus-export \
	malleus-replan malleus-import
malleus_train_SOURCES = cmd/train_main.c
malleus_sample_SOURCES = cmd/sample_main.c
malleus_tokenize_SOURCES = cmd/tokenize_main.c
malleus_reshard_SOURCES = cmd/reshard_main.c
malleus_export_SOURCES = cmd/export_main.c
malleus_replan_SOURCES = cmd/replan_main.c
malleus_import_SOURCES = cmd/import_main.c
