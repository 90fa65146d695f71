# kernels/: see Makefile.am; this fragment is included by it.
