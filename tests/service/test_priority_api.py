"""vLLM's request ``priority`` on /v1/completions and /v1/chat/completions: a 400 naming
it on a first-come-first-served server (as vLLM), the queue's order on a server started
with --scheduling-policy priority (fake engine, tests/service/fake_backend.py)."""

import threading
import time

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.fake_runner import expected_tokens
from tests.service.test_api import client, error_of

CHAT = {"messages": [{"role": "user", "content": "3"}], "max_tokens": 2}
COMPLETION = {"prompt": "3", "max_tokens": 2}


@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION),
                                       ("/v1/chat/completions", CHAT)])
def test_fcfs_server_refuses_a_priority_and_takes_zero(path, body):
    with client() as c:
        err = error_of(c.post(path, json={**body, "priority": 5}), 400)
        assert err["param"] == "priority"
        assert "--scheduling-policy priority" in err["message"]
        serving = c.app.state.serving  # nothing was queued: none waits, none ran
        assert serving.engine.num_unfinished == 0 and not serving.backend.runner.batches
        assert c.post(path, json={**body, "priority": 0}).status_code == 200


def wait_for(cond, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_priority_server_serves_the_lowest_priority_first():
    with client(scheduling_policy="priority", max_num_seqs=1, delay_s=0.02) as c:
        eng = c.app.state.serving.engine
        eng.add_request("hog", [1], SamplingParams(max_tokens=60, ignore_eos=True),
                        lambda o: None)
        wait_for(lambda: eng.stats().num_running == 1)  # the hog holds the one slot
        done: list[str] = []
        answers: dict[str, dict] = {}

        def post(name: str, path: str, body: dict) -> None:
            r = c.post(path, json={**body, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            answers[name] = r.json()
            done.append(name)

        threads = []
        for n, (name, path, body, prio) in enumerate([
                ("late-low", "/v1/completions", {"prompt": "5 6", "max_tokens": 4}, 7),
                ("chat-mid", "/v1/chat/completions", {**CHAT, "max_tokens": 4}, 0),
                ("high", "/v1/completions", {"prompt": "5 6", "max_tokens": 4}, -3)]):
            t = threading.Thread(target=post, args=(name, path, {**body, "priority": prio}))
            t.start()
            threads.append(t)
            wait_for(lambda n=n: eng.stats().num_waiting == n + 1)  # queued in this order
        eng.abort("hog")
        for t in threads:
            t.join(timeout=30)
        assert done == ["high", "chat-mid", "late-low"]
        want = "".join(f" {t}" for t in expected_tokens([5, 6], 4))
        assert answers["high"]["choices"][0]["text"] == want
        assert answers["late-low"]["choices"][0]["text"] == want
