"""`pdsvc bench`: load the deployment through its router with SGLang's own
``sglang.bench_serving`` and refuse results that are not valid.

target.py (what to load, from the plan; the bench_serving command line) → runner.py (one
run: the subprocess, its result file) → gates.py (is the run valid?) → search.py (the SLO
bisection) → report.py (table, JSON, plot); the click command is pdsvc/cli/bench.py.
"""
