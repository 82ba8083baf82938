"""`dra-gatekeeper serve`: everything checked before listening (exit 2, one line), then a real
run over a Unix socket against the embedded API server, stopped by SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.main import build_parser, main
from gatekeeper.testing.harness import (
    GPU,
    SERVE,
    free_port,
    run_process,
    token_kubeconfig,
)

POLICIES = Path(__file__).resolve().parents[2] / "policies"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param([], "--node-name (or env NODE_NAME) is required", id="no-node"),
        pytest.param(["--node-name", "Bad_Node"], "is not a valid node name", id="bad-node"),
        pytest.param(["--node-name", "n"], "no drivers are allowed", id="no-drivers"),
        pytest.param(
            ["--node-name", "n", "--driver", GPU], "at least one listener", id="no-listener"
        ),
        pytest.param(
            ["--node-name", "n", "--driver", GPU, "--policy", "/nonexistent.yaml"],
            "/nonexistent.yaml: cannot read policy",
            id="missing-policy",
        ),
        pytest.param(
            ["--node-name", "n", "--driver", GPU, "--listen", "127.0.0.1:1"],
            "--listen needs --tls-cert-file",
            id="listen-without-tls",
        ),
        pytest.param(
            [
                "--node-name",
                "n",
                "--driver",
                GPU,
                "--socket-dir",
                "/tmp/x",
                "--audit-level",
                "Everything",
            ],
            "--audit-level",
            id="bad-audit-level",
        ),
        pytest.param(
            [
                *("--node-name", "n", "--driver", GPU, "--socket-dir", "/tmp/x"),
                "--audit-level",
                "Request",
            ],
            "--audit-level Request needs --audit-log FILE (or - for stdout): without it nothing "
            "is audited",
            id="audit-level-without-audit-log",
        ),
        pytest.param(["--bogus"], "unrecognized arguments", id="unknown-flag"),
        pytest.param(
            ["--node-name", "n", "--driver", GPU, "--socket-dir", "/tmp/x", "--node-label", "a b"],
            "must be KEY=VALUE",
            id="bad-node-label",
        ),
        pytest.param(
            ["--node-name", "n", "--driver", GPU, "--socket-dir", "/tmp/x", "--node-label", "/b=c"],
            "must be KEY=VALUE",
            id="node-label-empty-prefix",
        ),
        pytest.param(
            [
                *("--node-name", "n", "--driver", GPU, "--socket-dir", "/tmp/x"),
                *("--node-label", "a=b", "--node-label", "a=c"),
            ],
            "is given twice",
            id="repeated-node-label",
        ),
    ],
)
async def test_bad_configuration_exits_2_with_one_line(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    config = token_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443")
    code, err = await run_process(*SERVE, "--kubeconfig", config, *extra, env={"PATH": "/usr/bin"})
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


async def test_invalid_policy_and_kubeconfig_are_named(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\nkinds:\n  - group: x\n"
        "    resurce: y\n"
    )
    args = ["--node-name", "n", "--driver", GPU, "--socket-dir", str(tmp_path)]
    code, err = await run_process(
        *SERVE,
        *args,
        "--policy",
        str(policy),
        "--kubeconfig",
        token_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443"),
    )
    assert code == 2 and f"{policy}:5: kinds[0].resurce: unknown key" in err
    code, err = await run_process(
        *SERVE, *args, "--kubeconfig", token_kubeconfig(tmp_path / "kc2", None)
    )
    assert code == 2 and "server" in err and "kc2" in err


async def test_serve_runs_and_stops_on_sigterm(apiserver: APIServer, tmp_path: Path) -> None:
    sockets = Path(tmp_path / "s")
    health = free_port()
    process = await asyncio.create_subprocess_exec(
        *SERVE,
        "--node-name",
        "node-a",
        "--driver",
        GPU,
        "--socket-dir",
        str(sockets),
        "--kubeconfig",
        token_kubeconfig(tmp_path / "kc", apiserver.url),
        "--health-listen",
        f"127.0.0.1:{health}",
        "--audit-log",
        str(tmp_path / "audit.log"),
        stderr=asyncio.subprocess.PIPE,
    )
    path = sockets / GPU / "api.sock"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                try:
                    ready = await session.get(f"http://127.0.0.1:{health}/readyz")
                    if ready.status == 200:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
            assert ready.status == 200
        assert oct(path.stat().st_mode & 0o777) == "0o660"
        connector = aiohttp.UnixConnector(path=str(path))
        async with aiohttp.ClientSession(connector=connector) as session:
            response = await session.get("http://localhost/version")
            assert response.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
    assert process.returncode == 0
    assert not path.exists()
    assert (tmp_path / "audit.log").read_text().count('"auditID"') >= 1


async def test_version_and_help() -> None:
    from gatekeeper import __version__

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gatekeeper", "--version", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    assert process.returncode == 0 and out.decode() == f"dra-gatekeeper {__version__}\n"
    for args in (["--help"], ["demo", "--help"], ["policy", "rbac", "--help"], ["certs", "--help"]):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gatekeeper", *args, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await process.communicate()
        assert process.returncode == 0, args
        assert out.startswith(b"usage: dra-gatekeeper") and b"``" not in out, args


def test_serve_help_says_what_is_required_and_every_default() -> None:
    parser = build_parser()
    serve = next(
        action.choices["serve"]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    text = serve.format_help()
    description = " ".join(serve.description.split())
    assert "Required: --node-name (or env NODE_NAME) and at least one listener" in description
    assert "listeners (at least one is required):" in text
    for action in serve._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        assert action.help, flag
        assert action.metavar, flag
        if action.default not in (None, []) or "required" not in action.help:
            assert "default" in action.help, flag
        if flag.endswith(("-timeout", "-wait", "-period")):
            assert action.metavar == "SECONDS", flag


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["serve", "--nodename", "n"], "--nodename: did you mean --node-name?; --help"),
        (["audit", "check", "--polcy", "p", "log"], "--polcy: did you mean --policy?; --help"),
        (["serve", "--qqqq"], "unrecognized arguments: --qqqq (--help lists every flag)"),
    ],
)
def test_an_unknown_flag_is_answered_with_the_likely_one(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(args)
    except SystemExit as exc:  # serve's parser exits, as any argparse parser does
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


async def test_output_cut_short_by_its_reader_is_no_traceback() -> None:
    """``dra-gatekeeper test --output json policies/ | head -c 1``: the reader leaves early."""
    read, write = os.pipe()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gatekeeper",
        "test",
        "--output",
        "json",
        str(POLICIES),
        stdout=write,
        stderr=asyncio.subprocess.PIPE,
    )
    os.close(write)
    assert os.read(read, 1) == b"{"
    os.close(read)  # the reader is gone before the output is
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 141 and b"Traceback" not in err, err.decode()
