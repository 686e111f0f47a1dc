"""Rewards: worked examples for the built-ins, EasyR1-style reward files, every loader error, and the
reward worker that times each call."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from easyr1.rewards import math as math_reward
from easyr1.rewards.dapo import normalize_answer, overlong
from easyr1.rewards.loader import RewardFunctionError, load_reward_function
from easyr1.rewards.math import is_equivalent, last_boxed
from easyr1.rewards.worker import RewardWorker


def inputs(*pairs: tuple[str, str], length: int = 10) -> list[dict]:
    return [{"response": r, "response_length": length, "ground_truth": g} for r, g in pairs]


def score(spec: str, response: str, ground_truth: str, length: int = 10, **kwargs) -> dict[str, float]:
    return load_reward_function(spec, kwargs)(inputs((response, ground_truth), length=length))[0]


# ---- math -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("<think>1 of 2</think> The answer is \\boxed{1/2}.", "0.5", (1.0, 1.0, 1.0)),
        ("<think>half</think>\\boxed{\\frac{1}{2}}", "0.5", (1.0, 1.0, 1.0)),
        ("<think>try 3</think> \\boxed{3}, no: \\boxed{5}", "5", (1.0, 1.0, 1.0)),  # the last box counts
        ("<think>try 3</think> \\boxed{3}, no: \\boxed{5}", "3", (0.1, 1.0, 0.0)),
        ("<think>guess</think> \\boxed{7}", "5", (0.1, 1.0, 0.0)),  # wrong: format only
        ("<think>no box</think> the answer is 5", "5", (0.0, 0.0, 0.0)),
        ("The answer is \\boxed{5}", "5", (0.9, 0.0, 1.0)),  # no think tags
        ("<think>cut off</think> \\boxed{\\frac{1}{2}", "0.5", (0.0, 0.0, 0.0)),  # truncated box
        ("< think >spaced tags< /think > \\boxed{x+1}", "1+x", (1.0, 1.0, 1.0)),
    ],
)
def test_math_examples(response: str, truth: str, expected: tuple[float, float, float]) -> None:
    result = score("math", response, truth)
    assert result == pytest.approx(dict(zip(("overall", "format", "accuracy"), expected, strict=True)))


def test_math_format_weight_kwarg() -> None:
    assert score("math", "<think>t</think>\\boxed{4}", "5", format_weight=0.5)["overall"] == 0.5
    assert score("math", "\\boxed{5}", "5", format_weight=0.5)["overall"] == 0.5


def test_last_boxed() -> None:
    assert last_boxed("\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{\\{1,2\\}} then \\fbox{3}") == "3"
    assert last_boxed("\\boxed{\\boxed{4}}") == "\\boxed{4}"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{1} and \\boxed{2") is None


@pytest.mark.parametrize(
    "answer, truth, same",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\{2,1\\}", "\\{1,2\\}", True),
        ("[0, 1)", "[0,1)", True),
        ("\\text{Yes}", "yes", True),
        ("sey", "yes", False),  # math-verify alone says True (y*e*s == s*e*y)
        ("0.3333", "\\frac{1}{3}", False),
        ("", "5", False),
    ],
)
def test_is_equivalent(answer: str, truth: str, same: bool) -> None:
    assert is_equivalent(answer, truth) is same


def test_math_verify_in_threads_and_main_thread_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    with ThreadPoolExecutor(2) as pool:  # math-verify refuses threads unless its timeouts are off
        assert list(pool.map(is_equivalent, ["1/2", "3"], ["0.5", "4"])) == [True, False]
    monkeypatch.setattr(math_reward, "_MATH_VERIFY_TIMEOUT_S", 1)
    start = time.monotonic()
    assert not is_equivalent("9^{9^{9^{9}}}", "2")  # hangs forever without a timeout
    assert time.monotonic() - start < 10


# ---- r1v ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("<think>area</think> <answer>12</answer>", "12", (1.0, 1.0, 1.0)),
        ("<think>a</think><answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", (1.0, 1.0, 1.0)),
        ("<think>a</think><answer>B</answer>", "B", (1.0, 1.0, 1.0)),
        ("<think>a</think><answer>13</answer>", "12", (0.5, 1.0, 0.0)),
        ("<answer>12</answer>", "12", (0.5, 0.0, 1.0)),  # no think tags
        ("<think>a</think> it is 12", "12", (0.0, 0.0, 0.0)),  # no answer tags: the whole response is graded
        ("<think>a</think><answer>12</answer> trailing", "12", (0.5, 0.0, 1.0)),
        # EasyR1's r1v example, case by case: no tags grades the whole response; nothing may follow
        # the answer, not even a newline; the first block counts; a block across lines is none.
        ("12", "12", (0.5, 0.0, 1.0)),
        ("<think>a</think><answer>12</answer>\n", "12", (0.5, 0.0, 1.0)),
        ("<think>a</think><answer>8</answer><answer>12</answer>", "12", (0.5, 1.0, 0.0)),
        ("<think>a</think><answer>\n12\n</answer>", "12", (0.5, 1.0, 0.0)),
        ("<think>a</think><answer>\\frac{1}{</answer>", "12", (0.5, 1.0, 0.0)),  # malformed LaTeX scores 0
    ],
)
def test_r1v_examples(response: str, truth: str, expected: tuple[float, float, float]) -> None:
    result = score("r1v", response, truth)
    assert result == pytest.approx(dict(zip(("overall", "format", "accuracy"), expected, strict=True)))


def test_r1v_is_sequential_and_weighted() -> None:
    reward = load_reward_function("r1v", {"format_weight": 0.1})
    assert reward.reward_type == "sequential"
    assert reward(inputs(("<think>a</think><answer>1</answer>", "2")))[0]["overall"] == pytest.approx(0.1)


# ---- dapo -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, normalized",
    [  # Minerva's normalisation, worked by hand
        ("$5$", "5"),
        ("x = 5", "5"),  # the part after the last "="
        ("12 cm", "12"),  # spaces go, then the unit
        ("1,000", "1000"),
        ("5.0", "5.0"),  # no arithmetic: 5.0 and 5 differ
        ("90^\\circ", "90"),
        ("\\boxed{\\dfrac12}", "\\dfrac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\text{an apple}", "apple"),
        ("$\\$3.50$", "3.50"),
        ("1, 2, \\text{and} 3", "123"),  # a list of digits reads as one number
    ],
)
def test_dapo_normalization(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    "response, truth, right",
    [
        ("so it is 42.\nAnswer: 42", "42", True),
        ("Answer: $1,000$ dollars", "1000", True),
        ("answer: 41\nthinking again...\nANSWER: 42", "42", True),  # the last one counts
        ("Answer:\n42", "42", True),  # the answer may start on the next line
        ("Answer: 41", "42", False),
        ("The result is 42", "42", False),  # no "Answer:"
        ("Answer: 5.0", "5", False),
        ("Answer: 42" + "." * 300, "42", False),  # only the last 300 characters are read
    ],
)
def test_dapo_examples(response: str, truth: str, right: bool) -> None:
    """EasyR1's keys and values: accuracy +1/-1, accuracy_normalized 1/0, overlong 0 without a limit."""
    result = score("dapo", response, truth)
    sign = 1.0 if right else -1.0
    assert result == {"overall": sign, "accuracy": sign, "overlong": 0.0, "accuracy_normalized": float(right)}


