"""The runtime's states (pdsvc/ship/runtime/states.py): the transition table, walked.

Every transition the table allows is taken from a state reached from PREFLIGHT; every one it
does not allow raises; every run can end; and the lifecycle's loop has a step for every state
that is not the end.
"""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from pdsvc.ship.runtime.endings import Ending, Exit, Phase
from pdsvc.ship.runtime.states import (
    TIMED,
    TRANSITIONS,
    IllegalTransition,
    Machine,
    State,
)


def path_to(target: State) -> list[State]:
    """The shortest walk from PREFLIGHT to ``target`` through allowed transitions."""
    seen = {State.PREFLIGHT: [State.PREFLIGHT]}
    todo = deque([State.PREFLIGHT])
    while todo:
        here = todo.popleft()
        for nxt in sorted(TRANSITIONS[here], key=lambda s: s.value):
            if nxt not in seen:
                seen[nxt] = [*seen[here], nxt]
                todo.append(nxt)
    return seen[target]


def machine_at(state: State) -> Machine:
    m = Machine(clock=itertools.count().__next__)
    for step in path_to(state)[1:]:
        m.enter(step)
    assert m.state is state
    return m


def test_the_table_names_every_state() -> None:
    assert set(TRANSITIONS) == set(State)
    assert all(set(targets) <= set(State) for targets in TRANSITIONS.values())


def test_every_state_is_reachable_and_every_run_can_end() -> None:
    for state in State:
        assert path_to(state)[-1] is state
        # from any state, EXITED can be reached
        ends, todo = {state}, [state]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in ends:
                    ends.add(nxt)
                    todo.append(nxt)
        assert State.EXITED in ends, state
    assert TRANSITIONS[State.EXITED] == frozenset()


@pytest.mark.parametrize(("source", "target"), [
    (s, t) for s in State for t in sorted(TRANSITIONS[s], key=lambda x: x.value)])
def test_every_allowed_transition_is_taken(source: State, target: State) -> None:
    m = machine_at(source)
    m.enter(target)
    assert m.state is target
    assert target in m.visited and source in m.visited


@pytest.mark.parametrize(("source", "target"), [
    (s, t) for s in State for t in State if t not in TRANSITIONS[s]])
def test_every_disallowed_transition_raises(source: State, target: State) -> None:
    m = machine_at(source)
    with pytest.raises(IllegalTransition, match=f"{source.name} -> {target.name}"):
        m.enter(target)
    assert m.state is source  # nothing changed


def test_no_way_back_and_none_out_of_the_end() -> None:
    m = machine_at(State.SERVING)
    for earlier in (State.PREFLIGHT, State.BACKOFF, State.STARTING, State.SERVING):
        with pytest.raises(IllegalTransition):
            m.enter(earlier)
    m.enter(State.STOPPING)
    m.enter(State.EXITED)
    for any_state in State:
        with pytest.raises(IllegalTransition):
            m.enter(any_state)


def test_start_phases_are_the_timed_states_before_the_last() -> None:
    ticks = iter([10.0, 12.5, 20.0, 95.25])
    m = Machine(clock=lambda: next(ticks))
    for state in (State.WAIT_GPUS, State.JIT_LOCK, State.STARTING, State.SERVING):
        m.enter(state)
    assert m.start_phases() == {"wait_gpus": 2.5, "jit_lock": 7.5, "starting": 75.25}
    assert State.PREFLIGHT not in TIMED and State.EXITED not in TIMED


def test_own_stops_are_the_runtimes_own() -> None:
    assert {e for e in Ending if e.own_stop} == {Ending.PEER, Ending.HEAL, Ending.LATE,
                                                 Ending.DUTY}


def test_each_ending_says_what_is_recorded_and_the_exit_status() -> None:
    """One row per ending: the restart file's phase, and the exit status (None: the child's)."""
    table = {e: (e.phase, e.exit) for e in Ending}
    assert table == {
        Ending.ASKED: (Phase.STOPPED, None),
        Ending.LATE: (Phase.FAILED_START, Exit.REFUSED),
        Ending.PEER: (Phase.STOPPED, Exit.PEER),
        Ending.HEAL: (Phase.STOPPED, Exit.PEER),
        Ending.DUTY: (Phase.STOPPED, Exit.DUTY),
        Ending.HUNG: (Phase.CRASHED, Exit.HUNG),
        Ending.CRASHED: (Phase.CRASHED, None),
        Ending.FAILED_START: (Phase.FAILED_START, None),
        Ending.GAVE_UP: (Phase.GAVE_UP, Exit.GAVE_UP),
    }
    # own stops are restarted by the process manager: never the give-up status
    assert all(e.exit != Exit.GAVE_UP for e in Ending if e.own_stop)
    assert {e for e in Ending if e.failed_start} == {Ending.LATE, Ending.FAILED_START}


@pytest.mark.parametrize("ending", [e for e in Ending if e is not Ending.GAVE_UP])
def test_the_policy_records_each_ending_as_its_phase(tmp_path, ending: Ending) -> None:
    from pdsvc.ship.runtime.policy import RestartPolicy
    from pdsvc.ship.runtime.statefile import read_state

    path = str(tmp_path / "x.restart.json")
    policy = RestartPolicy(path, restart_delay=1, max_delay=8, reset_after=600, attempts=1,
                           clock=lambda: 1000.0)
    policy.on_start()
    final = policy.record_end(ending, "why")
    # one attempt: a failed start is the last of its row
    assert final is (Ending.GAVE_UP if ending.failed_start else ending)
    assert read_state(path)["phase"] == final.phase.value
    with pytest.raises(ValueError):
        policy.record_end(Ending.GAVE_UP, "the policy's own verdict")


def test_the_lifecycle_has_a_step_for_every_state_but_the_end(tmp_path) -> None:
    from pdsvc.ship.runtime.cli import parse_args
    from pdsvc.ship.runtime.lifecycle import Unit

    args, command = parse_args(["engine", "--name", "e", "--health-url",
                                "http://127.0.0.1:9/health", "--", "true"])
    unit = Unit(args, command)
    assert set(unit.steps) == set(State) - {State.EXITED}
    assert unit.state is State.PREFLIGHT
