"""The run side: load artifacts from a cache and dispatch calls to them (no CuTe DSL)."""
