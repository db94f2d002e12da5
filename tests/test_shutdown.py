"""`shutdown.end_process`: what Python's exit does that anyone can see, without its teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import ampkit.shutdown


def _end(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(body).replace("TMP", repr(str(tmp_path))).replace("SHUTDOWN", ampkit.shutdown.__name__)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_threads_atexit_and_buffered_output_are_finished_and_the_code_kept(tmp_path):
    proc = _end(
        tmp_path,
        """
        import atexit, concurrent.futures, os, sys, threading, time
        from SHUTDOWN import end_process

        def late(name):
            time.sleep(0.3)
            open(os.path.join(TMP, name), "w").close()

        threading.Thread(target=late, args=("thread",)).start()  # not a daemon: the exit waits for it
        pool = concurrent.futures.ThreadPoolExecutor(1)  # its workers stop through threading's exit hook
        pool.submit(late, "pool")
        atexit.register(lambda: print("atexit ran"))
        sys.stdout.write("buffered, no newline")
        sys.stderr.write("log line")
        end_process(3)
        """,
    )
    assert proc.returncode == 3, proc.stderr
    assert (tmp_path / "thread").exists() and (tmp_path / "pool").exists()
    assert proc.stdout == "buffered, no newlineatexit ran\n" and proc.stderr == "log line"


def test_the_modules_are_not_torn_down(tmp_path):
    """What it skips: the teardown that deletes every module's objects (a finalizer left in a module's
    globals never runs), ~0.7 s a process once torch and dynamo are loaded."""
    proc = _end(
        tmp_path,
        """
        from SHUTDOWN import end_process

        class Noisy:
            def __del__(self):
                print("torn down")

        kept = Noisy()
        end_process(0)
        """,
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
    plain = _end(tmp_path, "class Noisy:\n    def __del__(self):\n        print('torn down')\nkept = Noisy()\n")
    assert plain.stdout == "torn down\n"  # the same program ending as Python ends it


def test_a_profiler_still_gets_its_results(tmp_path):
    """`python -m cProfile -o FILE -m ampkit ...` writes FILE after the program returns: under a profiler
    the process ends as Python ends it."""
    out = tmp_path / "ampkit.prof"
    argv = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "ampkit", "--version"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ampkit "), done.stderr
    assert out.stat().st_size > 0
