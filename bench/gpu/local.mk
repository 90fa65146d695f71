# bench/gpu/: the single-GPU benchmark against PyTorch (run by hand on a GPU
# machine through bench/gpu/run.sh) and the CPU-side test of its peer.

EXTRA_DIST += bench/gpu/NOTES.md bench/gpu/flops.py bench/gpu/floors.py bench/presets.py \
	bench/gpu/torch_peer.py bench/gpu/bench.py bench/gpu/run.sh tests/gpu_peer_ref.py

dist_check_SCRIPTS += tests/test_gpu_peer.sh
TESTS += tests/test_gpu_peer.sh
