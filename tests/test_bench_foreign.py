"""Whether the router at the plan's URL is this deployment serving (bench/target.py foreign):
`pdsvc bench` refuses another one, `pdsvc tune` waits a while only for an engine that is
down behind a router that lists the plan's model (a restart), on the typed fact, not words."""

from __future__ import annotations

import json

from status_stands import Endpoint

from pdsvc.bench.target import Target, foreign


def _target(router: Endpoint, engine: Endpoint) -> Target:
    return Target(python="/usr/bin/python3", url=router.url, model_path="/srv/m",
                  served_name="m", engines=(("dsv4-decode.service", engine.url),), owned=True)


def test_the_router_of_another_model_and_an_engine_down_are_told_apart() -> None:
    router, engine = Endpoint(), Endpoint()
    try:
        t = _target(router, engine)
        router.routes["/v1/models"] = (200, json.dumps({"data": [{"id": "other"}]}))
        other = foreign(t)
        assert other is not None and not other.engine_down
        assert other.why == f"{router.url} serves ['other'], not the plan's 'm'"
        router.routes["/v1/models"] = (200, json.dumps({"data": [{"id": "m"}]}))
        engine.routes["/health"] = (503, "")
        down = foreign(t)
        assert down is not None and down.engine_down
        assert down.why.startswith(f"the plan's engine dsv4-decode.service at {engine.url}")
        engine.routes["/health"] = (200, "")
        assert foreign(t) is None
    finally:
        router.close()
        engine.close()
