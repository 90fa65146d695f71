#!/bin/sh
# tests/test_cuda_model's own checks with the CPU backend in its place
# (cpu-opaque: the host cannot read its buffers, as a GPU's): the fp32
# model against the CPU and finite differences, and bf16 (bf16 storage,
# fp32 arithmetic, as the GPU kernels) against fp32 within bf16's error,
# deterministic.  Without a GPU this is what keeps the GPU test itself
# honest between GPU sessions: its bf16 bounds are met by another
# implementation of the same arithmetic.
MAL_TEST_DEVICE=cpu-opaque exec "${top_builddir:-.}/tests/test_cuda_model"
