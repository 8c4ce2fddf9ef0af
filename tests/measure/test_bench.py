"""bench against a real HTTP server on localhost that streams at known speeds."""

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest
from fake_server import FakeServer, Speed

from shardwise.errors import BenchError
from shardwise.measure.bench import Target, run_level

TTFT, TPOT = 2.0, 0.02  # a long prefill, as under load


def _assert_tpot_and_itl_as_defined(level, *, osl: int) -> None:
    """TPOT is each request's (E2E − TTFT) / (osl − 1), and its osl − 1 gaps between tokens add up to that span,
    so with every request of osl tokens the means agree exactly, whatever the timing."""
    assert level.tpot_s.mean == pytest.approx((level.e2e_s.mean - level.ttft_s.mean) / (osl - 1), rel=1e-9)
    assert level.itl_s.mean == pytest.approx(level.tpot_s.mean, rel=1e-9)


@pytest.mark.parametrize("concurrency", [1, 32])
def test_measures_the_configured_ttft_and_tpot(concurrency):
    """The server sends token n no earlier than TTFT + n × TPOT after a request arrives, so no TTFT or E2E the
    client measures can be shorter; a busy machine only adds time (the client sends requests one after another on
    its event loop, about a millisecond each and several with both cores busy: 32 at once put the mean TTFT 10-18 %
    above TTFT there), so the upper bounds leave room for it, and still catch a clock started at the level's start
    instead of each request's send (the second wave of 32 would wait for the first: a mean TTFT 60 % high). TPOT has
    no such floor: a first token read late (the client or the server off the CPU for a moment) shortens the span
    after it, by 20 % and more with both cores busy. Its definition is checked exactly instead (TPOT is (E2E − TTFT)
    over osl − 1; over osl it would read 4 % short; the gaps between tokens add up to that span), and the median gap
    must stay above half of TPOT (the lowest seen with both cores busy is 0.79 of it): a client that read the
    stream only at its end would see gaps of nothing."""
    with FakeServer(Speed(ttft_s=TTFT, tpot_s=TPOT)) as server:
        level = asyncio.run(run_level(Target(url=server.url, model="m"), isl=64, osl=24, num_prompts=max(4,
                                      concurrency * 2), concurrency=concurrency))  # fmt: skip
    assert level.failed == 0 and level.completed == level.num_prompts
    assert TTFT <= level.ttft_s.mean < TTFT * 1.25
    assert TTFT + 23 * TPOT <= level.e2e_s.mean < (TTFT + 23 * TPOT) * 1.25
    _assert_tpot_and_itl_as_defined(level, osl=24)
    assert level.tpot_s.mean < TPOT * 1.5 and TPOT * 0.5 <= level.itl_s.p50 < TPOT * 1.5
    assert level.output_tokens == 24 * level.completed  # from the usage the server reports
    # a closed loop of C clients: each client's requests run back to back
    expected = level.num_prompts / concurrency * (TTFT + 23 * TPOT)
    assert expected <= level.duration_s < expected * 1.25


def test_the_chat_endpoint_too():
    with FakeServer(Speed(ttft_s=0.05, tpot_s=0.05)) as server:
        level = asyncio.run(run_level(Target(url=server.url, chat=True), isl=16, osl=10, num_prompts=4,
                                      concurrency=2))  # fmt: skip
    assert level.completed == 4 and level.e2e_s.mean >= 0.05 + 9 * 0.05
    _assert_tpot_and_itl_as_defined(level, osl=10)
    assert level.itl_s.p50 >= 0.05 * 0.5  # streamed token by token (see the first test)


