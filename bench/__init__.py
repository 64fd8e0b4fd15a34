"""Benchmark scripts (each runnable: .venv/bin/python bench/<name>.py --help); chainkit is their
shared process and line plumbing."""
