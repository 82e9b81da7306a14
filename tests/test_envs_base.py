"""Task, Verdict and the resumable TaskSource."""

import pytest

from rltldr_jax.envs import Task, TaskSource


def _tasks(n: int) -> list[Task]:
    return [Task(f"t/{i}", f"goal {i}", "sapi", "train", {"seed": i}) for i in range(n)]


def test_order_is_a_seeded_permutation_per_epoch():
    source = TaskSource(_tasks(5), seed=3)
    first, second = source.take(5), source.take(5)
    assert sorted(t.task_id for t in first) == sorted(t.task_id for t in second) == [f"t/{i}" for i in range(5)]
    assert [t.task_id for t in first] != [t.task_id for t in second]  # a fresh permutation each epoch
    again = TaskSource(_tasks(5), seed=3)
    assert again.take(10) == first + second
    assert [t.task_id for t in TaskSource(_tasks(5), shuffle=False).take(7)] == [
        "t/0",
        "t/1",
        "t/2",
        "t/3",
        "t/4",
        "t/0",
        "t/1",
    ]


def test_cursor_resumes_exactly():
    uninterrupted = TaskSource(_tasks(7), seed=1)
    expected = uninterrupted.take(3) + uninterrupted.take(9)
    source = TaskSource(_tasks(7), seed=1)
    head = source.take(3)
    state = source.state()
    resumed = TaskSource(_tasks(7), seed=1)
    resumed.restore(state)
    assert head + resumed.take(9) == expected
    with pytest.raises(ValueError, match="different split"):
        TaskSource(_tasks(6), seed=1).restore(state)


def test_bad_splits_and_json_round_trip():
    with pytest.raises(ValueError, match="duplicate task ids"):
        TaskSource(_tasks(2) + _tasks(1))
    with pytest.raises(ValueError, match="at least one task"):
        TaskSource([])
    task = _tasks(1)[0]
    assert Task.from_json(task.to_json()) == task


def test_registry_splits_and_envs():
    from rltldr_jax.envs import load_tasks, make_env

    sapi = load_tasks("sapi", "eval", seed=0)
    assert len(sapi) == 1624 and all(t.env == "sapi" and t.split == "eval" for t in sapi)
    coding = load_tasks("leetcode", "eval")
    assert len(coding) == 164 and coding[0].task_id.startswith("humaneval/")
    env = make_env("sapi", step_timeout_s=5.0)
    try:
        assert env.reset(sapi[0]) == sapi[0].goal
        assert "Execution successful." in env.step("x = 1").observation
        assert not env.verify().success  # nothing done yet
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown environment 'webshop'"):
        make_env("webshop")


def _plain(source: TaskSource, calls: int, n: int) -> list[list[str]]:
    """The calls' task ids by the plain per-epoch permutations (the order before wraps were made distinct)."""
    flat = [source.tasks[i].task_id for epoch in range(calls * n // len(source) + 2) for i in source._order(epoch)]
    return [flat[k * n : (k + 1) * n] for k in range(calls)]


def test_a_call_that_wraps_never_repeats_a_task():
    # 7 tasks, 3 per call: the calls wrap into a new epoch mid-call; with seed 2 the plain permutations put a task
    # at the end of one epoch and the start of the next within one call (checked below), which a phase cannot hold.
    n, calls = 3, 40
    source = TaskSource(_tasks(7), seed=2)
    plain = _plain(source, calls, n)
    repeats = [k for k, ids in enumerate(plain) if len(set(ids)) < n]
    assert repeats, "the plain permutations have no repeat: pick another seed for this test"
    got = [[t.task_id for t in source.take(n)] for _ in range(calls)]
    assert all(len(set(ids)) == n for ids in got)
    assert got[: repeats[0]] == plain[: repeats[0]]  # up to the first repeat: the plain order, unchanged
    # the cursor still resumes exactly after a skipped repeat
    k = repeats[0] + 1
    resumed = TaskSource(_tasks(7), seed=2)
    assert [[t.task_id for t in resumed.take(n)] for _ in range(k)] == got[:k]
    again = TaskSource(_tasks(7), seed=2)
    again.restore(resumed.state())
    assert [[t.task_id for t in again.take(n)] for _ in range(calls - k)] == got[k:]