def test_dapo_overlong_penalty_by_hand() -> None:
    # Punished past 100 - 20 = 80 tokens: overlong = (80 - length) / 20, -1 from 100 on; the
    # overall score adds it times the factor 0.5.
    kwargs = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 0.5}
    reward = load_reward_function("dapo", kwargs)
    for length, punished in [(80, 0.0), (90, -0.5), (95, -0.75), (100, -1.0), (130, -1.0)]:
        right, wrong = reward(inputs(("Answer: 7", "7"), ("Answer: 6", "7"), length=length))
        assert right == pytest.approx(
            {"overall": 1 + 0.5 * punished, "accuracy": 1.0, "overlong": punished, "accuracy_normalized": 1.0}
        )
        assert wrong == pytest.approx(
            {
                "overall": -1 + 0.5 * punished,
                "accuracy": -1.0,
                "overlong": punished,
                "accuracy_normalized": 0.0,
            }
        )
    assert overlong(101, 100, 0) == -1.0  # no buffer: a hard cut at the limit
    assert overlong(100, 100, 0) == 0.0
    assert overlong(10**6, None, 0) == 0.0  # no limit given: no punishment


def test_dapo_bad_buffer_is_reported() -> None:
    reward = load_reward_function("dapo", {"max_response_length": 10, "overlong_buffer_length": 20})
    with pytest.raises(RewardFunctionError, match="dapo raised ValueError.*overlong_buffer_length=20"):
        reward(inputs(("Answer: 1", "1")))


