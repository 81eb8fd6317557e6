"""The files in deploy/ work as copied: every ``perseus ...`` command line in them parses with the real
``perseus`` parser, every YAML file parses, the shell scripts are valid bash, the sockets the daemons
serve are the ones the jobs are pointed at, every ``PERSEUS_*`` variable they set is one Perseus
reads, and the docs name every file (and no file that is not there)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from perseus.cli import BUILTIN_COMMANDS, build_parser
from perseus.errors import PerseusError

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# Values for the variables the command lines use (what Slurm sets in a Prolog, for example).
SAMPLE_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1000", "SLURM_JOB_GPUS": "0,1,2,3", "socket":
              "/run/perseus/job-4242.sock"}
# Variables the scripts define for themselves, not read by Perseus.
SCRIPT_VARIABLES = {"PERSEUS_BIN", "PERSEUS_HOST_CACHE"}
SHELL_OPERATORS = {";", "&&", "||", "|", "&", ")", ">", ">>", "<", "2>", "2>&1", ">/dev/null"}
COMMANDS = {*BUILTIN_COMMANDS, "demo"}
SOCKET = re.compile(r"/run/perseus/[\w.${}-]*\.sock")
# Files that must hold at least one ``perseus`` command (the others start the user's own programs).
WITH_COMMANDS = {"systemd/perseus-clockd.service", "kubernetes/perseus-clockd-daemonset.yaml", "docker/compose.yaml",
                 "docker/Dockerfile.clockd", "slurm/prolog.sh", "slurm/train.sbatch"}


def deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md")


def strip_comment(line: str) -> str:
    """The line without a shell comment: a ``#`` outside quotes at the start of a word."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined and comments removed."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += strip_comment(raw[:-1]) + " "
            continue
        yield start, pending + strip_comment(raw)
        pending = ""
    if pending:
        yield start, pending


