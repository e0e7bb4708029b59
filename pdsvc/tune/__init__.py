"""`pdsvc tune`: which config serves the most at the user's SLO on this host (issue 33).

Built so far: the search space (space.py: levers, SLO, workload, from a file beside the
config) and its candidates, each checked before anything restarts (check.py: the schema and
the pairing check refuse it, or switching to it stops serving), with the time the search
would take. Measuring them (`pdsvc apply` each, then `pdsvc bench --slo`) is the next step.
"""