# ---- reward files (EasyR1 style) -----------------------------------------------------------

BATCH_FILE = """
    REWARD_TYPE = "batch"

    def compute_score(reward_inputs, bonus=0.0):
        return [
            {"overall": float(x["response"] == x["ground_truth"]) + bonus, "length": x["response_length"]}
            for x in reward_inputs
        ]
"""

SEQUENTIAL_FILE = """
    REWARD_TYPE = "sequential"
    calls = []

    def main(reward_input, scale):
        calls.append(reward_input["response"])
        return {"overall": scale * len(reward_input["response"]), "correct": reward_input["response"] == "ok"}
"""


def write(folder: Path, body: str, name: str = "reward.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_batch_file_with_kwargs(tmp_path: Path) -> None:
    path = write(tmp_path, BATCH_FILE)
    reward = load_reward_function(f"{path}:compute_score", {"bonus": 0.5})
    assert reward.reward_type == "batch" and reward.name == f"{path}:compute_score"
    scores = reward(inputs(("a", "a"), ("b", "a"), length=3))
    assert scores == [{"overall": 1.5, "length": 3.0}, {"overall": 0.5, "length": 3.0}]
    assert all(type(v) is float for s in scores for v in s.values())
    assert reward([]) == []


def test_sequential_file_defaults_to_main(tmp_path: Path) -> None:
    path = write(tmp_path, SEQUENTIAL_FILE)
    reward = load_reward_function(str(path), {"scale": 2})
    assert reward.reward_type == "sequential"
    assert reward(inputs(("ok", "x"), ("nope", "x"))) == [
        {"overall": 4.0, "correct": 1.0},
        {"overall": 8.0, "correct": 0.0},
    ]
    assert reward.fn.__globals__["calls"] == ["ok", "nope"]  # called once per item


def test_missing_reward_type_means_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "def main(batch):\n    return [{'overall': len(batch)} for _ in batch]\n", "plain.py")
    monkeypatch.chdir(tmp_path)
    reward = load_reward_function("plain.py")
    assert reward.reward_type == "batch"
    assert reward(inputs(("a", "a"), ("b", "b"))) == [{"overall": 2.0}, {"overall": 2.0}]


def test_reward_file_pickles_across_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    write(tmp_path / "run", BATCH_FILE)
    monkeypatch.chdir(tmp_path / "run")
    reward = load_reward_function("reward.py:compute_score", {"bonus": 1.0})
    monkeypatch.chdir(tmp_path)
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.name.endswith("reward.py:compute_score")
    assert clone(inputs(("a", "a"))) == [{"overall": 2.0, "length": 10.0}]


def test_same_file_name_in_two_folders_do_not_collide(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = write(tmp_path / "a", "def main(b):\n    return [{'overall': 1} for _ in b]\n", "math.py")
    second = write(tmp_path / "b", "def main(b):\n    return [{'overall': 2} for _ in b]\n", "math.py")
    assert load_reward_function(str(first))(inputs(("x", "y")))[0]["overall"] == 1.0
    assert load_reward_function(str(second))(inputs(("x", "y")))[0]["overall"] == 2.0


# ---- errors: each names the file -----------------------------------------------------------


def test_unknown_builtin_lists_builtins() -> None:
    with pytest.raises(RewardFunctionError, match="'mathh'.*math, r1v, dapo"):
        load_reward_function("mathh")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RewardFunctionError, match="file .*nowhere.py not found"):
        load_reward_function(f"{tmp_path}/nowhere.py:main")