def expand(token: str, where: str) -> str:
    """Shell variables replaced from ``SAMPLE_ENV`` (``${VAR:-default}`` too); an unknown one fails."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in SAMPLE_ENV, f"{where}: no sample value for ${name} (add it to SAMPLE_ENV)"
        return SAMPLE_ENV[name]

    return re.sub(r"\$\{(\w+)(?::-[^}]*)?\}|\$(\w+)", value, token)


def commands_in_tokens(tokens: list[str], where: str) -> Iterator[list[str]]:
    """The argv after each ``perseus`` (or ``.../perseus``) followed by one of its commands."""
    for i, token in enumerate(tokens[:-1]):
        if (token == "perseus" or token.endswith("/perseus")) and tokens[i + 1] in COMMANDS:
            argv = []
            for arg in tokens[i + 1:]:
                if arg in SHELL_OPERATORS or arg.startswith((">", "2>")):
                    break
                argv.append(expand(arg, where))
            yield argv


def commands_in_shell(text: str, name: str) -> Iterator[tuple[str, list[str]]]:
    for number, line in logical_lines(text):
        try:
            tokens = shlex.split(line)
        except ValueError as exc:
            pytest.fail(f"{name}:{number}: cannot split the line as a shell would ({exc})")
        for argv in commands_in_tokens(tokens, f"{name}:{number}"):
            yield f"{name}:{number}", argv


def _walk(node: Any) -> Iterator[Any]:
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


def yaml_documents(path: Path) -> list[Any]:
    yaml = pytest.importorskip("yaml")
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def commands_in(path: Path) -> list[tuple[str, list[str]]]:
    """Every ``perseus`` command line of one file, with where it is."""
    name = path.relative_to(DEPLOY).as_posix()
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        found = []
        for node in (n for doc in yaml_documents(path) for n in _walk(doc)):
            if isinstance(node, list) and all(isinstance(x, str) for x in node):
                found += [(name, argv) for argv in commands_in_tokens(node, name)]
            elif isinstance(node, str) and "perseus" in node:
                found += list(commands_in_shell(node, name))
        return found
    if path.name.startswith("Dockerfile"):
        found = []
        for number, line in logical_lines(text):
            instruction, _, rest = line.strip().partition(" ")
            if instruction in ("CMD", "ENTRYPOINT", "RUN") and rest.lstrip().startswith("["):
                found += [(f"{name}:{number}", argv) for argv in commands_in_tokens(json.loads(rest), name)]
            elif instruction in ("CMD", "ENTRYPOINT", "RUN"):
                found += list(commands_in_shell(rest, f"{name}:{number}"))
        return found
    return list(commands_in_shell(text, name))


ALL_COMMANDS = [(where, argv) for path in deploy_files() for where, argv in commands_in(path)]


def test_the_deploy_directory_holds_the_files_the_docs_promise():
    names = {p.relative_to(DEPLOY).as_posix() for p in deploy_files()}
    assert WITH_COMMANDS <= names
    assert {"kubernetes/training-pod-clockd.yaml", "kubernetes/training-pod-cap-sys-admin.yaml",
            "docker/docker-run.sh", "slurm/epilog.sh", "slurm/task_prolog.sh"} <= names
    with_commands = {where.split(":")[0] for where, _ in ALL_COMMANDS}
    assert WITH_COMMANDS <= with_commands, f"no perseus command found in {WITH_COMMANDS - with_commands}"


@pytest.mark.parametrize("where, argv", ALL_COMMANDS, ids=[f"{w}:{a[0]}" for w, a in ALL_COMMANDS])
def test_every_perseus_command_line_parses_with_the_real_parser(where, argv, capsys):
    try:
        build_parser().parse_args(argv)
    except PerseusError as exc:
        pytest.fail(f"deploy/{where}: perseus {' '.join(argv)}: {exc}")
    except SystemExit as exc:  # --help: argparse prints and exits 0
        assert exc.code == 0, f"deploy/{where}: perseus {' '.join(argv)} exits {exc.code}"


def test_the_checker_rejects_a_flag_the_parser_does_not_have():
    ((_, argv),) = list(commands_in_shell("perseus clockd --socket /run/perseus/clockd.sock --allow-user 1000 # x",
                                          "example"))
    assert argv == ["clockd", "--socket", "/run/perseus/clockd.sock", "--allow-user", "1000"]
    with pytest.raises(PerseusError, match="unrecognized arguments: --allow-user"):
        build_parser().parse_args([*argv, "--allow-uid", "1000"])


def test_comments_and_quoted_text_are_not_commands():
    text = "# perseus clockd on every node\necho \"perseus clockd did not start\" # the daemon's log\n"
    assert list(commands_in_shell(text, "example")) == []
    (( _, argv),) = list(commands_in_shell("systemd-run --unit u \\\n  perseus doctor --quick || exit 0\n", "x"))
    assert argv == ["doctor", "--quick"]


@pytest.mark.parametrize("path", [p for p in deploy_files() if p.suffix in (".yaml", ".yml")],
                         ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_yaml_file_parses(path):
    assert yaml_documents(path), f"{path} holds no YAML document"


def test_the_pods_mount_the_daemons_socket_directory_from_the_node():
    docs = [d for p in (DEPLOY / "kubernetes").glob("*.yaml") for d in yaml_documents(p)]
    pods = [d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Pod", "DaemonSet")]
    mounted = 0
    for pod in pods:
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["mountPath"] == "/run/perseus":
                    assert volumes[mount["name"]]["hostPath"]["path"] == "/run/perseus"
                    mounted += 1
    assert mounted == 2, "the DaemonSet and the clockd training pod"
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    (cap_pod,) = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "train"
                  and "capabilities" in d["spec"]["containers"][0].get("securityContext", {})]
    assert "SYS_ADMIN" in cap_pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]

    (compose,) = yaml_documents(DEPLOY / "docker" / "compose.yaml")
    assert "/run/perseus:/run/perseus" in compose["services"]["clockd"]["volumes"]
    assert "/run/perseus:/run/perseus:ro" in compose["services"]["trainer"]["volumes"]


def test_jobs_are_pointed_at_sockets_a_daemon_serves():
    served = {argv[argv.index("--socket") + 1] for _, argv in ALL_COMMANDS if "--socket" in argv}
    assert served == {"/run/perseus/clockd.sock", "/run/perseus/job-4242.sock"}
    for path in deploy_files():
        for socket in SOCKET.findall(path.read_text()):
            assert expand(socket, path.name) in served, f"{path}: {socket} is not a socket a daemon here serves"


def test_every_perseus_variable_set_here_is_one_perseus_reads():
    source = "\n".join(p.read_text() for package in ROOT.glob("perseus*") if package.is_dir()
                       for p in package.rglob("*.py"))
    for path in deploy_files():
        for name in set(re.findall(r"\bPERSEUS_[A-Z_]+\b", path.read_text())) - SCRIPT_VARIABLES:
            assert f'"{name}"' in source, f"{path}: Perseus does not read {name}"


def test_the_shell_scripts_are_valid_bash_and_executable():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    scripts = [p for p in deploy_files() if p.suffix in (".sh", ".sbatch")]
    assert scripts
    for path in scripts:
        done = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{path}: {done.stderr}"
        assert path.read_text().startswith("#!/usr/bin/env bash\n")
        if path.suffix == ".sh":
            assert path.stat().st_mode & 0o111, f"{path} is not executable"


def test_the_docs_name_every_deploy_file_and_only_files_that_exist():
    guide = (ROOT / "docs" / "clock-access.md").read_text()
    index = (DEPLOY / "README.md").read_text()
    for path in deploy_files():
        relative = path.relative_to(DEPLOY).as_posix()
        assert f"deploy/{relative}" in guide or relative in guide.replace("deploy/slurm/", "slurm/"), \
            f"docs/clock-access.md does not name deploy/{relative}"
        assert f"`{relative}`" in index or relative.rsplit("/", 1)[-1] in index, f"deploy/README.md misses {relative}"
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for named in re.findall(r"\bdeploy/[\w./-]*[\w/]", doc.read_text()):
            assert (ROOT / named).exists(), f"{doc.relative_to(ROOT)} names {named}, which does not exist"
