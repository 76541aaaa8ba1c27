"""The client installs alone (issue 28, item 1): ``pip install agentrt`` without an extra, in
a fresh virtualenv, gives a working client and worker, and none of the server's packages.

A real install (a wheel built from the checkout, its dependencies resolved by pip) into a
virtualenv that has only what the project declares for a client; the script then calls the
module's server, publishes the example agent, and works one run to its end with the SDK's
Worker and a model adapter of the user's own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.cli_support import ROOT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def engine() -> str:
    """What is installed is the subject, not the database: SQLite alone."""
    return "sqlite"


#: The server's and the CLI's packages: none may be installed, let alone imported (cryptography
#: is the client's too: it checks what the server signed).
SERVER_ONLY = ("sqlalchemy", "alembic", "psycopg", "jwt", "rich", "openai")

CLIENT = textwrap.dedent(
    """
    import asyncio, importlib.util, sys
    from pathlib import Path

    import agentrt_sdk
    from agentrt_sdk import AgentrtClient, Result, Worker
    from agentrt_sdk.demo.play import definition_file
    from agentrt_sdk.models import ModelResponse

    SERVER_ONLY = sys.argv[2].split(",")
    installed = [name for name in SERVER_ONLY if importlib.util.find_spec(name) is not None]
    assert not installed, f"installed with the client: {installed}"
    assert "sqlalchemy" not in sys.modules
    server_side = sorted(
        name for name in sys.modules
        if name.split(".")[0] in ("agentrt_base", "registry", "runtime_service")
    )
    assert not server_side, f"import agentrt_sdk loaded the server's modules: {server_side}"
    assert "/site-packages/agentrt_sdk/" in agentrt_sdk.__file__, agentrt_sdk.__file__
    assert (Path(agentrt_sdk.__file__).parent / "py.typed").is_file()

    class Model:  # a user's own adapter: answers at once
        async def complete(self, request):
            return ModelResponse(request.model_id, "fixed", [], 3, 2, "stop")

    async def logic(attempt):
        answer = await attempt.generate([{"role": "user", "content": "fix it"}])
        await attempt.check("tests-pass", True)
        await attempt.check("diff-produced", True)
        return Result(summary=answer.content)

    async def main(target):
        async with AgentrtClient(target) as client:
            await client.registry.publish(definition_file(), tag="prod")
            thread = await client.threads.create("installed alone")
            run = await client.runs.create(thread.id, "coding_agent:prod", "fix the login")
            worker = Worker(client, logic, model=Model(), poll_wait=1)
            await asyncio.wait_for(worker.run(max_runs=1), 120)
            final = await client.runs.get(run.id)
            return final.status, final.result_summary

    print("RESULT", *asyncio.run(main(sys.argv[1])))
    """
)


def test_the_client_installs_alone_and_works_a_run(server_address: str, tmp_path: Path) -> None:
    wheels = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    [wheel] = wheels.glob("agentrt-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600
    )
    (tmp_path / "client.py").write_text(CLIENT)
    result = subprocess.run(
        [str(python), "client.py", server_address, ",".join(SERVER_ONLY)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT 5 fixed" in result.stdout, result.stdout  # RUN_STATUS_COMPLETED
    # The command line says what to install, in one line, instead of an ImportError.
    agentrt = venv / "bin" / "agentrt"
    cli = subprocess.run([str(agentrt), "health"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 3, cli.stderr
    assert cli.stderr.strip().startswith("agentrt: the command line needs the "), cli.stderr
    assert "pip install 'agentrt[" in cli.stderr and "Traceback" not in cli.stderr