def test_file_that_fails_to_import(tmp_path: Path) -> None:
    path = write(tmp_path, "import not_a_module_anywhere\n", "broken.py")
    with pytest.raises(RewardFunctionError, match="broken.py failed to import: ModuleNotFoundError") as info:
        load_reward_function(str(path))
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_missing_function_lists_what_is_there(tmp_path: Path) -> None:
    path = write(tmp_path, BATCH_FILE)
    expected = r"reward.py:main: .*no function 'main'.*\['compute_score'\]"
    with pytest.raises(RewardFunctionError, match=expected):
        load_reward_function(str(path))


def test_unknown_reward_type(tmp_path: Path) -> None:
    path = write(tmp_path, "REWARD_TYPE = 'parallel'\ndef main(x):\n    return x\n", "typed.py")
    with pytest.raises(RewardFunctionError, match="typed.py:main: REWARD_TYPE = 'parallel'"):
        load_reward_function(str(path))


def test_kwargs_that_do_not_fit(tmp_path: Path) -> None:
    path = write(tmp_path, SEQUENTIAL_FILE)
    with pytest.raises(RewardFunctionError, match="reward.py:main does not fit.*'scale'"):
        load_reward_function(str(path))  # required kwarg missing
    with pytest.raises(RewardFunctionError, match="reward.py:main does not fit.*'scael'"):
        load_reward_function(str(path), {"scale": 1, "scael": 2})


def test_exception_inside_the_function(tmp_path: Path) -> None:
    body = "REWARD_TYPE = 'sequential'\ndef main(x):\n    return {'overall': 1 / 0}\n"
    path = write(tmp_path, body, "zero.py")
    # The input is named by its response and ground truth, to find it and replay the call.
    with pytest.raises(
        RewardFunctionError,
        match=r"zero.py:main raised ZeroDivisionError on input 0 \(response 'a', ground_truth 'b'\)",
    ) as info:
        load_reward_function(str(path))(inputs(("a", "b")))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    "returned, message",
    [
        ("[{'overall': 1.0}]", "returned 1 scores for 2 inputs"),
        ("{'overall': 1.0}", "returned dict; a batch reward function must return a list of 2 dicts"),
        ("None", "returned NoneType; a batch reward function must return a list of 2 dicts"),
        ("({'overall': 1.0} for _ in range(3))", "returned 3 scores for 2 inputs"),
        (
            "[1.0, 1.0]",
            r"score 0 \(response 'a', ground_truth 'a'\) is a float, expected a dict with 'overall'",
        ),
        ("[{'accuracy': 1.0}] * 2", r"score 0 \(.*\) has no 'overall' key \(keys: \['accuracy'\]\)"),
        (
            "[{'overall': 1.0}, {'overall': 'high'}]",
            r"score 1 \(response 'b', ground_truth 'b'\): 'overall' = 'high' is text, not a float",
        ),
        ("[{'overall': 1.0, 'format': None}] * 2", r"score 0 \(.*\): 'format' = None is not a float"),
        ("[{'overall': float('nan')}] * 2", r"score 0 \(.*\): 'overall' = nan is not finite"),
        (
            "[{'overall': 1.0, 'accuracy': float('inf')}] * 2",
            r"score 0 \(.*\): 'accuracy' = inf is not finite",
        ),
    ],
)
def test_malformed_results(tmp_path: Path, returned: str, message: str) -> None:
    path = write(tmp_path, f"def score(batch):\n    return {returned}\n", "bad.py")
    reward = load_reward_function(f"{path}:score")
    with pytest.raises(RewardFunctionError, match=f"bad.py:score.*{message}"):
        reward(inputs(("a", "a"), ("b", "b")))


# ---- the reward worker: scoring in a process, each call timed -----------------------------


def test_worker_gives_the_same_scores_as_in_process(tmp_path: Path) -> None:
    path = write(tmp_path, SEQUENTIAL_FILE)
    cases = [
        (
            "math",
            {},
            inputs(("<think>h</think>\\boxed{\\frac{1}{2}}", "0.5"), ("<think>g</think>\\boxed{7}", "5")),
        ),
        (
            "r1v",
            {"format_weight": 0.1},
            inputs(("<think>a</think><answer>12</answer>", "12"), ("<answer>1</answer>", "2")),
        ),
        (
            "dapo",
            {"max_response_length": 10, "overlong_buffer_length": 4},
            inputs(("Answer: 7", "7"), ("x", "7"), length=9),
        ),
        (str(path), {"scale": 2}, inputs(("ok", "x"), ("nope", "x"))),
    ]
    for spec, kwargs, batch in cases:
        worker = RewardWorker(spec, kwargs, timeout=60)
        assert worker(batch) == load_reward_function(spec, kwargs)(batch), spec
        assert worker(batch) == worker(batch) and worker([]) == []
        worker.close()


