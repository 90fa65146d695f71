# src/data.mk: data files, sampling, default corpus, malleus-tokenize.
