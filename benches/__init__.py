"""Benchmarks. Each module runs as `python -m benches.<name>` and prints a table; `make bench` runs all."""