def test_dropped_streams_are_counted_and_the_rest_kept():
    """Streams cut short are failures, and only the completed ones count in the latencies: their TPOT is as
    defined over their own tokens (a busy machine only adds to it: the bound allows 25 ms of scheduling delay per
    token, five times what a loaded two-core machine was seen to add)."""
    with FakeServer(Speed(ttft_s=0.02, tpot_s=0.05, drop_every=3, drop_after=4)) as server:
        level = asyncio.run(run_level(Target(url=server.url), isl=16, osl=12, num_prompts=12, concurrency=4,
                                      warmup=False))  # fmt: skip
    assert level.failed == 4 and level.completed == 8  # every third stream of 12 is cut
    assert level.errors == {"stream cut short": 4}
    assert level.output_tokens == 8 * 12  # only what completed counts
    assert level.e2e_s.mean >= 0.02 + 11 * 0.05
    _assert_tpot_and_itl_as_defined(level, osl=12)
    assert level.tpot_s.mean < 0.05 * 1.5 and level.itl_s.p50 >= 0.05 * 0.5


def test_an_unreachable_server_is_one_clear_error():
    with pytest.raises(BenchError, match="does not serve a test request: cannot connect"):
        asyncio.run(run_level(Target(url="http://127.0.0.1:9"), isl=4, osl=4, num_prompts=1, concurrency=1))


def test_the_command_appends_each_level_as_it_finishes(tmp_path):
    out = tmp_path / "runs.jsonl"
    out.write_text('{"earlier": true}\n')  # an earlier run stays
    with FakeServer(Speed(ttft_s=0.05, tpot_s=0.005)) as server:
        result = subprocess.run(
            [sys.executable, "-m", "shardwise", "bench", "--url", server.url, "--concurrency", "1,4", "--isl", "16",
             "--osl", "8", "--num-prompts", "8", "--output", str(out), "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0] == {"earlier": True} and [r["max_concurrency"] for r in lines[1:]] == [1, 4]
    assert all(r["completed"] == 8 and r["failed"] == 0 for r in lines[1:])
    assert json.loads(result.stdout) == lines[1:]


def test_the_command_refuses_a_bad_url_in_one_line():
    for url, message in (("localhost:1", "must start with http://"), ("http://127.0.0.1:9", "cannot connect")):
        result = subprocess.run([sys.executable, "-m", "shardwise", "bench", "--url", url, "--concurrency", "1"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_server_errors_and_stalls_are_counted_not_hidden():
    with FakeServer(Speed(ttft_s=0.02, tpot_s=0.005, fail_every=4, stall_every=5)) as server:
        level = asyncio.run(run_level(Target(url=server.url, timeout_s=1.0), isl=16, osl=8, num_prompts=20,
                                      concurrency=4, warmup=False))  # fmt: skip
    # requests 1…20: every 4th answers 500 (5), every 5th stalls (4), and the 20th is both: a 500
    assert level.errors == {"http 500": 5, "timeout": 3}
    assert level.completed == 12 and level.failed == 8
    assert level.output_tokens == 12 * 8


def _interruptible() -> None:
    """Ctrl-C reaches the command as it reaches it at a terminal: a shell that runs the tests in the background
    (`pytest &`, a CI script's job) starts them with SIGINT ignored, and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_keeps_every_finished_level(tmp_path):
    """SIGINT once the first level is on disk, while the second can never finish (its requests stall after their
    first token): the first level is kept, the command exits 130. The test waits on events, not on time: the
    first level is 1 + 2 warm-up requests and 4 measured ones, so from the 8th on every request stalls."""
    out = tmp_path / "runs.jsonl"
    with FakeServer(Speed(ttft_s=0.01, tpot_s=0.01, stall_from=8)) as server:
        bench = subprocess.Popen(
            [sys.executable, "-m", "shardwise", "bench", "--url", server.url, "--concurrency", "2,1", "--isl", "8",
             "--osl", "20", "--num-prompts", "4", "--output", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
            time.sleep(0.05)
        bench.send_signal(signal.SIGINT)
        _, err = bench.communicate(timeout=60)
    assert bench.returncode == 130, err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["max_concurrency"] == 2 and lines[0]["completed"] == 4
    assert "Traceback" not in err
