# src/: runtime library sources (common, config, data, model, optimizer,
# trainer) and the program mains (thin shells over the library).

libmalleus_a_SOURCES += src/mal.h src/error.c src/rng.h
