"""Kernel families shipped with cutlass-aot (build side: they import the CuTe DSL lazily)."""
