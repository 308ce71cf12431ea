"""The README, run the way a newcomer runs it: every shell block, in order, in a copy of this
checkout with a fresh virtual environment. The first block (install and `leash dev`) runs as a
server on a free port, its state in a temporary directory; the blocks after it run in one shell
(the "second terminal") against it; the last, the test command, runs verbatim with
PYTEST_ADDOPTS narrowing it to one test so that it does not run this whole suite again inside
itself. Only the blocks marked ``# needs an API key`` are not run (a provider account).

Marked ``readme`` (and ``slow``): it is part of every full run, CI's included, and takes a
few minutes, most of them pip's; each step has its own deadline.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, wait_for

README = ROOT / "README.md"
VERSION_CHECK = ("python3 -c 'import sys; sys.exit(sys.version_info < (3, 11) and \"leash needs Python 3.11 "
                 "or newer\")'")
RUN_COMMAND = f"{VERSION_CHECK} && python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/leash dev"
TEST_COMMAND = (f"{VERSION_CHECK} && python3 -m venv .venv && .venv/bin/pip install -e '.[test]' "
                "&& .venv/bin/pytest -n 4 --dist loadgroup")
NEEDS_KEY = "# needs an API key"
#: A user's first day, in order: the README's sections.
SECTIONS = ["Run it", "Submit a job", "Watch it", "Read the results", "Model backends", "Cost and budgets",
            "Batch mode", "In production", "Your own job kinds", "Run the tests"]


def sh_blocks() -> list[str]:
    """Every ```sh block of the README, in order."""
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)]


def second_terminal_blocks(port: int) -> list[str]:
    """The blocks between the first (the server) and the last (the tests) that run without an
    account, with their addresses on the port of the test's `leash dev`."""
    return [block.replace("localhost:5000", f"localhost:{port}") for block in sh_blocks()[1:-1]
            if not block.startswith(NEEDS_KEY)]


def test_the_readme_follows_a_first_day_in_under_200_lines():
    text = README.read_text()
    headings = re.findall(r"^## (?:\d+\. )?(.+)$", text, re.M)
    assert headings == SECTIONS
    assert len(text.splitlines()) < 200
    assert "In a second terminal" in text.split("## 2.")[1].split("## 3.")[0]


def test_it_begins_with_the_run_command_ends_with_the_test_command_and_ci_runs_the_same():
    blocks = sh_blocks()
    assert (blocks[0], blocks[-1]) == (RUN_COMMAND, TEST_COMMAND)
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.replace('"$PYTHON"', "python3").replace(" -q ", " ") == TEST_COMMAND
    # Only the two blocks that talk to a provider need an account; every other one runs below.
    assert [b.splitlines()[1].split()[0] for b in blocks if b.startswith(NEEDS_KEY)] == [
        "export", "job=$(.venv/bin/leash"]


def test_the_version_check_refuses_an_older_python_in_words():
    check = VERSION_CHECK.split(" ", 1)[1]
    older = subprocess.run(["bash", "-c", f"{sys.executable} {check}"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONSTARTUP=""))
    assert older.returncode == 0  # this Python is new enough
    code = check.removeprefix("-c ").strip("'").replace("(3, 11)", "(99, 0)")
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stderr.strip() == "leash needs Python 3.11 or newer"


def test_the_own_kind_example_is_the_shipped_file_and_registers_its_kind(env):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert block in (ROOT / "examples" / "kinds.py").read_text()
    from jobs import kinds

    env.setenv("LEASH_IMPORTS", "examples.kinds")
    kinds.import_kinds()
    field_names = [f.name for f in kinds.KINDS["summarise"].fields]
    assert field_names == ["tone"]
    with pytest.raises(Exception, match="'tone' must be plain or formal"):
        kinds.KINDS["summarise"].fields[0].check({"items": ["x"], "tone": "angry"})


def test_the_example_schema_is_shipped_and_is_a_schema_the_extract_kind_takes():
    import json

    from jobs.kinds import KINDS

    schema = json.loads((ROOT / "examples" / "review.schema.json").read_text())
    KINDS["extract"].validate({"items": ["x"], "schema": schema})


def test_ctrl_c_on_a_test_run_leaves_no_redis_server(tmp_path):
    """The suite's Redis ends with the process that started it, however it ends."""
    script = ("import sys, time; from pathlib import Path; from cli.devserver import start_redis; "
              f"proc, url = start_redis(Path({str(tmp_path)!r}), die_with_parent=True); "
              "print(proc.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        redis_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(redis_pid)
        # Ctrl-C on `pytest -n 4` ends xdist workers without their clean-up; SIGKILL is the same for
        # the redis-server, and is not ignored as SIGINT is by a process started in the background.
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(lambda: not psutil.pid_exists(redis_pid) or psutil.Process(redis_pid).status() == "zombie", 10,
                 message="the redis-server to end with its parent")
    finally:
        parent.kill()
        parent.wait()


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _get(url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.read().decode()


def _answers(url: str) -> bool:
    try:
        return _get(url)[0] == 200
    except OSError:
        return False


@pytest.mark.readme
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_shell_block_of_the_readme_works_in_a_fresh_checkout(tmp_path):
    from cli.devserver import free_port

    blocks = sh_blocks()
    run, tests = blocks[0], blocks[-1]
    checkout = tmp_path / "leash"
    _copy_checkout(checkout)
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS_URL", "LEASH_", "SECRET_KEY", "PYTEST_", "VIRTUAL_ENV", "PORT"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), PORT=str(port), PIP_DISABLE_PIP_VERSION_CHECK="1")
    log = (tmp_path / "dev.log").open("w")
    # Its own session, like a terminal's foreground job: Ctrl-C reaches the whole group.
    dev = subprocess.Popen(["bash", "-c", run], cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    seen: set[int] = set()

    def note_children() -> None:
        try:
            seen.update(p.pid for p in psutil.Process(dev.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def dev_is_up() -> bool:
        note_children()
        assert dev.poll() is None, (tmp_path / "dev.log").read_text()[-3000:]
        return _answers(f"http://127.0.0.1:{port}/healthz")

    try:
        wait_for(dev_is_up, 600, interval=1, message="the first block to install and start leash dev")

        # The second terminal: every block after the first, in order, in one shell.
        script = "set -euo pipefail\n" + "\n".join(second_terminal_blocks(port))
        used = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=300)
        assert used.returncode == 0, used.stdout[-3000:] + used.stderr[-3000:]
        assert re.search(r"^state\s+succeeded$", used.stdout, re.M), used.stdout
        assert '"state":"queued"' in used.stdout and '"url":"/jobs/' in used.stdout  # the API's 202
        with (checkout / "results.csv").open(encoding="utf-8") as rows:
            table = list(csv.reader(rows))
        items = (checkout / "examples" / "items.txt").read_text().splitlines()
        assert [row[1] for row in table[1:]] == items
        assert all(row[2] in ("positive", "negative", "question") for row in table[1:]), table
        headers = [next(csv.reader(io.StringIO(line))) for line in used.stdout.splitlines()
                   if line.startswith("index,item,")]
        assert any(sorted(header[2:5]) == ["complaint", "product", "stars"] for header in headers), headers

        # The pages the README names.
        for path in ("/", "/jobs", "/overview", "/failures"):
            status, html = _get(f"http://127.0.0.1:{port}{path}")
            assert status == 200, path
        assert "first try" in _get(f"http://127.0.0.1:{port}/jobs")[1]

        nested = subprocess.run(["bash", "-c", tests], cwd=checkout, capture_output=True, text=True, timeout=600,
                                env=dict(env, PYTEST_ADDOPTS="-q -p no:cacheprovider tests/test_codebase.py -k settings"))
        assert nested.returncode == 0 and "1 passed" in nested.stdout, nested.stdout[-3000:] + nested.stderr[-3000:]
    finally:
        note_children()
        os.killpg(dev.pid, signal.SIGINT)  # Ctrl-C
        try:
            dev.wait(timeout=60)
        finally:
            for pid in seen | {dev.pid}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            dev.wait(timeout=10)
            log.close()


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")  # a "# comment" inside a code block is not a heading
        if line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_link_between_the_readme_and_docs_leads_somewhere():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            found = (page.parent / file).resolve() if file else page
            if not found.exists() or (anchor and found.suffix == ".md" and anchor not in _anchors(found)):
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
