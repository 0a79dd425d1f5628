"""cutlass-aot's CPU test suite (GPU tests live in tests/gpu/ and carry the `gpu` marker).

A package so that build worker processes (``spawn``) and CLI subprocesses can
import the test-only kernel families in ``tests.families`` by reference.
"""
