"""SAPI: a deterministic, AppWorld-like synthetic-API world (apps, tasks, golden solutions, verifier)."""
