"""`python -m pdsvc.cli ARGS`: the same as the `pdsvc` console script."""

from pdsvc.cli.commands import main

main()
