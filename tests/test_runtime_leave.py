"""`runtime leave` (membership.leave_after_end), the engine unit's ExecStopPost=: an engine
whose runtime died without leaving the router (kill -9, OOM) is taken out of it at once; a
clean stop, a router that is down and a key that cannot be read all end with 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from pair_fakes import FakeRouter

from pdsvc.ship.runtime.cli import main, parse_args
from pdsvc.ship.runtime.leaving import leave_after_end
from pdsvc.ship.runtime.membership import Membership, Worker

URL = "http://10.0.0.2:30000"


def registered(smg: bool) -> FakeRouter:
    router = FakeRouter(smg)
    assert Membership("http://r:8000", Worker(URL, "prefill", 8998), "k", print,
                      call=router).join()
    return router


@pytest.mark.parametrize("smg", [False, True], ids=["sglang-router", "smg"])
def test_an_engine_left_listed_by_a_killed_runtime_is_deregistered(smg: bool,
                                                                    tmp_path: Path) -> None:
    router, lines = registered(smg), []
    (tmp_path / "router-key").write_text("k\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "SERVICE_RESULT": "signal",
           "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"}
    assert leave_after_end(["http://r:8000"], URL + "/", "credential:router-key", lines.append,
                           env=env, call=router) == 0
    assert ("DELETE", "http://r:8000/workers/id0") in router.calls
    listed = [w for w in router.workers if w.get("is_healthy", True)]
    assert listed == []  # gone (0.3.2) or draining (smg): no new request reaches it
    assert lines == [f"the runtime ended without taking {URL}/ out of the router (service_result "
                     "signal, exit_code killed, exit_status KILL): deregistered it from "
                     "http://r:8000"]


def test_after_a_clean_stop_there_is_nothing_to_do_and_nothing_said(tmp_path: Path) -> None:
    router, lines = FakeRouter(), []
    key = tmp_path / "key"
    key.write_text("k")
    assert leave_after_end(["http://r:8000"], URL, str(key), lines.append, env={},
                           call=router) == 0
    assert lines == [] and not any(m == "DELETE" for m, _ in router.calls)


def test_a_router_down_or_a_key_missing_is_said_and_the_stop_goes_on(tmp_path: Path) -> None:
    router, lines = registered(False), []
    router.up = False
    key = tmp_path / "key"
    key.write_text("k")
    assert leave_after_end(["http://r:8000"], URL, str(key), lines.append, env={},
                           call=router) == 0
    assert "unreachable" in lines[-1]
    assert leave_after_end(["http://r:8000"], URL, "credential:router-key", lines.append,
                           env={}, call=router) == 0
    assert "cannot read the router's control-plane key" in lines[-1] and "k\n" not in lines[-1]


def test_the_mode_parses_and_takes_no_command(capsys) -> None:
    args, command = parse_args(["leave", "--name", "x", "--router", "http://r:8000",
                                "--advertise", URL, "--control-plane-key", "/etc/k"])
    assert (args.mode, args.router, args.advertise, command) == ("leave", ["http://r:8000"],
                                                                 URL, [])
    with pytest.raises(SystemExit) as e:
        parse_args(["leave", "--name", "x", "--router", "http://r:8000", "--advertise", URL,
                    "--", "true"])
    assert e.value.code == 2 and "takes no '-- CMD'" in capsys.readouterr().err


def test_the_mode_exits_0_even_when_the_router_is_unreachable(capsys) -> None:
    assert main(["leave", "--name", "dsv4-prefill", "--router", "http://127.0.0.1:1",
                 "--advertise", URL]) == 0
    assert "nothing to deregister" in capsys.readouterr().err


def test_every_registering_engine_unit_leaves_the_router_after_any_stop() -> None:
    """The rendered ExecStopPost= parses as `runtime leave` with the ExecStart's own router,
    URL and key; an engine rank that does not register (rank 1 over two hosts) has none."""
    from sdsyntax import exec_argv, sections

    from pdsvc.config.load import parse_config
    from pdsvc.plan.build import build_plan
    from pdsvc.render.systemd import render_systemd
    from pdsvc.topology import load_topology_file
    text = ("model: {path: /srv/m}\nhosts:\n  lb: {address: 10.0.0.1, run: [router]}\n"
            "  gpu-a: {address: 10.0.0.2, run: [prefill]}\n"
            "  gpu-c: {address: 10.0.0.4, run: [prefill]}\n"
            "  gpu-b: {address: 10.0.0.3, run: [decode]}\n")
    topology = load_topology_file(Path(__file__).parents[1] / "etc/seed-host.topology.json")
    plan = build_plan(parse_config(text, "c.yaml"), topology, config_source="c.yaml",
                      config_text=text)
    seen = 0
    for host in ("gpu-a", "gpu-b", "gpu-c"):
        files = {f.path: f.content for f in render_systemd(plan.for_host(host), "t")}
        for e in plan.for_host(host).engines:
            service = sections(files[e.unit])["Service"]
            if not e.router_urls:
                assert "ExecStopPost" not in service, (host, e.unit)
                continue
            start, _ = parse_args(exec_argv(service["ExecStart"][0])[2:])
            leave, _ = parse_args(exec_argv(service["ExecStopPost"][0])[2:])
            assert (leave.mode, leave.router, leave.advertise) == (
                "leave", start.router, start.advertise)
            # the key's file: ExecStopPost= gets no credentials (systemd/systemd#24759)
            assert start.control_plane_key == "credential:router-key"
            assert leave.control_plane_key == plan.paths.router_key
            seen += 1
    assert seen == 2  # the prefill's rank 0 and the decode
