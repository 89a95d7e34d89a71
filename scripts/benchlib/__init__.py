"""The benchmark's modules: one per section, `common` for what they share (scripts/bench.py runs them)."""
