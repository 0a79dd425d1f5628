"""Reliability scenarios: concurrent and killed builds, corrupted caches,
hostile manifests and hostile call arguments.

Trial counts scale with CUTLASS_AOT_RELIABILITY_SCALE (default 1, which keeps
the whole directory to a few minutes on the 2-core build machine); each
scenario adds a row (scenario, trials, lost) to the table printed at the end.
"""
