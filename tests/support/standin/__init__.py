"""The SGLang stand-in (tests/support/fake_sglang.py), by concern; stdlib only, Python >= 3.10.

config      every FAKE_SGLANG_* knob, read once into ``Knobs``
cli         the launch_server argv, ``main()``
engine      one engine's state: in-flight count, health, control, server/model info
lifecycle   bind, load, serve, the SIGTERM drain and the exit; fault timers; the orphan
jit         the JIT kernel cache and its compile lock
rendezvous  --nnodes > 1: rank 0 and the other ranks
http_base   the HTTP server and handler plumbing (JSON, chunked SSE)
api         the engine's HTTP API and /_fake/control
generate    /generate, /v1/completions, /v1/chat/completions: parsing and replies
bootstrap   PD pairing: the prefill's bootstrap server, each side's check of its peer
pair        the NIXL pair state (stale pairs)
metrics     /metrics
profiler    /start_profile, /stop_profile, the scheduler's steps and its freeze while a trace
            is written
"""