def test_worker_runs_the_function_in_its_main_thread(tmp_path: Path) -> None:
    """Where math_verify's and mathruler's SIGALRM timeouts work."""
    body = "import os, threading\ndef main(b):\n    main_thread = threading.current_thread() is threading.main_thread()\n"
    body += "    return [{'overall': float(main_thread), 'pid': os.getpid()} for _ in b]\n"
    worker = RewardWorker(str(write(tmp_path, body, "where.py")), None, timeout=60)
    [score] = worker(inputs(("a", "a")))
    assert score["overall"] == 1.0 and score["pid"] != os.getpid()
    worker.close()


SLOW_FILE = """
    import time
    REWARD_TYPE = "sequential"

    def main(reward_input):
        if reward_input["response"].endswith("slow"):
            time.sleep(3600)
        return {"overall": 1.0}
"""


def test_a_call_past_the_timeout_is_stopped_and_named(tmp_path: Path) -> None:
    path = write(tmp_path, SLOW_FILE, "slow.py")
    worker = RewardWorker(str(path), None, timeout=1)
    process = worker._process
    long = "step " * 40 + "slow"
    start = time.monotonic()
    expected = (
        r"slow.py:main did not return within 1 s on input 1 of 2 \(response 'step step .*' \.\.\. '.* slow', "
        r"ground_truth '42'\); its worker process was killed\. Raise worker.reward.timeout"
    )
    with pytest.raises(RewardFunctionError, match=expected):
        worker(inputs(("fast", "1"), (long, "42")))
    assert time.monotonic() - start < 10
    assert process.poll() is not None  # killed, not left running
    assert worker(inputs(("fast", "1"))) == [{"overall": 1.0}]  # a new worker for the next call
    worker.close()


@pytest.mark.parametrize(
    "body",
    [
        "def main(batch):\n    while True:\n        pass\n",
        # a pure-C call that holds the GIL for ever: catastrophic backtracking in `re`
        "import re\ndef main(batch):\n    re.match(r'(a+)+$', 'a' * 64 + 'b')\n",
    ],
    ids=["busy-loop", "gil-holding-c-call"],
)
def test_code_that_never_yields_is_stopped(tmp_path: Path, body: str) -> None:
    worker = RewardWorker(str(write(tmp_path, body, "spin.py")), None, timeout=1)
    start = time.monotonic()
    with pytest.raises(
        RewardFunctionError, match=r"spin.py:main did not return within 1 s on a batch of 2 inputs"
    ):
        worker(inputs(("a", "1"), ("b", "2")))
    assert time.monotonic() - start < 10


def test_errors_in_the_worker_keep_the_users_traceback(tmp_path: Path) -> None:
    body = "REWARD_TYPE = 'sequential'\ndef main(x):\n    return {'overall': 1 / 0}\n"
    worker = RewardWorker(str(write(tmp_path, body, "zero.py")), None, timeout=60)
    with pytest.raises(RewardFunctionError, match="zero.py:main raised ZeroDivisionError on input 0") as info:
        worker(inputs(("a", "b")))
    assert 'zero.py", line 3, in main' in info.value.__notes__[0]
    with pytest.raises(RewardFunctionError, match="zero.py:main does not fit"):
        RewardWorker(str(tmp_path / "zero.py"), {"scale": 1}, timeout=60)  # load errors as in-process


