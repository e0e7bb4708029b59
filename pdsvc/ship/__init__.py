"""What pdsvc copies into every bundle and runs on the GPU host: stdlib only, readable there.

runtime/ is the unit runtime (`python DIR/runtime engine|router …`). Nothing here imports the
rest of pdsvc; tests/test_layers.py keeps it so."""
