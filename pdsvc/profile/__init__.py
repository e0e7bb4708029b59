"""`pdsvc profile`: where each role's GPU time goes on the running deployment, and how far any
one kernel could take it. trace (one rank's file, read whole or refused), groups (the rules
that group kernels), breakdown (shares, busy time, outlying ranks, the ceiling)."""