def test_an_interrupted_call_leaves_no_stale_answer(tmp_path: Path) -> None:
    """Ctrl-C (raised here by an alarm) while the worker is mid-call: the next call gets its own scores."""
    worker = RewardWorker(str(write(tmp_path, SLOW_FILE.replace("3600", "2"), "slow.py")), None, timeout=60)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            worker(inputs(("slow", "1")))
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert worker(inputs(("fast", "1"), ("fast", "2"))) == [{"overall": 1.0}, {"overall": 1.0}]
    worker.close()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def test_the_worker_dies_with_its_rank(tmp_path: Path) -> None:
    """A rank killed (SIGKILL, no clean-up) during a call that never returns leaves no worker behind."""
    body = "import pathlib, time\ndef main(b):\n    pathlib.Path(__file__).with_suffix('.started').touch()\n"
    path = write(tmp_path, body + "    time.sleep(3600)\n", "hangs.py")
    script = (
        "from easyr1.rewards.worker import RewardWorker\n"
        f"worker = RewardWorker({str(path)!r}, None, timeout=600)\n"
        "print(worker._process.pid, flush=True)\n"
        "worker([{'response': 'a', 'response_length': 1, 'ground_truth': '1'}])\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(rank.stdout.readline())
    deadline = time.monotonic() + 60
    while not path.with_suffix(".started").exists():  # wait until the call is under way
        assert time.monotonic() < deadline and rank.poll() is None, "the call never started"
        time.sleep(0.05)
    rank.kill()
    rank.wait()
    rank.stdout.close()
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_worker_that_dies_is_reported(tmp_path: Path) -> None:
    worker = RewardWorker(
        str(write(tmp_path, "import os\ndef main(b):\n    os._exit(3)\n", "exits.py")), None, timeout=60
    )
    with pytest.raises(RewardFunctionError, match=r"exits.py:main lost its worker process \(exit code 3\)"):
        worker(inputs(("a", "b")))


def test_easyr1_reward_files_import_here() -> None:
    """EasyR1's examples/reward_function/math.py and r1v.py import these (installed with the engine)."""
    from mathruler.grader import extract_boxed_content, grade_answer

    assert extract_boxed_content("so \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert grade_answer("\\frac{1}{2}", "0.5")


# A reward that leaves processes behind: a `sleep` it starts, a forked copy of its worker, or a
# `sleep` in a session of its own; each writes its pid to PIDS, then the call ends as ENDING says.
SPAWNING_FILE = """
    import os, subprocess, sys, time
    REWARD_TYPE = "batch"
    PIDS, SPAWN, ENDING = {pids!r}, {spawn!r}, {ending!r}

    def main(batch):
        if SPAWN == "popen":
            pid = subprocess.Popen(["sleep", "1000"]).pid
        elif SPAWN == "session":
            pid = subprocess.Popen(["sleep", "1000"], start_new_session=True).pid
        else:
            pid = os.fork()
            if pid == 0:
                time.sleep(1000)
                os._exit(0)
        with open(PIDS, "a") as out:
            out.write(f"{{pid}}\\n")
        if ENDING == "timeout":
            time.sleep(3600)
        elif ENDING == "crash":
            os._exit(3)
        return [{{"overall": 1.0}} for _ in batch]
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left for PID 1 to reap is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("spawn", ["popen", "fork", "session"])
@pytest.mark.parametrize("ending", ["success", "timeout", "crash"])
def test_nothing_the_reward_started_outlives_its_worker(tmp_path: Path, spawn: str, ending: str) -> None:
    """Processes the reward function starts (or forks) end with its worker, whether the run ends, the
    call times out, or the worker crashes; they once ran on under PID 1 after the run."""
    if spawn == "session" and ending == "crash":
        pytest.skip(
            "a process in a session of its own whose parent died is a daemon: out of reach (worker.py)"
        )
    pids = tmp_path / "pids"
    body = SPAWNING_FILE.format(pids=str(pids), spawn=spawn, ending=ending)
    worker = RewardWorker(str(write(tmp_path, body, "spawns.py")), None, timeout=2)
    try:
        if ending == "success":
            assert worker(inputs(("a", "1"))) == [{"overall": 1.0}]
            worker.close()
        else:
            with pytest.raises(
                RewardFunctionError,
                match="did not return within 2 s" if ending == "timeout" else r"exit code 3",
            ):
                worker(inputs(("a", "1")))
        [pid] = [int(line) for line in pids.read_text().split()]
        deadline = time.monotonic() + 10  # SIGKILL is immediate; the wait only covers a loaded host
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), f"the reward's process {pid} outlived its worker ({spawn}, {ending})"
    finally:
        for pid in map(int, pids.read_text().split() if pids.exists() else []):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
